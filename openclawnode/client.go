package openclawnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/execmesh/execmesh/host"
)

// Protocol is the gateway protocol version the client speaks.
const Protocol = 4

// The node host's fixed client identity (OpenClaw's GATEWAY_CLIENT_NAMES
// and GATEWAY_CLIENT_MODES: the gateway accepts only known ids).
const (
	ClientID   = "node-host"
	ClientMode = "node"
	Role       = "node"
)

// Defaults of Config.
const (
	DefaultMaxFrameBytes    = 8 << 20
	DefaultReconnectMin     = 500 * time.Millisecond
	DefaultReconnectMax     = 30 * time.Second
	DefaultHandshakeTimeout = 15 * time.Second
	// DefaultTickInterval is the tick interval when hello-ok names none
	// (OpenClaw's client default).
	DefaultTickInterval = 30 * time.Second
	// resultTimeout bounds the delivery of one node.invoke.result or
	// node.event.
	resultTimeout = 15 * time.Second
	// maxParamsBytes bounds an invoke's paramsJSON.
	maxParamsBytes = 1 << 20
	// seenInvokes is how many invoke ids the client remembers to refuse
	// a replay.
	seenInvokes = 4096
	// signedNonces is how many challenge nonces it remembers.
	signedNonces = 1024
	// DefaultMaxInvokes bounds the invokes served at once.
	DefaultMaxInvokes = 64
)

// Commands is the command surface the node declares, in OpenClaw's order.
var Commands = []string{
	CmdMCPToolsCall,
	CmdExecApprovalsGet,
	CmdExecApprovalsSet,
	CmdSystemRun,
	CmdSystemRunPrepare,
	CmdSystemWhich,
}

// Node commands served.
const (
	CmdSystemRunPrepare = "system.run.prepare"
	CmdSystemRun        = "system.run"
	CmdSystemWhich      = "system.which"
	CmdExecApprovalsGet = "system.execApprovals.get"
	CmdExecApprovalsSet = "system.execApprovals.set"
	CmdMCPToolsCall     = "mcp.tools.call.v1"
)

// Config configures a Client. URL, StateDir and Host are required.
type Config struct {
	// URL is the gateway's WebSocket URL, ws:// or wss://.
	URL string
	// Token is the gateway token (gateway.auth.token). Empty uses the
	// device token the gateway issued before, if any.
	Token string
	// StateDir holds IdentityFile and DeviceTokenFile.
	StateDir string
	// DisplayName is the node's name in `openclaw nodes`.
	DisplayName string
	// Version is reported as client.version.
	Version string
	// Platform is client.platform (default runtime.GOOS).
	Platform string
	// PathEnv is reported as the node's PATH (pathEnv).
	PathEnv string
	// Logger receives the client's logs; nil discards them.
	Logger *slog.Logger

	// Host runs the commands: the node's host pipeline (host.Local).
	Host host.Host
	// Which finds binaries on the node's PATH (system.which).
	Which func(bins []string) map[string]string
	// ApprovalsGet and ApprovalsSet read and replace the node's
	// exec-approvals.json; the JSON is OpenClaw's {path, exists, hash,
	// file}. Nil answers UNAVAILABLE.
	ApprovalsGet func() (json.RawMessage, error)
	ApprovalsSet func(file json.RawMessage, baseHash string) (json.RawMessage, error)

	// Security and Ask are the base policy of OpenClaw's runs on this
	// node (default allowlist and on-miss); a call may only tighten them,
	// and the node's exec-approvals.json applies on top.
	Security, Ask string

	// Workdir is where OpenClaw's runs work: a run that names no
	// directory runs in it, and one that names a directory outside it is
	// refused. A confined command may write beneath its working
	// directory, so an OpenClaw gateway that chose /etc or a home
	// directory could plant what runs later outside any policy.
	Workdir string
	// ApprovalsWritable lets the OpenClaw gateway replace the node's
	// exec-approvals.json (system.execApprovals.set). Off, it may read it
	// only: the file is the node's policy for every gateway it serves.
	ApprovalsWritable bool

	// MaxFrameBytes bounds one incoming frame (default 8 MiB).
	MaxFrameBytes int64
	// ReconnectMin and ReconnectMax bound the reconnect backoff.
	ReconnectMin, ReconnectMax time.Duration
	// HandshakeTimeout bounds dialing, the challenge and hello-ok.
	HandshakeTimeout time.Duration
	// MaxInvokes bounds the invokes served at once (default 64); one
	// more is answered UNAVAILABLE, so a flooding gateway cannot make
	// the node start without bound.
	MaxInvokes int
}

