package gateway

import (
	"context"
	"fmt"

	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/hostbus"
	"github.com/execmesh/execmesh/index"
	"github.com/execmesh/execmesh/protocol"
)

// The gateways of a deployment (package peers): each serves its own host
// over NATS (natsapi.go), so a host=gateway session started through one
// is reached through any; when one is gone its host's sessions are lost
// and its approvals taken over.

// gatewayHost returns the local host of gateway id, which holds a
// host=gateway session started through it; calls fail as soon as that
// gateway is gone.
func (g *Gateway) gatewayHost(id string) (host.Host, error) {
	if !g.peers.Alive(id) {
		return nil, protocol.Errorf(protocol.ErrUnavailable, "gateway %s, whose host holds the session, is gone", id)
	}
	no := nodeOptionsFromEnv(g.opts.Getenv, g.log)
	return &hostbus.Remote{
		Conn:          g.nc,
		Group:         GatewayHostGroup(g.prefix, id),
		Label:         "gateway " + id,
		Log:           g.log,
		Watch:         func(ctx context.Context) (context.Context, context.CancelFunc) { return g.peers.Watch(ctx, id) },
		RequestMargin: no.RequestMargin,
		CallTimeout:   no.CallTimeout,
		ServerWatch:   g.serverWatch,
		Requests:      g.requests,
	}, nil
}

// onPeerGone handles a gateway that stopped heart-beating: the sessions
// of its host are lost (it ends them when it starts again), its session
// id reservations deleted, and its approvals taken over.
func (g *Gateway) onPeerGone(ctx context.Context, id string) {
	reason := fmt.Sprintf("gateway %s, whose host ran it, is gone", id)
	for _, sid := range g.index.OfHost(index.HostGateway, id) {
		rec, ok := g.index.Lookup(ctx, sid)
		if !ok || rec.State != index.StateRunning {
			continue
		}
		g.sessionLost(ctx, sid, rec.SessionKey, rec.StartedAt, reason, index.HostGateway, id)
	}
	// The ids it held for calls to come: none became a session.
	g.index.DropReservations(ctx, id, "")
	g.appr.ClaimOrphans(ctx)
}
