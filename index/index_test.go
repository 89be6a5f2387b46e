package index

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"
)

// TestScopeHostsMatchesScope: ScopeHosts groups by host exactly the
// records Scope returns (one scope, what want accepts); Records gives
// each host's back and Held counts them among ids, but neither takes in
// a record added after ScopeHosts looked, nor one removed since.
func TestScopeHostsMatchesScope(t *testing.T) {
	js, _ := testBucket(t)
	ix, _ := testIndex(t, js, "", "")
	hosts := []struct{ kind, id string }{{HostNode, "n1"}, {HostNode, "n2"}, {HostGateway, "gw-a"}, {HostGateway, "gw-b"}}
	add := func(i int, key string) string {
		h := hosts[i%len(hosts)]
		id, err := ix.Allocate(t.Context(), Record{SessionKey: key, Host: h.kind, HostID: h.id, Command: fmt.Sprint("cmd ", i), State: StateRunning})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	all := func(Record) bool { return true }
	await := func(key string, n int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for len(ix.Scope(key, all)) != n {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d records in the cache, want %d", key, len(ix.Scope(key, all)), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for i := range 40 {
		key := "agent:main:main"
		if i%5 == 0 {
			key = "agent:other:main"
		}
		add(i, key)
	}
	await("agent:main:main", 32)
	await("agent:other:main", 8)
	notGwA := func(r Record) bool { return !(r.Host == HostGateway && r.HostID == "gw-a") }
	for _, key := range []string{"agent:main:main", "agent:other:main", "nobody"} {
		scope := ix.Scope(key, notGwA)
		got := map[string]Record{}
		for _, h := range ix.ScopeHosts(key, notGwA) {
			if h.Any.Host != h.Kind || h.Any.HostID != h.HostID || h.Any.SessionKey != key {
				t.Errorf("%s: host %s/%s has a record of another: %+v", key, h.Kind, h.HostID, h.Any)
			}
			recs := ix.Records(h, nil)
			if len(recs) != h.Count || h.Count == 0 {
				t.Errorf("%s: host %s/%s: count %d, %d records", key, h.Kind, h.HostID, h.Count, len(recs))
			}
			for id, r := range recs {
				if r.Host != h.Kind || r.HostID != h.HostID {
					t.Errorf("%s: record %s of host %s/%s: %+v", key, id, h.Kind, h.HostID, r)
				}
				if _, dup := got[id]; dup {
					t.Errorf("%s: record %s under two hosts", key, id)
				}
				got[id] = r
			}
			odd := ix.Records(h, func(id string, r *Record) bool { return r.Command[len(r.Command)-1]%2 == 1 })
			for id, r := range recs {
				if _, ok := odd[id]; ok != (r.Command[len(r.Command)-1]%2 == 1) {
					t.Errorf("%s: Records with a filter: record %s (%q) in: %v", key, id, r.Command, ok)
				}
			}
			if n := ix.Held(h, maps.Keys(scope)); n != h.Count {
				t.Errorf("%s: host %s/%s holds %d of its scope's records, want %d", key, h.Kind, h.HostID, n, h.Count)
			}
		}
		if !maps.Equal(got, scope) {
			t.Errorf("%s: ScopeHosts has %d records, Scope %d:\n%v\n%v", key, len(got), len(scope), got, scope)
		}
	}

	// After ScopeHosts looked: one record more, one less.
	var h ScopeHost
	for _, x := range ix.ScopeHosts("agent:main:main", all) {
		if x.Kind == HostNode && x.HostID == "n2" {
			h = x
		}
	}
	before := ix.Records(h, nil)
	added := add(1, "agent:main:main") // n2
	await("agent:main:main", 33)
	var removed string
	for id := range before {
		removed = id
		break
	}
	ix.Remove(t.Context(), removed)
	await("agent:main:main", 32)
	now := ix.Records(h, nil)
	if _, ok := now[added]; ok || len(now) != len(before)-1 {
		t.Errorf("Records after an add and a removal: %d records (%d before), the added one in: %v", len(now), len(before), ok)
	}
	if _, ok := now[removed]; ok {
		t.Error("Records has the removed record")
	}
	ids := []string{added, removed}
	for id := range before {
		ids = append(ids, id)
	}
	if n := ix.Held(h, slices.Values(ids)); n != len(before)-1 {
		t.Errorf("Held: %d, want %d", n, len(before)-1)
	}
}
