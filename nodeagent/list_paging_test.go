package nodeagent

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/execmesh/execmesh/protocol"
)

// TestNodeListLimit: with a limit the list endpoint serializes only the
// newest entries of each sessionKey and says how many there are, and a
// partial list forgets none of the sessions it left out.
func TestNodeListLimit(t *testing.T) {
	h := newHarness(t, nil)
	const main, other = "agent:main:main", "agent:main:other"
	for range 5 {
		h.mustExec(map[string]any{"command": "sleep 60", "background": true})
	}
	raw, _ := json.Marshal(map[string]any{"command": "sleep 60", "background": true})
	if _, e := h.call(EndpointExec, ExecRequest{SessionKey: other, Args: raw, Security: "full", Ask: "off"}, nil); e != nil {
		t.Fatal(e)
	}

	list := func(r ListRequest) (ListResponse, map[string]json.RawMessage) {
		t.Helper()
		m, e := h.call(EndpointList, r, nil)
		if e != nil {
			t.Fatalf("list %+v: %v", r, e)
		}
		var lr ListResponse
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(m.Data, &lr); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(m.Data, &fields); err != nil {
			t.Fatal(err)
		}
		return lr, fields
	}
	ids := func(lr ListResponse, scope string) []string {
		var out []string
		for _, s := range lr.Sessions {
			if s.SessionKey == scope {
				id := s.Details.SessionID.Value()
				out = append(out, id)
			}
		}
		return out
	}
	full, fields := list(ListRequest{SessionKey: main})
	newest := ids(full, main)
	if len(newest) != 5 || len(full.Sessions) != 5 {
		t.Fatalf("full list: %v", newest)
	}
	// Without a limit the reply is what it always was.
	if _, ok := fields["total"]; ok || full.Partial {
		t.Fatalf("unlimited list carries paging fields: %v", fields)
	}

	tests := []struct {
		name    string
		req     ListRequest
		want    map[string][]string
		total   int
		partial bool
	}{
		{"newest two", ListRequest{SessionKey: main, Limit: 2}, map[string][]string{main: newest[:2]}, 5, true},
		{"limit one", ListRequest{SessionKey: main, Limit: 1}, map[string][]string{main: newest[:1]}, 5, true},
		{"limit is the count", ListRequest{SessionKey: main, Limit: 5}, map[string][]string{main: newest}, 5, false},
		{"limit above the count", ListRequest{SessionKey: main, Limit: 50}, map[string][]string{main: newest}, 5, false},
		{"other scope", ListRequest{SessionKey: other, Limit: 3}, map[string][]string{other: nil}, 1, false},
		{"unknown scope", ListRequest{SessionKey: "agent:main:nobody", Limit: 3}, map[string][]string{}, 0, false},
		{"all, per sessionKey", ListRequest{All: true, Limit: 2}, map[string][]string{main: newest[:2], other: nil}, 6, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lr, _ := list(tc.req)
			if lr.Total != tc.total || lr.Partial != tc.partial || lr.Instance != h.a.Instance() {
				t.Fatalf("total %d partial %v instance %q, want %d %v", lr.Total, lr.Partial, lr.Instance, tc.total, tc.partial)
			}
			n := 0
			for scope, want := range tc.want {
				got := ids(lr, scope)
				n += len(got)
				if want == nil {
					if len(got) != 1 {
						t.Errorf("%s: %v, want its one session", scope, got)
					}
					continue
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s: %v, want %v", scope, got, want)
				}
			}
			if n != len(lr.Sessions) {
				t.Errorf("%d sessions listed, %d expected", len(lr.Sessions), n)
			}
		})
	}

	// The partial lists above forgot nothing.
	h.a.mu.Lock()
	tracked := len(h.a.scopes[main])
	h.a.mu.Unlock()
	if tracked != 5 || len(ids(h.listAll(), main)) != 5 {
		t.Fatalf("after partial lists: %d sessions tracked in %s, want 5", tracked, main)
	}

	bad := []struct{ body, want string }{
		{`{"sessionKey":"k","limit":-1}`, "limit must not be negative"},
		{`{"sessionKey":"k","limit":"2"}`, `field "limit" must be`},
		{`{"sessionKey":"k","limit":1.5}`, `field "limit" must be`},
	}
	for _, b := range bad {
		m, err := h.raw(EndpointList, []byte(b.body), nil)
		if err != nil {
			t.Fatal(err)
		}
		var pe protocol.Error
		if e := m.Header.Get("Nats-Service-Error"); e == "" || json.Unmarshal(m.Data, &pe) != nil || pe.Type != protocol.ErrInvalidRequest || !strings.Contains(pe.Message, b.want) {
			t.Errorf("%s: %q %s, want invalid_request containing %q", b.body, e, m.Data, b.want)
		}
	}
}
