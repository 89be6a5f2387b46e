package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/nats-io/nats.go"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/protocol"
)

// Client limits. A tool call gets no deadline of its own: the gateway
// bounds it (the yield window is at most 120 s, a poll waits at most 30 s)
// and the MCP client cancels it. An event long poll gets its wait plus
// eventMargin.
const (
	eventMargin = 30 * time.Second
	maxAnswer   = 64 << 20
)

// HTTPInvoker is an Invoker that calls a gateway's HTTP API:
// POST /tools/invoke and GET /v1/events. It is safe for concurrent use.
type HTTPInvoker struct {
	base       string
	token      string
	sessionKey string
	hc         *http.Client
}

// NewHTTPInvoker returns an Invoker for the gateway at baseURL (such as
// http://127.0.0.1:8420), sending token as a bearer token unless it is
// empty, with every call under sessionKey (empty means agent:main:main).
// hc nil means a client of its own with no overall timeout.
func NewHTTPInvoker(baseURL, token, sessionKey string, hc *http.Client) *HTTPInvoker {
	if sessionKey == "" {
		sessionKey = gateway.DefaultSessionKey
	}
	if hc == nil {
		hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	return &HTTPInvoker{base: strings.TrimRight(baseURL, "/"), token: token, sessionKey: sessionKey, hc: hc}
}

// Invoke implements Invoker with POST /tools/invoke.
func (c *HTTPInvoker) Invoke(ctx context.Context, tool string, args json.RawMessage) (protocol.Result, error) {
	body, err := json.Marshal(gateway.InvokeRequest{Tool: tool, Args: args, SessionKey: c.sessionKey})
	if err != nil {
		// args is not valid JSON; the SDK hands us what the client sent.
		return protocol.Result{}, protocol.Errorf(protocol.ErrInvalidRequest, "%s arguments are not valid JSON: %v", tool, err)
	}
	var ans struct {
		OK     bool             `json:"ok"`
		Result *protocol.Result `json:"result"`
	}
	if err := c.do(ctx, http.MethodPost, "/tools/invoke", nil, body, &ans); err != nil {
		return protocol.Result{}, err
	}
	if !ans.OK || ans.Result == nil {
		return protocol.Result{}, fmt.Errorf("gateway answered ok=%t without a result", ans.OK)
	}
	return *ans.Result, nil
}

// Follow implements Invoker with the long poll GET /v1/events, each
// request confirming exactly the events send accepted (ack): an event the
// session could not take is read again, by this or another reader. It
// returns after one long poll that found nothing (the caller loops), or
// when send fails.
func (c *HTTPInvoker) Follow(ctx context.Context, wait time.Duration, send func(protocol.SystemEvent) error) error {
	ack := "0" // confirms nothing another reader left
	for {
		rctx, cancel := context.WithTimeout(ctx, wait+eventMargin)
		q := url.Values{"sessionKey": {c.sessionKey}, "waitMs": {strconv.FormatInt(wait.Milliseconds(), 10)}, "ack": {ack}}
		var ans struct {
			Events []protocol.SystemEvent `json:"events"`
		}
		err := c.do(rctx, http.MethodGet, "/v1/events", q, nil, &ans)
		cancel()
		if err != nil {
			return err
		}
		if len(ans.Events) == 0 {
			return nil
		}
		for _, ev := range ans.Events {
			if err := send(ev); err != nil {
				c.confirm(ctx, ack)
				return err
			}
			if !strings.HasSuffix(ev.ID, "-dropped") {
				ack = ev.ID
			}
		}
	}
}

// confirm sends the last ack of a Follow that stopped.
func (c *HTTPInvoker) confirm(ctx context.Context, ack string) {
	if ack == "0" {
		return
	}
	body, _ := json.Marshal(map[string]string{"sessionKey": c.sessionKey, "upTo": ack})
	var out map[string]any
	_ = c.do(ctx, http.MethodPost, "/v1/events/ack", nil, body, &out)
}

// do sends one request and decodes a 2xx answer into out. Other answers
// become the gateway's *protocol.Error when the body carries one.
func (c *HTTPInvoker) do(ctx context.Context, method, path string, q url.Values, body []byte, out any) error {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return fmt.Errorf("gateway request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("cannot reach the gateway at %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return fmt.Errorf("reading the gateway's answer to %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var ans struct {
			Error *protocol.Error `json:"error"`
		}
		if json.Unmarshal(data, &ans) == nil && ans.Error != nil && ans.Error.Message != "" {
			return ans.Error
		}
		return fmt.Errorf("gateway answered %s to %s %s: %s", resp.Status, method, path, snippet(data))
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decoding the gateway's answer to %s %s: %w", method, path, err)
	}
	return nil
}

// snippet shortens an unexpected answer body for an error message.
func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// gatewayInvoker calls an in-process gateway under a fixed sessionKey.
type gatewayInvoker struct {
	g          *gateway.Gateway
	sessionKey string
}

// NewGatewayInvoker returns an Invoker that calls g directly, every call
// under sessionKey (empty means agent:main:main).
func NewGatewayInvoker(g *gateway.Gateway, sessionKey string) Invoker {
	if sessionKey == "" {
		sessionKey = gateway.DefaultSessionKey
	}
	return &gatewayInvoker{g: g, sessionKey: sessionKey}
}

func (i *gatewayInvoker) Invoke(ctx context.Context, tool string, args json.RawMessage) (protocol.Result, error) {
	return i.g.Invoke(ctx, gateway.InvokeRequest{Tool: tool, Args: args, SessionKey: i.sessionKey})
}

func (i *gatewayInvoker) Follow(ctx context.Context, wait time.Duration, send func(protocol.SystemEvent) error) error {
	if wait > 0 {
		return i.g.FollowEvents(ctx, i.sessionKey, send)
	}
	// What is queued now: each read confirms what the previous one
	// returned and send accepted, as HTTPInvoker.Follow does.
	ack := "0"
	for {
		evs, err := i.g.TakeEvents(ctx, i.sessionKey, 0, ack)
		if err != nil || len(evs) == 0 {
			return err
		}
		for _, ev := range evs {
			if err := send(ev); err != nil {
				if ack != "0" {
					_, _ = i.g.TakeEvents(context.WithoutCancel(ctx), i.sessionKey, 0, ack)
				}
				return err
			}
			if !strings.HasSuffix(ev.ID, "-dropped") {
				ack = ev.ID
			}
		}
	}
}

// Embedded is a private in-process gateway for `execmesh mcp --embedded`:
// no HTTP listener, and a NATS server of its own that listens on no port
// (its JetStream store in the state dir holds the gateway's state), so
// only host=gateway and host=sandbox commands run, and no approval can be
// answered from outside (a command that needs one waits for askFallback).
// Configure tools.exec.security and ask, or an allowlist in the state
// dir's exec-approvals.json, accordingly.
type Embedded struct {
	// Gateway is the in-process gateway.
	Gateway *gateway.Gateway
	srv     *bus.Server
	nc      *nats.Conn
	tempDir string // removed by Close; empty when the caller chose the state dir
}

// NewEmbedded starts a private gateway with cfg. An empty cfg.StateDir
// means a new temporary directory, removed by Close.
func NewEmbedded(ctx context.Context, cfg config.Config, opts gateway.Options) (*Embedded, error) {
	e := &Embedded{}
	if cfg.StateDir == "" {
		dir, err := os.MkdirTemp("", "execmesh-mcp-")
		if err != nil {
			return nil, fmt.Errorf("embedded gateway state dir: %w", err)
		}
		cfg.StateDir, e.tempDir = dir, dir
	}
	fail := func(err error) (*Embedded, error) {
		e.closeBus(context.WithoutCancel(ctx))
		if e.tempDir != "" {
			_ = os.RemoveAll(e.tempDir)
		}
		return nil, fmt.Errorf("embedded gateway: %w", err)
	}
	scfg := bus.DefaultServerConfig(cfg.StateDir)
	scfg.DontListen = true
	scfg.Logger = opts.Logger
	srv, err := bus.StartServer(ctx, scfg)
	if err != nil {
		return fail(err)
	}
	e.srv = srv
	nc, err := bus.Connect(ctx, bus.ClientConfig{Name: "execmesh-mcp-embedded", InProcess: srv}, opts.Logger)
	if err != nil {
		return fail(err)
	}
	e.nc = nc
	opts.Conn, opts.Server = nc, srv
	g, err := gateway.New(ctx, cfg, opts)
	if err != nil {
		return fail(err)
	}
	e.Gateway = g
	return e, nil
}

func (e *Embedded) closeBus(ctx context.Context) {
	if e.nc != nil {
		e.nc.Close()
	}
	if e.srv != nil {
		_ = e.srv.Shutdown(ctx)
	}
}

// Invoker returns an Invoker for sessionKey on the embedded gateway.
func (e *Embedded) Invoker(sessionKey string) Invoker {
	return NewGatewayInvoker(e.Gateway, sessionKey)
}

// Close ends every session of the embedded gateway (their process trees
// included) and removes a temporary state dir.
func (e *Embedded) Close(ctx context.Context) error {
	err := e.Gateway.Close(ctx)
	e.closeBus(ctx)
	if e.tempDir != "" {
		if rerr := os.RemoveAll(e.tempDir); rerr != nil {
			err = errors.Join(err, fmt.Errorf("removing %s: %w", e.tempDir, rerr))
		}
	}
	return err
}
