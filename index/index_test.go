package index

import (
	"fmt"
	"maps"
	"testing"
	"time"
)

// TestScopeHostsMatchesScope: ScopeHosts groups by host exactly the
// records Scope returns (one scope, what want accepts), and Cached reads
// each of them as Scope does.
func TestScopeHostsMatchesScope(t *testing.T) {
	js, _ := testBucket(t)
	ix, _ := testIndex(t, js, "", "")
	hosts := []struct{ kind, id string }{{HostNode, "n1"}, {HostNode, "n2"}, {HostGateway, "gw-a"}, {HostGateway, "gw-b"}}
	want := 0
	for i := range 40 {
		h := hosts[i%len(hosts)]
		key := "agent:main:main"
		if i%5 == 0 {
			key = "agent:other:main"
		}
		if _, err := ix.Allocate(t.Context(), Record{SessionKey: key, Host: h.kind, HostID: h.id, Command: fmt.Sprint("cmd ", i), State: StateRunning}); err != nil {
			t.Fatal(err)
		}
		want++
	}
	all := func(Record) bool { return true }
	deadline := time.Now().Add(30 * time.Second)
	for len(ix.Scope("agent:main:main", all))+len(ix.Scope("agent:other:main", all)) < want {
		if time.Now().After(deadline) {
			t.Fatal("the records did not reach the cache")
		}
		time.Sleep(10 * time.Millisecond)
	}
	notGwA := func(r Record) bool { return !(r.Host == HostGateway && r.HostID == "gw-a") }
	for _, key := range []string{"agent:main:main", "agent:other:main", "nobody"} {
		scope := ix.Scope(key, notGwA)
		got := map[string]Record{}
		for _, h := range ix.ScopeHosts(key, notGwA) {
			if h.Any.Host != h.Kind || h.Any.HostID != h.HostID || h.Any.SessionKey != key {
				t.Errorf("%s: host %s/%s has a record of another: %+v", key, h.Kind, h.HostID, h.Any)
			}
			for id := range h.IDs {
				r, ok := ix.Cached(id)
				if !ok || r.Host != h.Kind || r.HostID != h.HostID {
					t.Errorf("%s: id %s under host %s/%s: cached %v %+v", key, id, h.Kind, h.HostID, ok, r)
				}
				if _, dup := got[id]; dup {
					t.Errorf("%s: id %s under two hosts", key, id)
				}
				got[id] = r
			}
		}
		if !maps.Equal(got, scope) {
			t.Errorf("%s: ScopeHosts has %d records, Scope %d:\n%v\n%v", key, len(got), len(scope), got, scope)
		}
	}
	if _, ok := ix.Cached("unknown"); ok {
		t.Error("Cached finds an unknown id")
	}
}
