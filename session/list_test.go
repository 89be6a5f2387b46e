package session

import (
	"errors"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/execmesh/execmesh/internal/testutil"
	"github.com/execmesh/execmesh/protocol"
)

// listIDs returns the session ids of a list result, in order.
func listIDs(t *testing.T, res protocol.Result) []string {
	t.Helper()
	entries, ok := res.Details.Sessions.Get()
	if !ok {
		t.Fatalf("sessions: %T %v", res.Details.Sessions.Value(), res.Details)
	}
	ids := make([]string, len(entries))
	for i, d := range entries {
		ids[i] = d.SessionID.Value()
	}
	return ids
}

// TestListPaging pages process list through the arguments as callers send
// them (decoded from JSON). The sessions have finished, so their entries
// and texts do not change between calls.
func TestListPaging(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	const scope = "pages"
	var started []string
	for i := range 5 {
		id := startBackground(t, m, ExecRequest{Command: "echo " + itoa(i), ScopeKey: scope})
		waitExited(t, m, id)
		started = append(started, id)
	}
	// Not listed: another scope's session and a foreground one.
	waitExited(t, m, startBackground(t, m, ExecRequest{Command: "echo other", ScopeKey: "other"}))
	mustExec(t, m, ExecRequest{Command: "echo fg", ScopeKey: scope})

	full := proc(t, m, scope, protocol.ProcessArgs{Action: "list"})
	newest := listIDs(t, full)
	want := slices.Clone(started)
	slices.Reverse(want)
	if !slices.Equal(newest, want) {
		t.Fatalf("list order %v, want newest first %v", newest, want)
	}
	// Without offset and limit: OpenClaw's result, nothing added.
	fullEntries := full.Details.Sessions.Value()
	if full.Text() != ListText(fullEntries) || len(testutil.JSONMap(t, full.Details)) != 2 || full.Status() != protocol.StatusCompleted {
		t.Fatalf("unpaged list: %q %v", full.Text(), full.Details)
	}

	tests := []struct {
		name   string
		args   string
		lo, hi int    // the page, as indexes into newest
		note   string // the last line; "" when the page is the whole list
		next   int    // nextOffset; -1 when absent
		limit  int    // details.limit; 0 when absent
		offset int
	}{
		{"first page", `{"action":"list","limit":2}`, 0, 2, "(sessions 1–2 of 5; next: offset=2)", 2, 2, 0},
		{"middle page", `{"action":"list","offset":2,"limit":2}`, 2, 4, "(sessions 3–4 of 5; next: offset=4)", 4, 2, 2},
		{"last page, short", `{"action":"list","offset":4,"limit":2}`, 4, 5, "(session 5 of 5)", -1, 2, 4},
		{"last page, exact", `{"action":"list","offset":3,"limit":2}`, 3, 5, "(sessions 4–5 of 5)", -1, 2, 3},
		{"offset only", `{"action":"list","offset":1}`, 1, 5, "(sessions 2–5 of 5)", -1, 0, 1},
		{"limit covers all", `{"action":"list","limit":50}`, 0, 5, "", -1, 50, 0},
		{"offset zero only", `{"action":"list","offset":0}`, 0, 5, "", -1, 0, 0},
		{"fractional limit floors", `{"action":"list","limit":1.9}`, 0, 1, "(session 1 of 5; next: offset=1)", 1, 1, 0},
		{"at the end", `{"action":"list","offset":5,"limit":2}`, 5, 5, "(no sessions at offset 5; 5 in total)", -1, 2, 5},
		{"beyond the end", `{"action":"list","offset":200}`, 5, 5, "(no sessions at offset 200; 5 in total)", -1, 0, 200},
		{"huge bounds", `{"action":"list","offset":3,"limit":2147483647}`, 3, 5, "(sessions 4–5 of 5)", -1, math.MaxInt32, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args, err := protocol.DecodeProcessArgs([]byte(tc.args))
			if err != nil {
				t.Fatalf("decode %s: %v", tc.args, err)
			}
			res := proc(t, m, scope, args)
			if res.Status() != protocol.StatusCompleted {
				t.Fatalf("status %s: %q", res.Status(), res.Text())
			}
			ids := listIDs(t, res)
			if !slices.Equal(ids, newest[tc.lo:tc.hi]) {
				t.Errorf("page %v, want %v", ids, newest[tc.lo:tc.hi])
			}
			page := res.Details.Sessions.Value()
			var text string
			switch {
			case tc.note == "":
				text = ListText(page)
			case len(page) == 0:
				text = tc.note
			default:
				text = ListText(page) + "\n\n" + tc.note
			}
			if res.Text() != text {
				t.Errorf("text %q, want %q", res.Text(), text)
			}
			if tc.note == "" && res.Text() != full.Text() {
				t.Errorf("whole list as one page: text %q differs from the unpaged %q", res.Text(), full.Text())
			}
			wantDetails := protocol.Details{Status: protocol.Some(protocol.StatusCompleted), Sessions: protocol.Some(page), Total: protocol.Some(5), Offset: protocol.Some(tc.offset)}
			if tc.limit > 0 {
				wantDetails.Limit = protocol.Some(tc.limit)
			}
			if tc.next >= 0 {
				wantDetails.NextOffset = protocol.Some(tc.next)
			}
			if !reflect.DeepEqual(res.Details, wantDetails) {
				t.Errorf("details %v, want %v", res.Details, wantDetails)
			}
			// The page's entries are those of the full list.
			if len(page) > 0 && !reflect.DeepEqual(page, fullEntries[tc.lo:tc.hi]) {
				t.Errorf("entries differ from the full list's")
			}
		})
	}

	t.Run("empty scope", func(t *testing.T) {
		res := proc(t, m, "nobody", protocol.ProcessArgs{Action: "list", Limit: ptr(10)})
		if res.Text() != emptyListText || res.Details.Total.Value() != 0 || len(listIDs(t, res)) != 0 {
			t.Fatalf("empty scope: %q %v", res.Text(), res.Details)
		}
		res = proc(t, m, "nobody", protocol.ProcessArgs{Action: "list"})
		if res.Text() != emptyListText || len(testutil.JSONMap(t, res.Details)) != 2 {
			t.Fatalf("empty scope, unpaged: %q %v", res.Text(), res.Details)
		}
	})
}

