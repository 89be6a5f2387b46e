package gateway

import (
	"context"
	"time"

	"github.com/execmesh/execmesh/index"
)

// indexSweepEvery is how often a gateway forgets the index records of
// sessions their hosts have forgotten (index.Sweep): a pass over its
// cache, with a delete only for each record that goes, so that under a
// steady load the index holds what the hosts hold and no more.
const indexSweepEvery = 10 * time.Second

// sweepIndex runs index.Sweep every indexSweepEvery until ctx ends, with
// the retention of the gateway's own session core. Node agents keep the
// same unless their environment sets another job TTL; a record the
// sweep keeps longer than its host only answers "No session found".
func (g *Gateway) sweepIndex(ctx context.Context) {
	t := time.NewTicker(indexSweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ttl, maxFinished := g.local.Manager().Retention()
		n, err := g.index.Sweep(ctx, time.Now(), index.Retention{TTL: ttl, MaxFinished: maxFinished})
		if err != nil && ctx.Err() == nil {
			g.log.Debug("session index sweep", "removed", n, "err", err)
		} else if n > 0 {
			g.log.Debug("session index sweep", "removed", n)
		}
	}
}
