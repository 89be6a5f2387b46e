package gateway

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/execmesh/execmesh/index"
	"github.com/execmesh/execmesh/protocol"
)

// pageIDs returns the session ids and statuses of a list result decoded
// from JSON, in order.
func pageIDs(t *testing.T, res protocol.Result) (ids, statuses []string) {
	t.Helper()
	l, ok := res.Details.Sessions.Get()
	if !ok {
		t.Fatalf("sessions: %T in %v", res.Details.Sessions.Value(), res.Details)
	}
	for _, d := range l {
		ids = append(ids, d.SessionID.Value())
		statuses = append(statuses, d.Status.Value())
	}
	return ids, statuses
}

// TestListPagingAcrossNodes pages process list over gateway and node
// sessions: pages cut from the merge newest first, total counts both
// hosts, pages fit together, and a paged list (a partial node answer)
// leaves the sessions beyond the page in the gateway's index, running.
func TestListPagingAcrossNodes(t *testing.T) {
	env := startNodeGateway(t, nil, "", nil)
	a := env.pairAgent(testAgentConfig(t, env.srv, "alpha"))

	// Gateway and node sessions, alternating, oldest first.
	var started []string
	for i, host := range []string{"gateway", "node", "gateway", "node", "node", "gateway", "node"} {
		args := map[string]any{"command": fmt.Sprintf("sleep 60 # %d", i), "background": true}
		if host == "node" {
			args["host"] = "node"
		}
		res := env.invoke("exec", args, "")
		if res.Status() != protocol.StatusRunning {
			t.Fatalf("exec on %s: %s", host, res.Text())
		}
		started = append(started, res.SessionID())
		time.Sleep(5 * time.Millisecond) // distinct startedAt
	}
	newest := slices.Clone(started)
	slices.Reverse(newest)
	nodeIDs := []string{started[1], started[3], started[4], started[6]}

	full := env.invoke("process", map[string]any{"action": "list"}, "")
	if ids, _ := pageIDs(t, full); !slices.Equal(ids, newest) {
		t.Fatalf("unpaged list %v, want %v", ids, newest)
	}
	// Node sessions name the node that runs them; gateway sessions do not.
	for _, d := range full.Details.Sessions.Value() {
		id := d.SessionID.Value()
		if slices.Contains(nodeIDs, id) {
			if d.NodeID.Value() != a.ID() || d.NodeName.Value() != "alpha" {
				t.Errorf("node session %s: nodeId %v nodeName %v, want %s alpha", id, d.NodeID, d.NodeName, a.ID())
			}
		} else if !d.NodeID.IsZero() {
			t.Errorf("gateway session %s names a node: %v", id, d)
		}
	}
	if _, ok := full.Details.Total.Get(); ok || strings.Contains(full.Text(), "(sessions") {
		t.Fatalf("unpaged list has paging: %q %v", full.Text(), full.Details)
	}

	tests := []struct {
		name   string
		args   map[string]any
		lo, hi int
		note   string
		next   protocol.Opt[int]
	}{
		{"first page", map[string]any{"limit": 2}, 0, 2, "(sessions 1–2 of 7; next: offset=2)", protocol.Some(2)},
		{"gateway and node", map[string]any{"offset": 2, "limit": 3}, 2, 5, "(sessions 3–5 of 7; next: offset=5)", protocol.Some(5)},
		{"last page", map[string]any{"offset": 5, "limit": 10}, 5, 7, "(sessions 6–7 of 7)", protocol.Opt[int]{}},
		{"offset only", map[string]any{"offset": 6}, 6, 7, "(session 7 of 7)", protocol.Opt[int]{}},
		{"whole list", map[string]any{"limit": 7}, 0, 7, "", protocol.Opt[int]{}},
		{"beyond the end", map[string]any{"offset": 9, "limit": 2}, 7, 7, "(no sessions at offset 9; 7 in total)", protocol.Opt[int]{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := map[string]any{"action": "list"}
			for k, v := range tc.args {
				args[k] = v
			}
			res := env.invoke("process", args, "")
			ids, statuses := pageIDs(t, res)
			if !slices.Equal(ids, newest[tc.lo:tc.hi]) {
				t.Errorf("page %v, want %v", ids, newest[tc.lo:tc.hi])
			}
			for i, st := range statuses {
				if st != protocol.StatusRunning {
					t.Errorf("%s: status %s", ids[i], st)
				}
			}
			if res.Details.Total.Value() != 7 || res.Details.NextOffset != tc.next {
				t.Errorf("details %v", res.Details)
			}
			text := res.Text()
			switch {
			case tc.note == "":
				if strings.Contains(text, "(session") {
					t.Errorf("whole list with a page line: %q", text)
				}
			case tc.lo == tc.hi:
				if text != tc.note {
					t.Errorf("text %q, want %q", text, tc.note)
				}
			case !strings.HasSuffix(text, "\n\n"+tc.note):
				t.Errorf("text %q, want it to end with %q", text, tc.note)
			}
			if got := strings.Count(text, " running "); got != tc.hi-tc.lo {
				t.Errorf("%d lines of sessions in %q, want %d", got, text, tc.hi-tc.lo)
			}
		})
	}

	t.Run("bad values", func(t *testing.T) {
		for _, c := range []struct {
			args map[string]any
			want string
		}{
			{map[string]any{"action": "list", "limit": 0}, `process parameter "limit" must be at least 1 for list`},
			{map[string]any{"action": "list", "offset": -1}, `process parameter "offset" must not be negative`},
			{map[string]any{"action": "list", "limit": "all"}, `process parameter "limit" must be a non-negative integer`},
		} {
			status, pe := env.invokeErr("process", c.args, "")
			if status != http.StatusBadRequest || pe.Type != protocol.ErrInvalidRequest || pe.Message != c.want {
				t.Errorf("%v: %d %+v, want 400 %q", c.args, status, pe, c.want)
			}
		}
	})

	// More node sessions started together, some in the same millisecond:
	// pages of any size still fit together, each session once.
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			env.invoke("exec", map[string]any{"command": fmt.Sprintf("sleep 60 # burst %d", i), "background": true, "host": "node"}, "")
		})
	}
	wg.Wait()
	all, _ := pageIDs(t, env.invoke("process", map[string]any{"action": "list", "offset": 0}, ""))
	if len(all) != 11 {
		t.Fatalf("%d sessions listed, want 11: %v", len(all), all)
	}
	for _, size := range []int{1, 2, 3, 5} {
		var joined []string
		for off := 0; ; off += size {
			res := env.invoke("process", map[string]any{"action": "list", "offset": off, "limit": size}, "")
			ids, _ := pageIDs(t, res)
			joined = append(joined, ids...)
			if _, more := res.Details.NextOffset.Get(); !more {
				break
			}
		}
		if !slices.Equal(joined, all) {
			t.Errorf("pages of %d: %v, want %v", size, joined, all)
		}
	}

	// The node answers a page of one partially. The gateway must keep
	// every other node session indexed, and not as lost.
	res := env.invoke("process", map[string]any{"action": "list", "limit": 1}, "")
	if ids, _ := pageIDs(t, res); len(ids) != 1 || res.Details.Total.Value() != 11.0 {
		t.Fatalf("page of one: %v %v", ids, res.Details)
	}
	indexed, lost := 0, 0
	for _, rec := range env.g.index.Scope(DefaultSessionKey, func(r index.Record) bool { return r.HostID == a.ID() }) {
		indexed++
		if rec.State == index.StateLost {
			lost++
		}
	}
	if indexed != 8 || lost != 0 {
		t.Fatalf("after a paged list the index holds %d node sessions (%d lost), want 8 (0 lost)", indexed, lost)
	}
	// The oldest node session, far beyond that page, still answers.
	if p := env.invoke("process", map[string]any{"action": "poll", "sessionId": nodeIDs[0]}, ""); p.Status() != protocol.StatusRunning {
		t.Fatalf("poll of a session beyond the page: %s %v", p.Text(), p.Details)
	}
	full = env.invoke("process", map[string]any{"action": "list"}, "")
	ids, statuses := pageIDs(t, full)
	if len(ids) != 11 {
		t.Fatalf("full list after paging: %v", ids)
	}
	for i, st := range statuses {
		if st != protocol.StatusRunning {
			t.Errorf("full list after paging: %s is %s", ids[i], st)
		}
	}
	for _, id := range nodeIDs {
		if !slices.Contains(ids, id) {
			t.Errorf("full list after paging lacks node session %s", id)
		}
	}
}