// TestListPagingBadValues: bad offset and limit values fail like process
// log's, before anything is listed. Decoding refuses negative numbers
// and non-numbers; the session core refuses what decoding lets through
// for list only (limit 0) and what direct callers pass.
func TestListPagingBadValues(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	waitExited(t, m, startBackground(t, m, ExecRequest{Command: "echo x", ScopeKey: "bad"}))
	tests := []struct {
		name    string
		args    string // decoded; "" means direct below
		direct  protocol.ProcessArgs
		decoded string // the decoding error, or "" when decoding passes
		failed  string // the failed result's text
	}{
		{name: "negative offset", args: `{"action":"list","offset":-1}`, decoded: `process parameter "offset" must not be negative`},
		{name: "negative limit", args: `{"action":"list","limit":-5}`, decoded: `process parameter "limit" must not be negative`},
		{name: "string limit", args: `{"action":"list","limit":"ten"}`, decoded: `process parameter "limit" must be a non-negative integer`},
		{name: "boolean offset", args: `{"action":"list","offset":true}`, decoded: `process parameter "offset" must be a non-negative integer`},
		{name: "zero limit", args: `{"action":"list","limit":0}`, failed: `process parameter "limit" must be at least 1 for list`},
		{name: "zero limit with offset", args: `{"action":"list","offset":3,"limit":0}`, failed: `process parameter "limit" must be at least 1 for list`},
		{name: "direct negative offset", direct: protocol.ProcessArgs{Action: "list", Offset: ptr(-2)}, failed: `process parameter "offset" must not be negative`},
		{name: "direct negative limit", direct: protocol.ProcessArgs{Action: "list", Limit: ptr(-1)}, failed: `process parameter "limit" must be at least 1 for list`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.direct
			if tc.args != "" {
				var err error
				args, err = protocol.DecodeProcessArgs([]byte(tc.args))
				if tc.decoded != "" {
					var pe *protocol.Error
					if !errors.As(err, &pe) || pe.Type != protocol.ErrInvalidRequest || pe.Message != tc.decoded {
						t.Fatalf("decode %s: %v, want invalid_request %q", tc.args, err, tc.decoded)
					}
					return
				}
				if err != nil {
					t.Fatalf("decode %s: %v", tc.args, err)
				}
			}
			res := proc(t, m, "bad", args)
			if res.Status() != protocol.StatusFailed || res.Text() != tc.failed || res.Details.Error.Value() != tc.failed {
				t.Fatalf("got %s %q %v, want failed %q", res.Status(), res.Text(), res.Details, tc.failed)
			}
			_, err := ListPageOf(args)
			var pe *protocol.Error
			if !errors.As(err, &pe) || pe.Type != protocol.ErrInvalidRequest || pe.Message != tc.failed {
				t.Fatalf("ListPageOf: %v", err)
			}
		})
	}
}

