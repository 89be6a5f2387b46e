package approvalstore

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
)

// TestClaimsWhenLearned: the records of a gone gateway are claimed as
// soon as the store learns that their owner is gone — when the peers
// become known, and when such a record arrives later — not at the next
// round of a poll (an idle gateway polls only once a minute).
func TestClaimsWhenLearned(t *testing.T) {
	srv := bustest.StartServer(t)
	js := bustest.JetStream(t, bustest.Connect(t, srv, bus.ClientConfig{}))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := bus.EnsureStreams(ctx, js, "execmesh", 1); err != nil {
		t.Fatal(err)
	}
	far := time.Now().Add(time.Hour).UnixMilli()
	pending := func(owner, id string) {
		t.Helper()
		dead := New(Options{JS: js, Prefix: "execmesh", Owner: owner})
		if err := dead.Create(ctx, Record{Approval: Approval{ID: id, Slug: id, Command: "true", ExpiresAtMs: far}}); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := js.KeyValue(ctx, bus.StreamNamesFor("execmesh").Approvals)
	if err != nil {
		t.Fatal(err)
	}
	owner := func(id string) string {
		e, err := kv.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		var r Record
		if err := json.Unmarshal(e.Value(), &r); err != nil {
			t.Fatal(err)
		}
		return r.Owner
	}
	claimedWithin := func(id string, d time.Duration) {
		t.Helper()
		start := time.Now()
		for owner(id) != "gw-live" {
			if time.Since(start) > d {
				t.Fatalf("%s still owned by %s after %s", id, owner(id), d)
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("%s claimed after %s", id, time.Since(start).Round(time.Millisecond))
	}

	pending("gw-dead", "a1")
	known := make(chan struct{})
	var loaded atomic.Bool
	live := New(Options{JS: js, Prefix: "execmesh", Owner: "gw-live", AliveKnown: known,
		Alive: func(id string) bool { return !loaded.Load() || id == "gw-live" }})
	go live.Run(ctx)
	defer live.Stop()
	time.Sleep(300 * time.Millisecond)
	if o := owner("a1"); o != "gw-dead" {
		t.Fatalf("a1 claimed before the peers were known: owner %s", o)
	}
	loaded.Store(true)
	close(known)
	claimedWithin("a1", 500*time.Millisecond)

	time.Sleep(700 * time.Millisecond) // off the phase of any poll
	pending("gw-dead2", "a2")
	claimedWithin("a2", 500*time.Millisecond)
}
