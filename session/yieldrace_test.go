package session

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// TestYieldRaceLeavesNoRecord: callers run short commands with the
// smallest yield window, so that many end right as their window passes,
// against a Manager configured as the gateway's (state dir, ConfirmExits,
// an exit hook that confirms each event). Once every call answered, every
// session ended and the retained ones were swept, no record file holds a
// record and the Manager keeps no per-session state, whichever way each
// session ended. The ids come from the Manager, or from a pool the
// caller hands back an id to once its foreground call answered (as the
// gateway's reservation pool does), or are one id used call after call:
// a session under a reused id must not end the record hold of the
// session that had it before.
//
// Not parallel with the package's other tests: its 20 callers load the
// machine for a minute, which tests that need sessions to overlap in
// time (TestForegroundRecordsKeepTheirFile) cannot stand.
func TestYieldRaceLeavesNoRecord(t *testing.T) {
	short := testing.Short()
	for _, tc := range []struct {
		name           string
		callers, calls int
		ids            string // "manager", "pool" or "same"
	}{
		{"manager ids", 20, 20, "manager"},
		{"pooled ids", 20, 20, "pool"},
		{"one id, sequential", 1, 80, "same"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if short {
				tc.calls = max(tc.calls/4, 5)
			}
			forEachContainment(t, func(t *testing.T, mode string) {
				yieldRace(t, mode, tc.callers, tc.calls, tc.ids)
			})
		})
	}
}

// idPool hands out session ids first in, first out, as the gateway's
// reservation pool does.
type idPool struct {
	mu   sync.Mutex
	free []string
	next int
}

func (p *idPool) take() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) > 0 {
		id := p.free[0]
		p.free = p.free[1:]
		return id
	}
	p.next++
	return fmt.Sprintf("pooled-%d", p.next)
}

func (p *idPool) give(id string) {
	p.mu.Lock()
	p.free = append(p.free, id)
	p.mu.Unlock()
}

func yieldRace(t *testing.T, mode string, callers, calls int, ids string) {
	dir := t.TempDir()
	var m *Manager
	m = newManager(t, func(c *Config) {
		c.Containment = mode
		c.StateDir = dir
		c.ConfirmExits = true
		c.MaxFinished = callers * calls // the sweep below drops them, not eviction
	})
	var mu sync.Mutex
	var events, running int
	hook := func(ev protocol.ExitEvent) {
		mu.Lock()
		events++
		mu.Unlock()
		m.ExitStored(ev.SessionID)
	}
	yield := float64(minYieldMs)
	var pool idPool
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for c := range callers {
		wg.Go(func() {
			for i := range calls {
				// Alternate a command that ends at once with one that
				// ends about when the window passes.
				cmd := "echo hi"
				if i%2 == 1 {
					cmd = "sleep 0.01"
				}
				req := ExecRequest{Command: cmd, ScopeKey: fmt.Sprintf("agent:c%d:main", c), YieldMs: &yield, OnExitHook: hook}
				switch ids {
				case "pool":
					req.SessionID = pool.take()
				case "same":
					req.SessionID = "same-id-" + strconv.Itoa(c)
					req.Synchronous = i%4 == 3 // never backgrounded: the id is free at once
				}
				ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
				res, err := m.Exec(ctx, req)
				cancel()
				if err != nil {
					errs <- err
					return
				}
				if res.Status() == protocol.StatusRunning {
					mu.Lock()
					running++
					mu.Unlock()
					if ids == "same" {
						// The id is free once its session is dropped and
						// its exit event confirmed.
						checkFor(t, waitLimit, 5*time.Millisecond, func() error {
							m.sweep(time.Now().Add(24 * time.Hour))
							m.mu.Lock()
							defer m.mu.Unlock()
							if m.takenLocked(req.SessionID) {
								return fmt.Errorf("session %s not gone", req.SessionID)
							}
							return nil
						})
					}
				} else if ids == "pool" {
					pool.give(req.SessionID)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Every session ends; the background ones are then retained until
	// swept, which is what drops them from process.
	checkFor(t, waitLimit, 20*time.Millisecond, func() error {
		m.mu.Lock()
		defer m.mu.Unlock()
		for id, s := range m.sessions {
			s.mu.Lock()
			exited := s.exited
			s.mu.Unlock()
			if !exited {
				return fmt.Errorf("session %s still runs", id)
			}
		}
		return nil
	})
	// A session is marked exited before its exit event is sent: wait
	// for the events, each background session's one.
	checkFor(t, waitLimit, 20*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if running != events {
			return fmt.Errorf("%d calls answered running, %d exit events", running, events)
		}
		return nil
	})
	mu.Lock()
	t.Logf("%d calls, %d backgrounded by their window, %d exit events", callers*calls, running, events)
	mu.Unlock()
	m.sweep(time.Now().Add(24 * time.Hour))
	checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		var held []string
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range ents {
			b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
			if strings.TrimSpace(string(b)) != "" {
				held = append(held, e.Name()+": "+strings.TrimSpace(string(b)))
			}
		}
		m.records.mu.Lock()
		inUse, heldN, heldTrees := len(m.records.inUse), len(m.records.held), len(m.records.heldTrees)
		m.records.mu.Unlock()
		m.mu.Lock()
		sessions, leftovers, finished := len(m.sessions), len(m.leftovers), len(m.finished)
		m.mu.Unlock()
		if len(held) > 0 || inUse+heldN+heldTrees+sessions+leftovers+finished > 0 {
			if len(held) > 2 {
				held = append(held[:2], "…")
			}
			return fmt.Errorf("%d records left %q; in use %d, held %d/%d, sessions %d, leftovers %d, finished %d",
				len(held), held, inUse, heldN, heldTrees, sessions, leftovers, finished)
		}
		return nil
	})
	// Every slot is blank: at most maxFreeSlots files stay for reuse.
	if ents, _ := os.ReadDir(dir); len(ents) > maxFreeSlots {
		t.Errorf("%d slot files kept, want at most %d", len(ents), maxFreeSlots)
	}
}