// Client is an OpenClaw node host connection. Build it with New and run
// it with Run.
type Client struct {
	cfg Config
	log *slog.Logger
	id  Identity

	counter atomic.Uint64
	running atomic.Int64 // invokes being served

	mu        sync.Mutex
	cur       *conn
	nonces    map[string]struct{} // challenge nonces signed
	nonceList []string
	seen      map[string]struct{} // invoke ids received
	seenList  []string
	helloed   chan struct{} // closed at the first hello-ok
	helloOnce sync.Once
}

// New validates cfg and loads (or creates) the device identity.
func New(cfg Config) (*Client, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return nil, fmt.Errorf("openclawnode: gateway URL %q: want ws://HOST:PORT or wss://HOST:PORT", cfg.URL)
	}
	if cfg.StateDir == "" {
		return nil, errors.New("openclawnode: StateDir is required")
	}
	if cfg.Host == nil {
		return nil, errors.New("openclawnode: Host is required")
	}
	if cfg.Version == "" {
		cfg.Version = "0.0.0-dev"
	}
	if cfg.Platform == "" {
		cfg.Platform = runtime.GOOS
	}
	if cfg.Security == "" {
		cfg.Security = "allowlist"
	}
	if cfg.Ask == "" {
		cfg.Ask = "on-miss"
	}
	if cfg.MaxFrameBytes <= 0 {
		cfg.MaxFrameBytes = DefaultMaxFrameBytes
	}
	if cfg.ReconnectMin <= 0 {
		cfg.ReconnectMin = DefaultReconnectMin
	}
	if cfg.ReconnectMax < cfg.ReconnectMin {
		cfg.ReconnectMax = max(DefaultReconnectMax, cfg.ReconnectMin)
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.MaxInvokes <= 0 {
		cfg.MaxInvokes = DefaultMaxInvokes
	}
	id, err := LoadOrCreateIdentity(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	return &Client{
		cfg: cfg, id: id,
		log:     cfg.Logger.With("component", "openclaw", "deviceId", id.DeviceID),
		nonces:  map[string]struct{}{},
		seen:    map[string]struct{}{},
		helloed: make(chan struct{}),
	}, nil
}

// DeviceID is the node's id on the OpenClaw gateway.
func (c *Client) DeviceID() string { return c.id.DeviceID }

// Ready waits for the first hello-ok.
func (c *Client) Ready(ctx context.Context) error {
	select {
	case <-c.helloed:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("openclawnode: not connected: %w", ctx.Err())
	}
}

// Run connects and serves until ctx ends, reconnecting with backoff.
func (c *Client) Run(ctx context.Context) error {
	delay := c.cfg.ReconnectMin
	for {
		helloed, err := c.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if helloed {
			delay = c.cfg.ReconnectMin
		}
		wait := delay/2 + rand.N(delay/2+1)
		c.log.Warn("openclaw gateway connection ended; reconnecting", "url", c.cfg.URL, "err", err, "in", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		delay = min(delay*2, c.cfg.ReconnectMax)
	}
}

// conn is one WebSocket session with the gateway.
type conn struct {
	ws       *websocket.Conn
	ctx      context.Context // ends when the socket is done
	cancel   context.CancelCauseFunc
	last     atomic.Int64 // unix ms of the last frame read
	mu       sync.Mutex
	pending  map[string]chan Frame
	invokes  map[string]context.CancelFunc
	wg       sync.WaitGroup
	closeMsg atomic.Pointer[string]
}

// errConnLost is the cause of a connection's end when the socket went.
var errConnLost = errors.New("connection to the OpenClaw gateway lost")

// session runs one connection: dial, challenge, connect, serve. It
// reports whether hello-ok came.
func (c *Client) session(ctx context.Context) (bool, error) {
	hctx, cancel := context.WithTimeout(ctx, c.cfg.HandshakeTimeout)
	defer cancel()
	ws, _, err := websocket.Dial(hctx, c.cfg.URL, nil)
	if err != nil {
		return false, fmt.Errorf("dial: %w", err)
	}
	ws.SetReadLimit(c.cfg.MaxFrameBytes)
	cctx, ccancel := context.WithCancelCause(ctx)
	cn := &conn{ws: ws, ctx: cctx, cancel: ccancel, pending: map[string]chan Frame{}, invokes: map[string]context.CancelFunc{}}
	defer func() {
		ccancel(errConnLost)
		msg := "node host closing"
		if p := cn.closeMsg.Load(); p != nil {
			msg = *p
		}
		_ = ws.Close(websocket.StatusNormalClosure, msg)
		cn.wg.Wait()
	}()

	hello, err := c.handshake(hctx, cn)
	if err != nil {
		if strings.Contains(err.Error(), "read limited") {
			c.log.Error("openclaw gateway sent a frame above the size limit during the handshake; closing with 1009", "limit", c.cfg.MaxFrameBytes)
		}
		return false, err
	}
	c.helloOnce.Do(func() { close(c.helloed) })
	tick := DefaultTickInterval
	if hello.Policy.TickIntervalMs > 0 {
		tick = time.Duration(hello.Policy.TickIntervalMs) * time.Millisecond
	}
	c.log.Info("connected to the OpenClaw gateway as a node host", "url", c.cfg.URL, "protocol", hello.Protocol,
		"server", hello.Server.Version, "tickInterval", tick,
		"approve", "openclaw nodes approve "+c.id.DeviceID)
	c.mu.Lock()
	c.cur = cn
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.cur == cn {
			c.cur = nil
		}
		c.mu.Unlock()
	}()

	cn.last.Store(time.Now().UnixMilli())
	cn.wg.Add(2)
	go func() {
		defer cn.wg.Done()
		c.watchTicks(cn, tick)
	}()
	go func() {
		defer cn.wg.Done()
		c.publishTools(cn)
	}()
	return true, c.readLoop(cn)
}

// handshake answers the challenge and waits for hello-ok.
func (c *Client) handshake(ctx context.Context, cn *conn) (HelloOK, error) {
	var ch Challenge
	for {
		f, err := readFrame(ctx, cn.ws)
		if err != nil {
			return HelloOK{}, fmt.Errorf("waiting for connect.challenge: %w", err)
		}
		if f.Type != FrameEvent || f.Event != "connect.challenge" {
			c.log.Debug("frame before connect.challenge ignored", "type", f.Type, "event", f.Event, "method", f.Method)
			continue
		}
		if err := json.Unmarshal(f.Payload, &ch); err != nil {
			return HelloOK{}, fmt.Errorf("connect.challenge: %w", err)
		}
		break
	}
	if err := c.checkNonce(ch.Nonce); err != nil {
		c.log.Error("refusing the OpenClaw gateway's challenge", "err", err)
		msg := "challenge refused"
		cn.closeMsg.Store(&msg)
		return HelloOK{}, err
	}
	token, devToken := c.cfg.Token, ""
	if token == "" {
		t, err := loadDeviceToken(c.cfg.StateDir, c.cfg.URL, c.id.DeviceID)
		if err != nil {
			c.log.Warn("device token unusable; connecting without it", "err", err)
		}
		devToken = t
	}
	params := c.connectParams(ch, token, devToken)
	id := "connect-" + strconv.FormatUint(c.counter.Add(1), 10)
	data, err := requestFrame(id, "connect", params)
	if err != nil {
		return HelloOK{}, err
	}
	if err := cn.ws.Write(ctx, websocket.MessageText, data); err != nil {
		return HelloOK{}, fmt.Errorf("send connect: %w", err)
	}
	for {
		f, err := readFrame(ctx, cn.ws)
		if err != nil {
			return HelloOK{}, fmt.Errorf("waiting for hello-ok: %w", err)
		}
		if f.Type != FrameRes || f.ID != id {
			continue
		}
		if !*f.OK {
			c.log.Error("the OpenClaw gateway refused the node's connect", "err", f.Error.Error(), "deviceId", c.id.DeviceID)
			return HelloOK{}, fmt.Errorf("connect refused: %s", f.Error.Error())
		}
		var h HelloOK
		if err := json.Unmarshal(f.Payload, &h); err != nil {
			return HelloOK{}, fmt.Errorf("hello-ok: %w", err)
		}
		if h.Protocol != Protocol {
			return HelloOK{}, fmt.Errorf("gateway speaks protocol %d; this node speaks %d", h.Protocol, Protocol)
		}
		if h.Auth != nil && h.Auth.DeviceToken != "" && (h.Auth.Role == "" || h.Auth.Role == Role) {
			if err := saveDeviceToken(c.cfg.StateDir, deviceToken{Gateway: c.cfg.URL, DeviceID: c.id.DeviceID,
				Role: Role, Token: h.Auth.DeviceToken, Scopes: h.Auth.Scopes}); err != nil {
				c.log.Warn("device token not saved", "err", err)
			}
		}
		return h, nil
	}
}

// checkNonce refuses an empty, oversized or already signed nonce: a
// signature over a replayed nonce could be replayed in turn.
func (c *Client) checkNonce(nonce string) error {
	switch {
	case strings.TrimSpace(nonce) == "":
		return errors.New("connect.challenge without a nonce")
	case len(nonce) > maxNonceLen:
		return fmt.Errorf("connect.challenge nonce of %d bytes (at most %d)", len(nonce), maxNonceLen)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.nonces[nonce]; ok {
		return fmt.Errorf("connect.challenge replays nonce %q, which this node signed before", nonce)
	}
	c.nonces[nonce] = struct{}{}
	c.nonceList = append(c.nonceList, nonce)
	if len(c.nonceList) > signedNonces {
		delete(c.nonces, c.nonceList[0])
		c.nonceList = c.nonceList[1:]
	}
	return nil
}

// connectParams builds the signed connect request.
func (c *Client) connectParams(ch Challenge, token, deviceToken string) ConnectParams {
	p := ConnectParams{
		MinProtocol: Protocol, MaxProtocol: Protocol,
		Client: ClientInfo{ID: ClientID, DisplayName: c.cfg.DisplayName, Version: c.cfg.Version,
			Platform: c.cfg.Platform, Mode: ClientMode, InstanceID: c.id.DeviceID},
		Caps:     []string{"mcp", "system"},
		Commands: Commands,
		Role:     Role,
		Scopes:   []string{},
		PathEnv:  c.cfg.PathEnv,
	}
	sigToken := token
	switch {
	case token != "":
		p.Auth = &ConnectAuth{Token: token}
	case deviceToken != "":
		p.Auth = &ConnectAuth{DeviceToken: deviceToken}
		sigToken = deviceToken
	}
	payload := SignaturePayload(SignatureParams{
		DeviceID: c.id.DeviceID, ClientID: ClientID, ClientMode: ClientMode, Role: Role,
		Scopes: p.Scopes, SignedAtMs: ch.TS, Token: sigToken, Nonce: ch.Nonce,
		Platform: p.Client.Platform, DeviceFamily: p.Client.DeviceFamily,
	})
	p.Device = &DeviceParams{ID: c.id.DeviceID, PublicKey: c.id.PublicKeyBase64URL(),
		Signature: c.id.Sign(payload), SignedAt: ch.TS, Nonce: ch.Nonce}
	return p
}

// readFrame reads and decodes one frame.
func readFrame(ctx context.Context, ws *websocket.Conn) (Frame, error) {
	typ, data, err := ws.Read(ctx)
	if err != nil {
		return Frame{}, err
	}
	if typ != websocket.MessageText {
		return Frame{}, errors.New("binary frame from the gateway")
	}
	return DecodeFrame(data)
}

// readLoop reads frames until the socket ends.
func (c *Client) readLoop(cn *conn) error {
	for {
		typ, data, err := cn.ws.Read(cn.ctx)
		if err != nil {
			switch {
			case strings.Contains(err.Error(), "read limited"):
				c.log.Error("the OpenClaw gateway sent a frame above the size limit; closing the socket with 1009 and reconnecting", "limit", c.cfg.MaxFrameBytes)
			case context.Cause(cn.ctx) != nil && !errors.Is(context.Cause(cn.ctx), context.Canceled):
				err = context.Cause(cn.ctx)
			}
			cn.cancel(errConnLost)
			return err
		}
		cn.last.Store(time.Now().UnixMilli())
		if typ != websocket.MessageText {
			c.log.Warn("binary frame from the OpenClaw gateway ignored", "bytes", len(data))
			continue
		}
		f, err := DecodeFrame(data)
		if err != nil {
			c.log.Warn("malformed frame from the OpenClaw gateway ignored", "err", err, "bytes", len(data))
			continue
		}
		c.dispatch(cn, f)
	}
}

// dispatch handles one frame after the handshake.
func (c *Client) dispatch(cn *conn, f Frame) {
	switch f.Type {
	case FrameRes:
		cn.mu.Lock()
		ch := cn.pending[f.ID]
		delete(cn.pending, f.ID)
		cn.mu.Unlock()
		if ch == nil {
			c.log.Debug("response to no pending request ignored", "id", f.ID)
			return
		}
		ch <- f
	case FrameReq:
		c.log.Warn("the OpenClaw gateway called an unknown method on the node; answered INVALID_REQUEST", "method", f.Method, "id", f.ID)
		c.send(cn, errorResponse(f.ID, CodeInvalidRequest, "unknown method: "+f.Method))
	case FrameEvent:
		switch f.Event {
		case "tick":
		case "node.invoke.request":
			var req InvokeRequest
			if err := json.Unmarshal(f.Payload, &req); err != nil || req.ID == "" {
				c.log.Warn("malformed node.invoke.request ignored", "err", err)
				return
			}
			cn.wg.Add(1)
			if c.running.Add(1) > int64(c.cfg.MaxInvokes) {
				c.running.Add(-1)
				c.log.Warn("invoke refused: too many at once", "invokeId", req.ID, "command", req.Command, "max", c.cfg.MaxInvokes)
				go func() {
					defer cn.wg.Done()
					c.deliver(cn, InvokeResult{ID: req.ID, NodeID: c.id.DeviceID,
						Error: &ErrorShape{Code: CodeUnavailable, Message: fmt.Sprintf("node busy: %d invokes running", c.cfg.MaxInvokes)}})
				}()
				return
			}
			go func() {
				defer cn.wg.Done()
				defer c.running.Add(-1)
				c.serveInvoke(cn, req)
			}()
		case "node.invoke.cancel":
			var cancel InvokeCancel
			if err := json.Unmarshal(f.Payload, &cancel); err != nil {
				c.log.Warn("malformed node.invoke.cancel ignored", "err", err)
				return
			}
			cn.mu.Lock()
			stop := cn.invokes[cancel.InvokeID]
			cn.mu.Unlock()
			if stop != nil {
				c.log.Info("invoke cancelled by the gateway", "invokeId", cancel.InvokeID)
				stop()
			}
		case "connect.challenge":
			c.log.Warn("connect.challenge after hello-ok ignored")
		default:
			c.log.Debug("event ignored", "event", f.Event)
		}
	}
}

// send writes a frame, logging a failure.
func (c *Client) send(cn *conn, data []byte) {
	ctx, cancel := context.WithTimeout(cn.ctx, resultTimeout)
	defer cancel()
	if err := cn.ws.Write(ctx, websocket.MessageText, data); err != nil {
		c.log.Warn("frame not sent to the OpenClaw gateway", "err", err)
	}
}

// request sends a request on cn and waits for its response.
func (c *Client) request(cn *conn, method string, params any) (json.RawMessage, error) {
	id := "n-" + strconv.FormatUint(c.counter.Add(1), 10)
	data, err := requestFrame(id, method, params)
	if err != nil {
		return nil, err
	}
	ch := make(chan Frame, 1)
	cn.mu.Lock()
	cn.pending[id] = ch
	cn.mu.Unlock()
	defer func() {
		cn.mu.Lock()
		delete(cn.pending, id)
		cn.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(cn.ctx, resultTimeout)
	defer cancel()
	if err := cn.ws.Write(ctx, websocket.MessageText, data); err != nil {
		return nil, fmt.Errorf("%s: %w", method, err)
	}
	select {
	case f := <-ch:
		if !*f.OK {
			return nil, fmt.Errorf("%s: %w", method, f.Error)
		}
		return f.Payload, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: %w", method, context.Cause(ctx))
	}
}

// watchTicks closes the socket when nothing arrived for twice the tick
// interval: the gateway is gone without closing.
func (c *Client) watchTicks(cn *conn, tick time.Duration) {
	t := time.NewTicker(max(tick/2, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-cn.ctx.Done():
			return
		case <-t.C:
			gap := time.Since(time.UnixMilli(cn.last.Load()))
			if gap > 2*tick {
				c.log.Warn("no tick from the OpenClaw gateway; closing the socket", "silentFor", gap.Round(time.Millisecond), "tickInterval", tick)
				msg := "tick timeout"
				cn.closeMsg.Store(&msg)
				cn.cancel(errors.New("tick timeout"))
				return
			}
		}
	}
}
