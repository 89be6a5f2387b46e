package nodes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/hostbus"
	"github.com/execmesh/execmesh/protocol"
)

// TestPresenceProbeBeforeLive: heartbeats alone do not make a node live;
// it must also answer the registry's probe on its own subject (the
// request direction works). A node that stops beating is not live once
// its presence timer runs out, and requests tied to it (watch) end then
// with hostbus.ErrSilent.
func TestPresenceProbeBeforeLive(t *testing.T) {
	t.Parallel()
	srv := bustest.StartServer(t)
	r := startRegistry(t, srv, nil)
	for _, tc := range []struct {
		name     string
		answers  bool
		wantLive bool
	}{
		{"answers probes", true, true},
		{"heartbeats only", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNode(t, srv, strings.ReplaceAll(tc.name, " ", "-"))
			n.mute.Store(!tc.answers)
			n.startBeating()
			checkFor(t, 10*time.Second, func() error {
				if _, ok := r.Get(n.id.NodeID); !ok {
					return errors.New("not listed")
				}
				return nil
			})
			if !tc.wantLive {
				// Several probes' worth of heartbeats: still not live.
				time.Sleep(3 * probeTimeout / 2)
				if got, _ := r.Get(n.id.NodeID); got.Live {
					t.Fatalf("a node that never answered a probe is live: %+v", got)
				}
				return
			}
			waitLive(t, r, n.id.NodeID, true, 10*time.Second)
			got, _ := r.Get(n.id.NodeID)
			if got.Pairing != protocol.NodePairingPending || got.Name != n.name || got.Instance != "run-1" || got.LastSeen.IsZero() || got.Probed.IsZero() {
				t.Errorf("live node: %+v", got)
			}
			wctx, cancel := r.watch(t.Context(), n.id.NodeID, "run-1")
			defer cancel()
			n.stopBeating()
			start := time.Now()
			waitLive(t, r, n.id.NodeID, false, 10*time.Second)
			if d := time.Since(start); d < testTTL/2 {
				t.Errorf("not live %v after the last heartbeat, before its presence TTL %v", d, testTTL)
			}
			select {
			case <-wctx.Done():
				if !errors.Is(context.Cause(wctx), hostbus.ErrSilent) {
					t.Errorf("watch ended with %v, want hostbus.ErrSilent", context.Cause(wctx))
				}
			case <-time.After(5 * time.Second):
				t.Error("a request tied to the node did not end when it went silent")
			}
		})
	}
}

// TestPresenceAfterReturn: a pending node that went silent and came back
// is timed by its heartbeats again: when it stops a second time it is no
// longer live (its presence timer was not replaced by the ghost timer),
// and it is dropped after GhostTTL of silence.
func TestPresenceAfterReturn(t *testing.T) {
	t.Parallel()
	srv := bustest.StartServer(t)
	r := startRegistry(t, srv, func(o *Options) { o.GhostTTL = 2 * time.Second })
	n := newTestNode(t, srv, "returner")
	n.startBeating()
	waitLive(t, r, n.id.NodeID, true, 10*time.Second)
	n.stopBeating()
	waitLive(t, r, n.id.NodeID, false, 10*time.Second)
	n.startBeating()
	waitLive(t, r, n.id.NodeID, true, 10*time.Second)
	n.stopBeating()
	waitLive(t, r, n.id.NodeID, false, 10*time.Second)
	checkFor(t, 10*time.Second, func() error {
		if _, ok := r.Get(n.id.NodeID); ok {
			return errors.New("the silent pending node is still listed")
		}
		return nil
	})
}

// TestDecideByName: a pairing decision names the node by id or by name
// (exact, then case-insensitive); an unknown name is not found and an
// ambiguous one is refused, deciding nothing. The node is told its new
// pairing at once.
func TestDecideByName(t *testing.T) {
	t.Parallel()
	srv := bustest.StartServer(t)
	r := startRegistry(t, srv, nil)
	a := newTestNode(t, srv, "build-1")
	b := newTestNode(t, srv, "twin")
	c := newTestNode(t, srv, "twin")
	for _, n := range []*testNode{a, b, c} {
		n.startBeating()
		waitLive(t, r, n.id.NodeID, true, 10*time.Second)
	}
	for _, tc := range []struct {
		target, pairing string
		want            *testNode
		errType         protocol.ErrorType
		errText         string
	}{
		{"build-1", protocol.NodePairingPaired, a, "", ""},
		{"BUILD-1", protocol.NodePairingRejected, a, "", ""},
		{a.id.NodeID, protocol.NodePairingPaired, a, "", ""},
		{"no-such-node", protocol.NodePairingPaired, nil, protocol.ErrNotFound, `unknown node "no-such-node"`},
		{"twin", protocol.NodePairingPaired, nil, protocol.ErrInvalidRequest, "ambiguous"},
	} {
		got, err := r.Decide(t.Context(), tc.target, tc.pairing)
		if tc.want == nil {
			pe := protocol.AsError(err)
			if pe == nil || pe.Type != tc.errType || !strings.Contains(pe.Message, tc.errText) {
				t.Errorf("Decide(%q): %+v %v, want a %s error mentioning %q", tc.target, got, err, tc.errType, tc.errText)
			}
			continue
		}
		if err != nil || got.ID != tc.want.id.NodeID || got.Pairing != tc.pairing {
			t.Errorf("Decide(%q, %s): %+v %v", tc.target, tc.pairing, got, err)
			continue
		}
		if n := tc.want.lastNotice(); n != tc.pairing {
			t.Errorf("Decide(%q, %s): the node was told %q", tc.target, tc.pairing, n)
		}
	}
	for _, n := range []*testNode{b, c} {
		if got, _ := r.Get(n.id.NodeID); got.Pairing != protocol.NodePairingPending {
			t.Errorf("an ambiguous decision changed %s: %s", n.id.NodeID, got.Pairing)
		}
	}
}