func TestListPageBounds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		page   ListPage
		total  int
		end    int
		lo, hi int
	}{
		{ListPage{}, 7, 0, 0, 7},
		{ListPage{Paged: true, Limit: 3}, 7, 3, 0, 3},
		{ListPage{Paged: true, Offset: 5, Limit: 3}, 7, 8, 5, 7},
		{ListPage{Paged: true, Offset: 9, Limit: 3}, 7, 12, 7, 7},
		{ListPage{Paged: true, Offset: 2}, 7, 0, 2, 7},
		{ListPage{Paged: true, Offset: 2}, 0, 0, 0, 0},
		{ListPage{Paged: true, Offset: math.MaxInt, Limit: 10}, 7, math.MaxInt, 7, 7},
	}
	for _, tc := range tests {
		if end := tc.page.End(); end != tc.end {
			t.Errorf("%+v: End %d, want %d", tc.page, end, tc.end)
		}
		if lo, hi := tc.page.Bounds(tc.total); lo != tc.lo || hi != tc.hi {
			t.Errorf("%+v of %d: Bounds [%d, %d), want [%d, %d)", tc.page, tc.total, lo, hi, tc.lo, tc.hi)
		}
	}
}

// TestListUsageAge: a running session's list entry shows the usage read
// for an earlier list while it is younger than listUsageAge (a list does
// not read a file per session each time); an older one is read again in
// the background, one older than listUsageMaxAge at once. Poll reads it
// afresh.
func TestListUsageAge(t *testing.T) {
	m := newManager(t, nil)
	id := startBackground(t, m, ExecRequest{Command: "while :; do :; done"})
	usage := func() protocol.Usage {
		t.Helper()
		res := proc(t, m, "", protocol.ProcessArgs{Action: "list"})
		for _, d := range res.Details.Sessions.Value() {
			if d.SessionID.Value() == id {
				return d.Usage.Value()
			}
		}
		t.Fatalf("session %s not listed: %s", id, res.Text())
		return protocol.Usage{}
	}
	cpu := func(u protocol.Usage) int64 { return u.CPUUserMs + u.CPUSystemMs }
	time.Sleep(200 * time.Millisecond) // some CPU time to show
	first := usage()
	time.Sleep(300 * time.Millisecond)
	if again := usage(); !reflect.DeepEqual(again, first) {
		t.Fatalf("list usage re-read within %v: %+v, then %+v", listUsageAge, first, again)
	}
	polled := proc(t, m, "", protocol.ProcessArgs{Action: "poll", SessionID: id}).Details.Usage.Value()
	if cpu(polled) <= cpu(first) {
		t.Fatalf("poll usage %+v not fresher than the list's %+v", polled, first)
	}

	// Older than listUsageAge: read again after the list that found it so.
	time.Sleep(listUsageAge)
	usage()
	for deadline := time.Now().Add(3 * time.Second); ; {
		if later := usage(); cpu(later) > cpu(first) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("list usage not read again after %v", listUsageAge)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Older than listUsageMaxAge (made so): read by the list itself.
	s := m.lookup("", id)
	s.mu.Lock()
	s.listUsageAt = time.Now().Add(-listUsageMaxAge)
	s.listUsageRound = 0 // nor known exact at a later round
	s.listUsage = protocol.Usage{Scope: "stale"}
	s.mu.Unlock()
	if u := usage(); u.Scope == "stale" {
		t.Fatalf("list showed usage older than %v: %+v", listUsageMaxAge, u)
	}
}

// TestListUsageIdleRounds: a list, and the background refresh of its
// usage figures, read no session's cpu.stat when the manager group's CPU
// figures show that no session ran since the figure was read, and read
// every one again once some session did.
func TestListUsageIdleRounds(t *testing.T) {
	requireCgroups(t)
	t.Parallel()
	m := newManager(t, func(c *Config) { c.Containment = ContainmentCgroup })
	if !m.cg.cpuOnly() {
		t.Skipf("session groups have controllers %v: their figures are not CPU times alone", m.cg.controllers)
	}
	var sessions []*session
	for range 3 {
		id := startBackground(t, m, ExecRequest{Command: "sleep 600"})
		sessions = append(sessions, m.anySession(id))
	}
	expireRound := func() { // the next usageNow starts a round without waiting usageFlushEvery
		m.usage.mu.Lock()
		m.usage.last.at = m.usage.last.at.Add(-usageFlushEvery)
		m.usage.mu.Unlock()
	}
	newRound := func() usageRound {
		expireRound()
		return m.usageNow()
	}
	refresh := func() {
		t.Helper()
		newRound()
		m.refreshUsage(sessions)
		for deadline := time.Now().Add(10 * time.Second); m.usageRefresh.Load(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the usage refresh did not end")
			}
		}
	}
	const kept = "kept"
	figures := func(want string, since time.Time) {
		t.Helper()
		for _, s := range sessions {
			s.mu.Lock()
			u, at := s.listUsage, s.listUsageAt
			s.mu.Unlock()
			if u.Scope != want {
				t.Fatalf("session %s: usage scope %q, want %q (%+v)", s.id, u.Scope, want, u)
			}
			if at.Before(since) {
				t.Fatalf("session %s: figure of %v, not marked exact after %v", s.id, at, since)
			}
		}
	}
	mark := func(age time.Duration) { // what a read would replace
		for _, s := range sessions {
			s.mu.Lock()
			s.listUsage, s.listUsageAt = protocol.Usage{Scope: kept}, s.listUsageAt.Add(-age)
			s.listUsageVer++
			s.mu.Unlock()
		}
	}
	// Until the shells have started their sleep and stay idle.
	for i := 0; ; i++ {
		if r := newRound(); r.since < r.round {
			break
		}
		if i == 200 {
			t.Fatal("the sleeping sessions' group never stopped using CPU")
		}
		time.Sleep(20 * time.Millisecond)
	}
	refresh() // reads every figure: none was read before
	figures(protocol.UsageScopeTree, time.Time{})

	// Nothing ran: the refresh reads nothing, yet the figures are exact now.
	mark(0)
	before := time.Now()
	refresh()
	figures(kept, before)

	// Nor does a list that finds the figures too old to show.
	mark(listUsageMaxAge)
	before = time.Now()
	newRound()
	expireRound() // the list starts the next
	for _, d := range proc(t, m, "", protocol.ProcessArgs{Action: "list"}).Details.Sessions.Value() {
		if u := d.Usage.Value(); u.Scope != kept {
			t.Fatalf("list read the usage of %s again though no session ran: %+v", d.SessionID.Value(), u)
		}
	}
	figures(kept, before)

	// A session that runs: every figure is read again.
	busy := startBackground(t, m, ExecRequest{Command: "while :; do :; done"})
	time.Sleep(50 * time.Millisecond)
	sessions = append(sessions, m.anySession(busy))
	refresh()
	figures(protocol.UsageScopeTree, time.Time{})
}
