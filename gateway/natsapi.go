package gateway

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/execmesh/execmesh/protocol"
)

// natsAPI serves the tool API as NATS requests on <prefix>.gw.invoke and
// mirrors system events onto <prefix>.gw.events.<sessionKey token>.
type natsAPI struct {
	g      *Gateway
	nc     *nats.Conn
	prefix string
	sub    *nats.Subscription
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// InvokeSubject is the NATS subject of the tool API.
func InvokeSubject(prefix string) string { return prefix + ".gw.invoke" }

// EventSubject is the NATS subject system events of sessionKey go to. The
// key is base64url-encoded so that it is a single subject token.
func EventSubject(prefix, sessionKey string) string {
	return prefix + ".gw.events." + base64.RawURLEncoding.EncodeToString([]byte(sessionKey))
}

// ServeNATS answers tool calls on <prefix>.gw.invoke with the same JSON as
// POST /tools/invoke and publishes system events. Requests carry the tool
// token (or the operator token), when one is configured, in an
// Authorization header. It stops with Close.
func (g *Gateway) ServeNATS(nc *nats.Conn, prefix string) error {
	ctx, cancel := context.WithCancel(context.Background())
	api := &natsAPI{g: g, nc: nc, prefix: prefix, ctx: ctx, cancel: cancel}
	sub, err := nc.Subscribe(InvokeSubject(prefix), api.handle)
	if err != nil {
		cancel()
		return fmt.Errorf("subscribe %s: %w", InvokeSubject(prefix), err)
	}
	// Tool calls can be large and bursty; do not drop them as a slow consumer.
	_ = sub.SetPendingLimits(-1, -1)
	// Serving starts when the server knows the subscription, not when the
	// SUB is merely queued: a request right after ServeNATS must not meet
	// "no responders".
	if err := nc.FlushTimeout(5 * time.Second); err != nil && !nc.IsReconnecting() {
		cancel()
		_ = sub.Unsubscribe()
		return fmt.Errorf("subscribe %s: %w", InvokeSubject(prefix), err)
	}
	api.sub = sub
	// The node backend (nodes.go) lives as long as this API.
	if err := g.attachNodes(ctx, nc, prefix); err != nil {
		_ = sub.Unsubscribe()
		cancel()
		return err
	}
	g.natsMu.Lock()
	g.nats = api
	g.publish = func(ev protocol.SystemEvent) {
		b, err := json.Marshal(ev)
		if err == nil {
			_ = nc.Publish(EventSubject(prefix, ev.SessionKey), b)
		}
	}
	g.natsMu.Unlock()
	return nil
}

func (a *natsAPI) handle(msg *nats.Msg) {
	if msg.Reply == "" {
		return
	}
	// A call may wait for its yield window or a poll; answer from a tracked
	// goroutine so the subscription keeps delivering.
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		var resp any
		status := 200
		if !a.g.toolTokenOK(msg.Header.Get("Authorization")) {
			e := protocol.Errorf(protocol.ErrUnauthorized, "unauthorized: missing or invalid bearer token")
			resp, status = invokeResponse{Error: e}, e.Type.HTTPStatus()
		} else {
			resp, status = a.g.InvokeJSON(a.ctx, msg.Data)
		}
		b, err := json.Marshal(resp)
		if err != nil {
			return
		}
		out := nats.NewMsg(msg.Reply)
		out.Data = b
		out.Header.Set("Status", fmt.Sprint(status))
		_ = msg.RespondMsg(out)
	}()
}

// stop unsubscribes and waits for calls in flight.
func (a *natsAPI) stop() {
	_ = a.sub.Unsubscribe()
	a.cancel()
	a.wg.Wait()
}