// TestStoreCASBetweenRegistries: two registries (two gateways) on one
// JetStream decide the same node at the same time. Identical decisions
// are written once (a later one re-reads and finds it made, and answers
// with it, whether or not its cache has it yet); opposite ones both land,
// one after the other, and every registry and the bucket agree on the
// one in force.
func TestStoreCASBetweenRegistries(t *testing.T) {
	t.Parallel()
	srv := bustest.StartServer(t)
	r1 := startRegistry(t, srv, nil)
	r2 := startRegistry(t, srv, nil)
	kv := registryKV(t, r1)
	// decide runs the decisions at once, decisions[i] by rs[i%2].
	decide := func(id string, decisions ...string) {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, pairing := range decisions {
			r := []*Registry{r1, r2}[i%2]
			wg.Go(func() {
				<-start
				if got, err := r.decide(t.Context(), id, pairing); err != nil || got.Pairing == "" {
					t.Errorf("decision %d (%s): %+v %v", i, pairing, got, err)
				}
			})
		}
		close(start)
		wg.Wait()
	}
	for round := range 10 {
		same, _ := bus.NewIdentity()
		decide(same.NodeID, protocol.NodePairingPaired, protocol.NodePairingPaired, protocol.NodePairingPaired, protocol.NodePairingPaired)
		if hist, err := kv.History(t.Context(), same.NodeID); err != nil || len(hist) != 1 {
			t.Fatalf("round %d: four identical decisions wrote %d revisions (%v), want 1", round, len(hist), err)
		}

		opposite, _ := bus.NewIdentity()
		decide(opposite.NodeID, protocol.NodePairingRejected, protocol.NodePairingPaired)
		hist, err := kv.History(t.Context(), opposite.NodeID)
		if err != nil || len(hist) != 2 {
			t.Fatalf("round %d: two opposite decisions wrote %d revisions (%v), want 2", round, len(hist), err)
		}
		var first, last record
		if json.Unmarshal(hist[0].Value(), &first) != nil || json.Unmarshal(hist[1].Value(), &last) != nil || first.Pairing == last.Pairing {
			t.Fatalf("round %d: revisions %s then %s", round, hist[0].Value(), hist[1].Value())
		}
		for i, r := range []*Registry{r1, r2} {
			checkFor(t, 10*time.Second, func() error {
				if got, _ := r.Get(opposite.NodeID); got.Pairing != last.Pairing {
					return fmt.Errorf("registry %d shows %q, the bucket %q", i+1, got.Pairing, last.Pairing)
				}
				return nil
			})
		}
	}
}

// TestGhostDrop: a pending node that stays silent for GhostTTL is
// dropped from the list, whatever made it silent last (its heartbeats
// ran out, or a probe failed right after its last heartbeat); a paired
// node never is.
func TestGhostDrop(t *testing.T) {
	t.Parallel()
	srv := bustest.StartServer(t)
	const ghost = 500 * time.Millisecond
	r := startRegistry(t, srv, func(o *Options) { o.GhostTTL = ghost })
	for _, tc := range []struct {
		name string
		// leave makes the live node silent.
		leave  func(n *testNode)
		paired bool
		gone   bool
	}{
		{"heartbeats stop", func(n *testNode) { n.stopBeating() }, false, true},
		{"probe fails after the last heartbeat", func(n *testNode) {
			// The node's last heartbeat asks for a new probe (the last
			// answer is older than half the TTL), which finds nobody.
			n.stopBeating()
			n.deafen()
			time.Sleep(testTTL/2 + 50*time.Millisecond)
			n.beat()
		}, false, true},
		{"paired", func(n *testNode) { n.stopBeating() }, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newTestNode(t, srv, strings.ReplaceAll(tc.name, " ", "-"))
			n.startBeating()
			waitLive(t, r, n.id.NodeID, true, 10*time.Second)
			if tc.paired {
				if _, err := r.Decide(t.Context(), n.id.NodeID, protocol.NodePairingPaired); err != nil {
					t.Fatal(err)
				}
			}
			tc.leave(n)
			waitLive(t, r, n.id.NodeID, false, 10*time.Second)
			if !tc.gone {
				time.Sleep(testTTL + 2*ghost)
				if _, ok := r.Get(n.id.NodeID); !ok {
					t.Fatal("a paired node was dropped")
				}
				return
			}
			checkFor(t, 10*time.Second, func() error {
				if _, ok := r.Get(n.id.NodeID); ok {
					return errors.New("the silent pending node is still listed")
				}
				return nil
			})
		})
	}
}

