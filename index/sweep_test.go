package index

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
)

// TestSweep: records of sessions their hosts no longer keep go (ended
// before the job TTL, or beyond a host's newest MaxFinished finished
// ones); running sessions, recent ends and other hosts' few ends stay; a
// finished record without an end time is dated, not removed. Two
// gateways sweeping the same bucket at once remove each record once,
// and what a removal leaves in the stream is a marker that expires.
func TestSweep(t *testing.T) {
	js, kv := testBucket(t)
	ix, _ := testIndex(t, js, "", "")
	other, _ := testIndex(t, js, "", "")
	ctx := t.Context()
	now := time.Now()
	ago := func(d time.Duration) int64 { return now.Add(-d).UnixMilli() }
	ret := Retention{TTL: 30 * time.Minute, MaxFinished: 3}

	recs := []struct {
		name string
		rec  Record
		kept bool
	}{
		{"running for hours", Record{Host: HostNode, HostID: "n1", State: StateRunning, StartedAt: ago(5 * time.Hour)}, true},
		{"finished 1m ago", Record{Host: HostNode, HostID: "n1", State: StateFinished, EndedAt: ago(time.Minute)}, true},
		{"finished 2m ago", Record{Host: HostNode, HostID: "n1", State: StateFinished, EndedAt: ago(2 * time.Minute)}, true},
		{"finished 3m ago", Record{Host: HostNode, HostID: "n1", State: StateFinished, EndedAt: ago(3 * time.Minute)}, true},
		{"finished 4m ago, fourth newest of n1", Record{Host: HostNode, HostID: "n1", State: StateFinished, EndedAt: ago(4 * time.Minute)}, false},
		{"finished 5m ago, fifth newest of n1", Record{Host: HostNode, HostID: "n1", State: StateFinished, EndedAt: ago(5 * time.Minute)}, false},
		{"finished before the TTL", Record{Host: HostGateway, HostID: "g1", State: StateFinished, EndedAt: ago(31 * time.Minute)}, false},
		{"finished 4m ago on g1", Record{Host: HostGateway, HostID: "g1", State: StateFinished, EndedAt: ago(4 * time.Minute)}, true},
		{"lost before the TTL", Record{Host: HostNode, HostID: "n2", State: StateLost, EndedAt: ago(40 * time.Minute)}, false},
		{"lost recently", Record{Host: HostNode, HostID: "n2", State: StateLost, EndedAt: ago(time.Minute)}, true},
		{"finished, no end time", Record{Host: HostNode, HostID: "n3", State: StateFinished}, true},
	}
	ids := make([]string, len(recs))
	for i, r := range recs {
		r.rec.SessionKey = "agent:sweep:main"
		id, err := ix.Allocate(ctx, r.rec)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	// Both caches hold every record before they sweep.
	waitFor(t, "the other gateway's cache to hold every record", func() bool {
		for _, id := range ids {
			if !other.cached(id) {
				return false
			}
		}
		return true
	})

	var wg sync.WaitGroup
	counts := make([]int, 2)
	for i, x := range []*Index{ix, other} {
		wg.Go(func() {
			n, err := x.Sweep(ctx, now, ret)
			if err != nil {
				t.Errorf("sweep: %v", err)
			}
			counts[i] = n
		})
	}
	wg.Wait()
	want := 0
	for _, r := range recs {
		if !r.kept {
			want++
		}
	}
	if got := counts[0] + counts[1]; got != want {
		t.Errorf("the two sweeps removed %d records (%v), want %d", got, counts, want)
	}
	for i, r := range recs {
		_, err := kv.Get(ctx, ids[i])
		switch {
		case r.kept && err != nil:
			t.Errorf("%s: removed (%v)", r.name, err)
		case !r.kept && !errors.Is(err, jetstream.ErrKeyNotFound):
			t.Errorf("%s: still in the bucket (err %v)", r.name, err)
		case !r.kept:
			// The removal leaves only a marker that expires.
			m, err := js.Stream(ctx, "KV_"+bus.StreamNamesFor(testPrefix).Sessions)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := m.GetLastMsgForSubject(ctx, "$KV."+bus.StreamNamesFor(testPrefix).Sessions+"."+ids[i])
			if err != nil {
				t.Fatal(err)
			}
			if ttl := raw.Header.Get(jetstream.MsgTTLHeader); ttl == "" {
				t.Errorf("%s: the removal's marker has no TTL: %v", r.name, raw.Header)
			}
		}
		if _, ok := ix.Lookup(ctx, ids[i]); ok != r.kept {
			t.Errorf("%s: in the cache %v, want %v", r.name, ok, r.kept)
		}
	}
	undated, ok := ix.Read(ctx, ids[len(ids)-1])
	if !ok || undated.EndedAt < now.UnixMilli() {
		t.Errorf("the finished record without an end time was not dated by the sweep: %+v", undated)
	}

	// A record changed after the sweep read it is left alone.
	id, err := ix.Allocate(ctx, Record{SessionKey: "agent:sweep:main", Host: HostNode, HostID: "n4", State: StateFinished, EndedAt: ago(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Update(ctx, id, func(r *Record) bool { r.Polled = true; return true }); err != nil {
		t.Fatal(err)
	}
	ix.mu.Lock()
	e := ix.cache[id]
	e.revision-- // what ix read before other's update
	ix.cache[id] = e
	ix.mu.Unlock()
	if _, err := ix.Sweep(ctx, now, ret); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, id); err != nil {
		t.Errorf("a record changed since the sweep read it was removed: %v", err)
	}
}
