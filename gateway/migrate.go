package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-multierror"

	"github.com/execmesh/execmesh/nodes"
	"github.com/execmesh/execmesh/protocol"
)

// State dirs of gateways from before the control plane moved into
// JetStream keep the node pairing decisions in nodes.json and the queued
// system events in events.json. The first start of this version carries
// them into the registry and the event queues, then renames the files
// (*.migrated), so nothing decided or queued is lost and nothing is
// carried over twice. A file that cannot be read is left in place and
// named in the log; the gateway serves meanwhile and tries again at its
// next start.
const (
	legacyNodesFile  = "nodes.json"
	legacyEventsFile = "events.json"
)

// errUnreadable marks a file no retry will read.
var errUnreadable = errors.New("earlier state not carried over")

// migrateStateDir carries over what an earlier version left in dir.
func (g *Gateway) migrateStateDir(ctx context.Context, dir string) error {
	var errs *multierror.Error
	if err := g.migrateNodes(ctx, filepath.Join(dir, legacyNodesFile)); err != nil {
		errs = multierror.Append(errs, err)
	}
	if err := g.migrateEvents(ctx, filepath.Join(dir, legacyEventsFile)); err != nil {
		errs = multierror.Append(errs, err)
	}
	return errs.ErrorOrNil()
}

func (g *Gateway) migrateNodes(ctx context.Context, path string) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var f struct {
		Nodes []nodes.Imported `json:"nodes"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("%w: %s is not a node pairing store: %v (move it away to start without it)", errUnreadable, path, err)
	}
	imported := 0
	for _, n := range f.Nodes {
		ok, err := g.nodes.Import(ctx, n)
		if err != nil {
			return fmt.Errorf("%s: node %s: %w", path, n.ID, err)
		}
		if ok {
			imported++
		}
	}
	g.log.Info("node pairing decisions carried over from the earlier state dir", "file", path, "nodes", len(f.Nodes), "imported", imported)
	return os.Rename(path, path+".migrated")
}

func (g *Gateway) migrateEvents(ctx context.Context, path string) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var st struct {
		Queues map[string][]protocol.SystemEvent `json:"queues"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("%w: %s is not an event queue: %v (move it away to start without it)", errUnreadable, path, err)
	}
	n := 0
	for key, evs := range st.Queues {
		for i, ev := range evs {
			if ev.SessionKey == "" {
				ev.SessionKey = key
			}
			// The id makes a second attempt (a crash before the rename)
			// store nothing twice.
			if err := g.events.Push(ctx, ev, fmt.Sprintf("migrated:%s:%d:%d", protocol.EncodeSessionKeyToken(key), i, ev.TS)); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			n++
		}
	}
	g.log.Info("queued system events carried over from the earlier state dir", "file", path, "events", n)
	return os.Rename(path, path+".migrated")
}

// migrateInBackground runs migrateStateDir until it succeeds or ctx ends
// (JetStream may still be starting).
func (g *Gateway) migrateInBackground(ctx context.Context, dir string) {
	for attempt := 1; ; attempt++ {
		err := g.migrateStateDir(ctx, dir)
		if err == nil || ctx.Err() != nil {
			return
		}
		if errors.Is(err, errUnreadable) {
			g.log.Error("earlier state left in place", "err", err)
			return
		}
		g.log.Warn("earlier state not carried over yet; retrying", "attempt", attempt, "err", err)
		t := time.NewTimer(min(time.Duration(attempt)*time.Second, 30*time.Second))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
