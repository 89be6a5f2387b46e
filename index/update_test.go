package index

import (
	"encoding/json"
	"io"
	"log/slog"
	"testing"
)

// TestUpdateFromCache: Update's first attempt writes at the cached
// revision; a cache that lags the bucket (another gateway wrote since)
// loses nothing: the write is refused and the change is made again on
// the record as the bucket has it.
func TestUpdateFromCache(t *testing.T) {
	js, kv := testBucket(t)
	ix := New(js, testPrefix, 1, slog.New(slog.NewTextHandler(io.Discard, nil)), nil) // no Run: the cache follows only ix's own writes
	ctx := t.Context()
	id, err := ix.Allocate(ctx, Record{SessionKey: "agent:main:main", Host: HostNode, HostID: "n1", State: StateRunning})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ix.Read(ctx, id); !ok {
		t.Fatal("record not readable")
	}
	finish := func(calls *int) func(*Record) bool {
		return func(r *Record) bool {
			*calls++
			if r.State == StateFinished {
				return false
			}
			r.State = StateFinished
			return true
		}
	}

	// Another writer marks it polled; ix's cache does not see that.
	e, err := kv.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var other Record
	if err := json.Unmarshal(e.Value(), &other); err != nil {
		t.Fatal(err)
	}
	other.Polled = true
	if _, err := kv.Update(ctx, id, bytesOf(t, other), e.Revision()); err != nil {
		t.Fatal(err)
	}
	var calls int
	if err := ix.Update(ctx, id, finish(&calls)); err != nil {
		t.Fatal(err)
	}
	got := bucketRecords(t, kv)[id]
	if got.State != StateFinished || !got.Polled {
		t.Fatalf("after an update from a stale cache: %+v, want finished and polled", got)
	}
	if calls != 2 {
		t.Errorf("fn called %d times, want 2 (on the cached record, then on the bucket's)", calls)
	}

	// The cache is current now: one attempt, from it.
	calls = 0
	if err := ix.Update(ctx, id, func(r *Record) bool { calls++; r.Notice = NoticeStored; return true }); err != nil {
		t.Fatal(err)
	}
	got = bucketRecords(t, kv)[id]
	if got.Notice != NoticeStored || got.State != StateFinished || !got.Polled || calls != 1 {
		t.Fatalf("after an update from a current cache: %+v (fn called %d times)", got, calls)
	}
	e, err = kv.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	ix.mu.RLock()
	cachedRev := ix.cache[id].revision
	ix.mu.RUnlock()
	if cachedRev != e.Revision() {
		t.Errorf("cache at revision %d, bucket at %d", cachedRev, e.Revision())
	}

	// No change on the cached record: the bucket's is asked.
	calls = 0
	if err := ix.Update(ctx, id, finish(&calls)); err != nil || calls != 2 {
		t.Fatalf("no-op update: %v, fn called %d times", err, calls)
	}
}
