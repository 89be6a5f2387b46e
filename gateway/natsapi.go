package gateway

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/execmesh/execmesh/hostbus"
	"github.com/execmesh/execmesh/protocol"
)

// natsAPI serves the tool API as NATS requests on <prefix>.gw.invoke and
// mirrors system events onto <prefix>.gw.events.<sessionKey token>.
type natsAPI struct {
	g      *Gateway
	nc     *nats.Conn
	prefix string
	sub    *nats.Subscription
	svc    micro.Service
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

// serveNATS answers tool calls on <prefix>.gw.invoke with the same JSON
// as POST /tools/invoke (requests carry the token, when one is configured,
// in an Authorization header), and serves the gateway's local host to the
// other gateways of a deployment under <prefix>.gwhost.<id>. It stops with
// Close.
func (g *Gateway) serveNATS() error {
	nc, prefix := g.nc, g.prefix
	ctx, cancel := context.WithCancel(context.Background())
	api := &natsAPI{g: g, nc: nc, prefix: prefix, ctx: ctx, cancel: cancel}
	sub, err := nc.Subscribe(InvokeSubject(prefix), api.handle)
	if err != nil {
		cancel()
		return fmt.Errorf("subscribe %s: %w", InvokeSubject(prefix), err)
	}
	// Tool calls can be large and bursty; do not drop them as a slow consumer.
	_ = sub.SetPendingLimits(-1, -1)
	api.sub = sub
	g.nats = api
	g.localSv = hostbus.NewServer(hostbus.ServerConfig{Logger: g.log, Host: g.local, Name: "gateway " + g.id, Instance: g.local.Instance()})
	svc, err := micro.AddService(nc, micro.Config{
		Name: "execmesh-gateway", Version: "0.0.0", Description: "execmesh gateway host",
		Metadata: map[string]string{"gatewayId": g.id},
		// One gateway per id: plain subscriptions reach its live
		// connection even while the server still holds a dead one (see
		// nodeagent's addService).
		QueueGroupDisabled: true,
	})
	if err != nil {
		api.stop()
		return fmt.Errorf("gateway host service: %w", err)
	}
	api.svc = svc
	if err := g.localSv.AddTo(nc, svc.AddGroup(GatewayHostGroup(prefix, g.id))); err != nil {
		api.stop()
		return err
	}
	// Serving starts when the server knows the subscriptions, not when
	// they are merely queued: a request right after New must not meet
	// "no responders".
	if err := nc.FlushTimeout(5 * time.Second); err != nil && !nc.IsReconnecting() && nc.IsConnected() {
		api.stop()
		return fmt.Errorf("subscribe %s: %w", InvokeSubject(prefix), err)
	}
	return nil
}

// GatewayHostGroup is the subject group of a gateway's local host.
func GatewayHostGroup(prefix, gatewayID string) string { return prefix + ".gwhost." + gatewayID }

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
		if !a.g.guard.ToolCallOK(msg.Header.Get("Authorization")) {
			e := protocol.Errorf(protocol.ErrUnauthorized, "unauthorized: missing or invalid bearer token")
			resp, status = invokeResponse{Error: e}, e.Type.HTTPStatus()
		} else {
			resp, status = a.g.InvokeJSON(a.ctx, msg.Data, msg.Header.Get(IdempotencyHeader))
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
	if a.svc != nil {
		_ = a.svc.Stop()
	}
	a.cancel()
	a.wg.Wait()
}
