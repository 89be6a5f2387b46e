package index

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
)

const testPrefix = "execmesh"

// testIndex is one gateway's index on the shared bucket of js, with its
// cache followed and (owner != "") its reservation pool kept until the
// returned stop is called.
func testIndex(t *testing.T, js jetstream.JetStream, owner, instance string) (*Index, func()) {
	t.Helper()
	ix := New(js, testPrefix, 1, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { ix.Run(ctx) })
	if owner != "" {
		loop := ix.Reserver(owner, instance)
		wg.Go(func() { loop(ctx) })
	}
	ix.Await(ctx)
	stop := func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	return ix, stop
}

func testBucket(t *testing.T) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	srv := bustest.StartServer(t)
	js := bustest.JetStream(t, bustest.Connect(t, srv, bus.ClientConfig{Name: "index-test"}))
	kv, err := bus.OpenKeyValue(t.Context(), js, testPrefix, 1, bus.StreamNamesFor(testPrefix).Sessions)
	if err != nil {
		t.Fatal(err)
	}
	return js, kv
}

// bucketRecords reads every record of the bucket.
func bucketRecords(t *testing.T, kv jetstream.KeyValue) map[string]Record {
	t.Helper()
	out := map[string]Record{}
	keys, err := kv.ListKeys(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys.Keys() {
		e, err := kv.Get(t.Context(), k)
		if err != nil {
			continue // deleted meanwhile
		}
		var rec Record
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			t.Fatalf("record %s: %v", k, err)
		}
		out[k] = rec
	}
	return out
}