// TestAwaitLive: a registry that just started waits for a known node's
// first heartbeat and its probe instead of calling it unreachable, up to
// one presence TTL after its start, and no longer once it was heard and
// is silent.
func TestAwaitLive(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	for _, tc := range []struct {
		name string
		// firstBeat is when the node's first heartbeat comes after the
		// registry started (0: none); probeDelay delays its answer.
		firstBeat, probeDelay time.Duration
		mute                  bool // answers no probe
		wantLive              bool
		minWait, maxWait      time.Duration
	}{
		{"beats soon", 200 * time.Millisecond, 0, false, true, 150 * time.Millisecond, ttl},
		{"never beats", 0, 0, false, false, ttl - 100*time.Millisecond, 3 * ttl},
		// The heartbeat comes within the TTL, its probe answer after it:
		// the probe under way is awaited.
		{"probe answered after the TTL", ttl - 300*time.Millisecond, 700 * time.Millisecond, false, true, ttl, ttl + probeTimeout},
		// Probe after probe goes unanswered: one is awaited, no more.
		{"probes unanswered", 200 * time.Millisecond, 0, true, false, ttl, ttl + probeTimeout + time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := bustest.StartServer(t)
			n := newTestNode(t, srv, "awaited")
			n.probeDelay.Store(int64(tc.probeDelay))
			n.mute.Store(tc.mute)
			r := startRegistry(t, srv, func(o *Options) { o.PresenceTTL = ttl })
			// Known before it was heard: approved by id.
			if _, err := r.Approve(t.Context(), n.id.NodeID); err != nil {
				t.Fatal(err)
			}
			if tc.firstBeat > 0 {
				time.AfterFunc(tc.firstBeat-time.Since(r.started), n.startBeating)
			}
			start := time.Now()
			got, ok := r.AwaitLive(t.Context(), n.id.NodeID)
			waited := time.Since(r.started)
			if !ok || got.Live != tc.wantLive {
				t.Fatalf("AwaitLive after %v: %+v %v, want live=%v", waited, got, ok, tc.wantLive)
			}
			if waited < tc.minWait || time.Since(start) > tc.maxWait {
				t.Errorf("AwaitLive returned %v after the registry started, want between %v and %v", waited, tc.minWait, tc.maxWait)
			}
			// Heard and silent now: no more waiting.
			if tc.wantLive {
				n.stopBeating()
				waitLive(t, r, n.id.NodeID, false, 10*time.Second)
				start := time.Now()
				if got, _ := r.AwaitLive(t.Context(), n.id.NodeID); got.Live || time.Since(start) > probeTimeout {
					t.Errorf("AwaitLive on a silent node: live=%v after %v", got.Live, time.Since(start))
				}
			}
		})
	}
	srv := bustest.StartServer(t)
	r := startRegistry(t, srv, nil)
	if got, ok := r.AwaitLive(t.Context(), "nosuchnode"); ok || got.ID != "" {
		t.Errorf("AwaitLive of an unknown node: %+v %v", got, ok)
	}
}

// TestAwaitLiveBeforeReady: a registry asked about a node before it has
// read the registry bucket (a gateway that just started) waits for the
// bucket, then for the node, instead of answering that the node is
// unknown.
func TestAwaitLiveBeforeReady(t *testing.T) {
	t.Parallel()
	srv := bustest.StartServer(t)
	first := startRegistry(t, srv, nil)
	n := newTestNode(t, srv, "known")
	n.startBeating()
	if _, err := first.Approve(t.Context(), n.id.NodeID); err != nil {
		t.Fatal(err)
	}
	waitLive(t, first, n.id.NodeID, true, 10*time.Second)
	for i := range 5 {
		nc := bustest.Connect(t, srv, bus.ClientConfig{Name: "gateway-restarted"})
		r, err := Start(Options{Conn: nc, JS: bustest.JetStream(t, nc), PresenceTTL: testTTL})
		if err != nil {
			t.Fatal(err)
		}
		got, ok := r.AwaitLive(t.Context(), n.id.NodeID)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = r.Close(ctx)
		cancel()
		if !ok || !got.Live || got.Pairing != protocol.NodePairingPaired {
			t.Fatalf("start %d: AwaitLive at once: %+v %v, want the paired node, live", i, got, ok)
		}
	}
}