// reservationsOf counts the reservations of owner in the bucket.
func reservationsOf(t *testing.T, kv jetstream.KeyValue, owner string) int {
	n := 0
	for _, r := range bucketRecords(t, kv) {
		if r.State == StateReserved && r.HostID == owner {
			n++
		}
	}
	return n
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReservationsUniqueAcrossGateways: two gateways taking ids at once,
// more than their pools hold, never get the same one; every id is a
// reservation of its taker in the bucket, and no reader of sessions sees
// reservations.
func TestReservationsUniqueAcrossGateways(t *testing.T) {
	js, kv := testBucket(t)
	a, _ := testIndex(t, js, "gw-a", "run-a")
	b, _ := testIndex(t, js, "gw-b", "run-b")
	const per = 3 * poolFill
	var mu sync.Mutex
	taken := map[string]string{}
	var wg sync.WaitGroup
	for _, g := range []struct {
		ix    *Index
		owner string
	}{{a, "gw-a"}, {b, "gw-b"}} {
		for range 4 {
			wg.Go(func() {
				for range per / 4 {
					r, err := g.ix.Take(t.Context())
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					if other, dup := taken[r.ID]; dup {
						t.Errorf("id %s handed to %s and %s", r.ID, other, g.owner)
					}
					taken[r.ID] = g.owner
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	if len(taken) != 2*per {
		t.Fatalf("%d distinct ids, want %d", len(taken), 2*per)
	}
	recs := bucketRecords(t, kv)
	for id, owner := range taken {
		r, ok := recs[id]
		if !ok || r.State != StateReserved || r.HostID != owner {
			t.Errorf("bucket record of %s = %+v (%v), want a reservation of %s", id, r, ok, owner)
		}
		for _, ix := range []*Index{a, b} {
			if _, ok := ix.Lookup(t.Context(), id); ok {
				t.Errorf("Lookup(%s) found a reservation", id)
			}
			if _, ok := ix.Read(t.Context(), id); ok {
				t.Errorf("Read(%s) found a reservation", id)
			}
			if !ix.Reserved(t.Context(), id) {
				t.Errorf("Reserved(%s) = false", id)
			}
			if err := ix.Update(t.Context(), id, func(r *Record) bool { r.Cwd = "/x"; return true }); err != nil {
				t.Error(err)
			}
		}
	}
	for _, ix := range []*Index{a, b} {
		if ids := ix.OfHost(HostGateway, "gw-a"); len(ids) != 0 {
			t.Errorf("OfHost lists reservations: %v", ids)
		}
		if s := ix.Scope("", func(Record) bool { return true }); len(s) != 0 {
			t.Errorf("Scope lists reservations: %v", s)
		}
	}
	for id := range taken {
		if r := recs[id]; r.Cwd != "" {
			t.Errorf("Update changed reservation %s: %+v", id, r)
		}
	}
}

// TestCommitMakesASession: a committed reservation is a session's record
// in the bucket, seen by the other gateway; a released one goes back to
// the pool unwritten and is handed out again, after the others.
func TestCommitMakesASession(t *testing.T) {
	js, kv := testBucket(t)
	a, _ := testIndex(t, js, "gw-a", "run-a")
	b, _ := testIndex(t, js, "gw-b", "run-b")
	r, err := a.Take(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	rec := Record{SessionKey: "agent:main:main", Host: HostNode, HostID: "node-1", Command: "sleep 1", State: StateRunning}
	if err := a.Commit(t.Context(), r, rec); err != nil {
		t.Fatal(err)
	}
	if got := bucketRecords(t, kv)[r.ID]; got != rec {
		t.Fatalf("bucket record = %+v, want %+v", got, rec)
	}
	if got, ok := b.Lookup(t.Context(), r.ID); !ok || got != rec {
		t.Fatalf("other gateway's Lookup = %+v %v, want %+v", got, ok, rec)
	}
	if b.Reserved(t.Context(), r.ID) {
		t.Fatal("a committed id is still reserved")
	}

	waitFor(t, "a full pool", func() bool {
		a.pool.mu.Lock()
		defer a.pool.mu.Unlock()
		return len(a.pool.free) >= poolFill-1 // one was taken
	})
	back, err := a.Take(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	e0, _ := kv.Get(t.Context(), back.ID)
	a.Release(t.Context(), back)
	e1, err := kv.Get(t.Context(), back.ID)
	if err != nil || e1.Revision() != e0.Revision() {
		t.Fatalf("released reservation rewritten or gone: %v (revision %d → %v)", err, e0.Revision(), e1)
	}
	seen := map[string]bool{}
	for range poolKeep {
		n, err := a.Take(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if n.ID == back.ID {
			if len(seen) < poolFill-2 {
				t.Fatalf("released id handed out again after %d others, want the pool's others first", len(seen))
			}
			return
		}
		seen[n.ID] = true
	}
	t.Fatal("released id never handed out again")
}

// TestReservationsOfGoneGateway: the reservations of a gateway taken for
// dead are deleted by another, and its commit of one it had taken still
// makes the session (the key is created again).
func TestReservationsOfGoneGateway(t *testing.T) {
	js, kv := testBucket(t)
	a, _ := testIndex(t, js, "gw-a", "run-a")
	b, _ := testIndex(t, js, "gw-b", "run-b")
	held, err := a.Take(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to see a's full pool", func() bool {
		a.pool.mu.Lock()
		full := len(a.pool.free) >= poolFill-1 // held was taken from it
		a.pool.mu.Unlock()
		b.mu.RLock()
		defer b.mu.RUnlock()
		n := 0
		for _, e := range b.reserved {
			if e.rec.HostID == "gw-a" {
				n++
			}
		}
		return full && n == reservationsOf(t, kv, "gw-a")
	})
	b.DropReservations(t.Context(), "gw-a", "")
	if n := reservationsOf(t, kv, "gw-a"); n != 0 {
		t.Fatalf("%d reservations of the gone gateway left", n)
	}
	if n := reservationsOf(t, kv, "gw-b"); n == 0 {
		t.Fatal("the live gateway's reservations were deleted too")
	}
	rec := Record{SessionKey: "agent:main:main", Host: HostGateway, HostID: "gw-a", State: StateRunning}
	if err := a.Commit(t.Context(), held, rec); err != nil {
		t.Fatal(err)
	}
	if got, ok := b.Read(t.Context(), held.ID); !ok || got != rec {
		t.Fatalf("record after commit = %+v %v", got, ok)
	}
}

// TestReserverCleansUp: a gateway that stops deletes its pool; one that
// starts again after a crash deletes what its earlier run left, and
// keeps what it reserves now.
func TestReserverCleansUp(t *testing.T) {
	js, kv := testBucket(t)
	a, stop := testIndex(t, js, "gw-a", "run-1")
	held, err := a.Take(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "reservations", func() bool { return reservationsOf(t, kv, "gw-a") >= poolFill })
	stop()
	if n := reservationsOf(t, kv, "gw-a"); n != 1 {
		t.Fatalf("%d reservations left after a clean stop, want the 1 handed out", n)
	}
	// Given back after the stop, by a call that outlived it.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	a.Release(ctx, held)
	if n := reservationsOf(t, kv, "gw-a"); n != 0 {
		t.Fatalf("%d reservations left after the last one was given back", n)
	}

	// A crashed run: its pool left in the bucket.
	b := bytesOf(t, Record{Host: HostGateway, HostID: "gw-a", Instance: "run-2", State: StateReserved})
	for i := range 5 {
		if _, err := kv.Create(t.Context(), fmt.Sprintf("crashed-%d", i), b); err != nil {
			t.Fatal(err)
		}
	}
	testIndex(t, js, "gw-a", "run-3")
	waitFor(t, "the earlier runs' reservations gone", func() bool {
		for _, r := range bucketRecords(t, kv) {
			if r.State == StateReserved && r.Instance != "run-3" {
				return false
			}
		}
		return reservationsOf(t, kv, "gw-a") >= poolFill
	})
}

func bytesOf(t *testing.T, rec Record) []byte {
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDropOnlyWhileReserved: deleting a reservation never deletes the
// session it became.
func TestDropOnlyWhileReserved(t *testing.T) {
	js, kv := testBucket(t)
	a, _ := testIndex(t, js, "gw-a", "run-a")
	r, err := a.Take(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	rec := Record{SessionKey: "agent:main:main", Host: HostGateway, HostID: "gw-a", State: StateRunning}
	if err := a.Commit(t.Context(), r, rec); err != nil {
		t.Fatal(err)
	}
	a.Drop(t.Context(), r)
	if _, err := kv.Get(t.Context(), r.ID); errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatal("Drop deleted a committed session")
	}
}

// TestBucketCreatedAnew: the store loses the bucket and it is created
// again, its revisions starting from 1. A reservation taken before the
// loss still becomes a session the cache routes to (a cached revision of
// the lost bucket no longer hides every later write of its key: the exit
// event of such a session waited for its record for ever), and the pool
// holds no reservation of the lost bucket.
func TestBucketCreatedAnew(t *testing.T) {
	js, kv := testBucket(t)
	ix, _ := testIndex(t, js, "gw-a", "run-1")
	ctx := t.Context()
	for i := range 40 {
		if _, err := ix.Allocate(ctx, Record{SessionKey: "agent:main:main", Host: HostNode, HostID: "n1", State: StateRunning, Command: fmt.Sprint("before ", i)}); err != nil {
			t.Fatal(err)
		}
	}
	var r Reservation
	for range 100 {
		var err error
		if r, err = ix.Take(ctx); err != nil {
			t.Fatal(err)
		}
		if r.rev > 40 {
			break
		}
	}
	if r.rev <= 40 {
		t.Fatalf("no reservation above revision 40 (last %d)", r.rev)
	}
	if err := js.DeleteKeyValue(ctx, kv.Bucket()); err != nil {
		t.Fatal(err)
	}
	// The first operation after the loss fails and forgets the bucket;
	// a later one creates it anew.
	rec := Record{SessionKey: "agent:main:main", Host: HostNode, HostID: "n1", State: StateRunning, Command: "after"}
	// The stream is gone, not leaderless: the first write learns so at
	// once instead of waiting leaderlessWait for a leader.
	// (The index's own watch may notice the loss and make the new bucket
	// first; the commit then lands there at once, which is as good.)
	start := time.Now()
	if err := ix.Commit(ctx, r, rec); err != nil {
		if d := time.Since(start); d >= leaderlessWait/2 {
			t.Fatalf("commit into the deleted bucket took %v to fail (leaderlessWait %v)", d, leaderlessWait)
		}
		waitFor(t, "a commit into the new bucket", func() bool { return ix.Commit(ctx, r, rec) == nil })
	}
	got, ok := ix.Lookup(ctx, r.ID)
	if !ok || got.Command != "after" || got.State != StateRunning {
		t.Fatalf("Lookup(%s) after the bucket came back = %+v, %v; want the committed record", r.ID, got, ok)
	}
	if ix.Reserved(ctx, r.ID) {
		t.Fatalf("%s still taken for a reservation", r.ID)
	}
	// Later ones come from the new bucket.
	nkv, err := js.KeyValue(ctx, kv.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		n, err := ix.Take(ctx)
		if err != nil {
			t.Fatal(err)
		}
		e, err := nkv.Get(ctx, n.ID)
		if err != nil || e.Revision() != n.rev {
			t.Fatalf("reservation %s (revision %d) not in the new bucket: %v", n.ID, n.rev, err)
		}
	}
}

// TestWhileLeaderless: a write that found no stream leader is tried
// again (nothing was stored), other outcomes end it at once, and a
// stream that keeps answering so ends it within leaderlessWait.
func TestWhileLeaderless(t *testing.T) {
	other := errors.New("wrong last sequence")
	for _, tc := range []struct {
		name    string
		results []error // what the write returns, call by call; the last repeats
		want    error
		calls   int  // exact, 0: more than one
		gone    bool // what the stream check answers
	}{
		{"leader elected", []error{jetstream.ErrNoStreamResponse, nats.ErrNoResponders, nil}, nil, 3, false},
		{"first try", []error{nil}, nil, 1, false},
		{"other error", []error{other}, other, 1, false},
		{"leaderless then other", []error{jetstream.ErrNoStreamResponse, other}, other, 2, false},
		{"no leader for good", []error{jetstream.ErrNoStreamResponse}, jetstream.ErrNoStreamResponse, 0, false},
		{"stream gone", []error{jetstream.ErrNoStreamResponse, nil}, jetstream.ErrNoStreamResponse, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			start := time.Now()
			gone := func(context.Context) bool { return tc.gone }
			err := whileLeaderless(t.Context(), gone, func() error {
				r := tc.results[min(calls, len(tc.results)-1)]
				calls++
				return r
			})
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if tc.calls != 0 && calls != tc.calls {
				t.Fatalf("%d calls, want %d", calls, tc.calls)
			}
			if tc.calls == 0 && (calls < 2 || time.Since(start) > leaderlessWait+time.Second) {
				t.Fatalf("%d calls in %s", calls, time.Since(start))
			}
		})
	}
}
