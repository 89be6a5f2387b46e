package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// fltParallel runs f(0..n-1) on workers goroutines and returns the first
// error.
func fltParallel(workers, n int, f func(i int) error) error {
	next := make(chan int)
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// startMany starts n background sessions of command (%d is replaced by
// the index) under sessionKey on host, four at a time, and returns their
// ids in index order.
func (d *fltDaemon) startMany(sessionKey, host, command string, n int) []string {
	d.t.Helper()
	ids := make([]string, n)
	err := fltParallel(4, n, func(i int) error {
		cmd := strings.ReplaceAll(command, "%d", fmt.Sprint(i))
		r := d.call(sessionKey, "exec", map[string]any{"command": cmd, "background": true, "host": host})
		if r.Status != 200 || r.Result == nil || r.Result.SessionID() == "" {
			return fmt.Errorf("exec %q: %d %s", cmd, r.Status, r.Raw)
		}
		ids[i] = r.Result.SessionID()
		return nil
	})
	if err != nil {
		d.t.Fatal(err)
	}
	return ids
}

// waitEnded waits until process list shows none of ids running (list
// reads; it confirms nothing and suppresses no exit notice).
func (d *fltDaemon) waitEnded(sessionKey string, ids []string, total time.Duration) {
	d.t.Helper()
	clCheckFor(d.t, fmt.Sprintf("%d sessions ended", len(ids)), total, 200*time.Millisecond, func() error {
		r := d.call(sessionKey, "process", map[string]any{"action": "list"})
		if r.Status != 200 || r.Result == nil {
			return fmt.Errorf("list: %d %s", r.Status, r.Raw)
		}
		status := map[string]string{}
		for _, s := range r.Result.Details.Sessions.Value() {
			status[s.SessionID.Value()] = s.Status.Value()
		}
		for _, id := range ids {
			if st, ok := status[id]; !ok || st == protocol.StatusRunning {
				return fmt.Errorf("%s is %q", id, st)
			}
		}
		return nil
	})
}

// TestFaultReusedSessionIDs: session ids are readable
// slugs, and an id is handed out again once its session was removed. One
// agent runs 150 sessions, polls each to its end and removes it; another
// agent then runs 150 sessions and is told of every exit exactly once —
// also of the sessions that got an id the first agent's sessions had
// (deduplication is by sessionKey, session and run, never by id alone).
func TestFaultReusedSessionIDs(t *testing.T) {
	if testing.Short() {
		t.Skip("300 sessions")
	}
	d := newFltDaemon(t, "up", fltDaemonOpts{})
	const n = 150
	const keyA, keyB = "agent:f1a:main", "agent:f1b:main"
	// Each session is polled to its end and removed before the next
	// starts (four at a time): the session core keeps only the newest 50
	// finished sessions, and one evicted before its poll is rightly
	// announced by an event.
	first := make([]string, n)
	if err := fltParallel(4, n, func(i int) error {
		r := d.call(keyA, "exec", map[string]any{"command": fmt.Sprintf("echo f1a-%d", i), "background": true, "host": "gateway"})
		if r.Status != 200 || r.Result == nil || r.Result.SessionID() == "" {
			return fmt.Errorf("exec %d: %d %s", i, r.Status, r.Raw)
		}
		id := r.Result.SessionID()
		first[i] = id
		deadline := time.Now().Add(30 * time.Second)
		for {
			p := d.call(keyA, "process", map[string]any{"action": "poll", "sessionId": id, "timeout": 2000})
			if p.Status != 200 || p.Result == nil {
				return fmt.Errorf("poll %s: %d %s", id, p.Status, p.Raw)
			}
			if p.Result.Status() != protocol.StatusRunning {
				if p.Result.Status() != protocol.StatusCompleted {
					return fmt.Errorf("poll %s: %s %s", id, p.Result.Status(), p.Result.Text())
				}
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s still running", id)
			}
		}
		if r := d.call(keyA, "process", map[string]any{"action": "remove", "sessionId": id}); r.Status != 200 {
			return fmt.Errorf("remove %s: %d %s", id, r.Status, r.Raw)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The first agent's polls delivered every end: no notice for it.
	if evs, st, raw := d.events(keyA, 0, ""); st != 200 || len(evs) != 0 {
		t.Fatalf("events of the polling agent: %d %s", st, raw)
	}
	second := d.startMany(keyB, "gateway", "echo f1b-%d", n)
	used := map[string]bool{}
	for _, id := range first {
		used[id] = true
	}
	var reused []string
	for _, id := range second {
		if used[id] {
			reused = append(reused, id)
		}
	}
	c := d.tally(keyB, second, 60*time.Second, 2*time.Second, protocol.EventExecExit)
	t.Logf("%d of the second agent's %d session ids were the first agent's: %v", len(reused), n, reused)
	c.exact(t, "the second agent's sessions")
	for _, id := range reused {
		if len(c.ByID[id]) == 0 {
			t.Errorf("exit event of %s missing: the first agent's session had that id", id)
		}
	}
	for i, id := range second {
		if evs := c.ByID[id]; len(evs) == 1 && !strings.Contains(evs[0].Text, fmt.Sprintf("f1b-%d", i)) {
			t.Errorf("exit event of %s: %q, want f1b-%d", id, evs[0].Text, i)
		}
	}
}

// TestFaultQueueOverflowAnnounced: with
// events.maxQueued 20, 30 sessions end unread: the agent gets the 20
// exit events that fit and one events.dropped event saying that 10 did
// not, and the queue takes new events once read.
func TestFaultQueueOverflowAnnounced(t *testing.T) {
	d := newFltDaemon(t, "up", fltDaemonOpts{Config: map[string]any{"events": map[string]any{"maxQueued": 20}}})
	const key = "agent:f8:main"
	ids := d.startMany(key, "gateway", "echo f8-%d", 30)
	d.waitEnded(key, ids, 30*time.Second)
	// The gateway stores each exit as it happens; give the last ones a
	// moment after the list showed them ended.
	time.Sleep(time.Second)
	c := d.tally(key, ids, 3*time.Second, 2*time.Second, protocol.EventExecExit)
	var dropped []protocol.SystemEvent
	for _, ev := range c.All {
		if ev.Kind == "events.dropped" {
			dropped = append(dropped, ev)
		}
	}
	t.Logf("overflow: expected 30, delivered %d, duplicated %d, announced dropped %d: %+v", c.Delivered, c.Duplicated, len(dropped), dropped)
	if c.Delivered != 20 || c.Duplicated != 0 || len(dropped) != 1 || !strings.Contains(dropped[0].Text, "10 system event(s)") {
		t.Fatalf("want 20 exit events and one events.dropped event counting 10; %s; dropped %+v", c, dropped)
	}
	// Read, the queue has room again.
	id := d.background(key, "gateway", "echo f8-after")
	d.tally(key, []string{id}, 20*time.Second, time.Second, protocol.EventExecExit).exact(t, "a session after the overflow")
}

// sseEvent is one server-sent event.
type sseEvent struct {
	ID, Event string
	Data      protocol.SystemEvent
}

// sseRead connects to the event stream of sessionKey (resuming after
// lastID when set), hands each event to handle until it returns false or
// total passes, then drops the connection as a crashing client would.
func (d *fltDaemon) sseRead(sessionKey, lastID string, total time.Duration, handle func(sseEvent) bool) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), total)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", d.url+"/v1/events/stream?sessionKey="+sessionKey, nil)
	req.Header.Set("Authorization", "Bearer "+d.token)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	res, err := (&http.Client{}).Do(req)
	if err != nil {
		d.t.Fatalf("event stream: %v", err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		d.t.Fatalf("event stream: %d", res.StatusCode)
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.Event != "" {
				if !handle(ev) {
					return
				}
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, "id:"):
			ev.ID = strings.TrimSpace(strings.TrimPrefix(line, "id:"))
		case strings.HasPrefix(line, "event:"):
			ev.Event = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			if err := json.Unmarshal([]byte(strings.TrimSpace(strings.TrimPrefix(line, "data:"))), &ev.Data); err != nil {
				d.t.Fatalf("event stream data %q: %v", line, err)
			}
		}
	}
}

// TestFaultEventStreamResume: an event-stream (SSE)
// consumer handles 10 of 40 waiting exit events and crashes; 10 more
// sessions end while none is connected; the restarted consumer resumes
// with Last-Event-ID and gets every other event exactly once. A long-poll
// consumer that crashed after handling part of an answer gets the rest
// again by confirming (ack) only what it handled.
func TestFaultEventStreamResume(t *testing.T) {
	d := newFltDaemon(t, "up", fltDaemonOpts{})
	const key = "agent:f9:main"
	ids := d.startMany(key, "gateway", "echo f9-%d", 40)
	d.waitEnded(key, ids, 30*time.Second)
	time.Sleep(500 * time.Millisecond)

	got := map[string]int{}
	count := func(ev sseEvent) {
		if ev.Data.Kind == protocol.EventExecExit {
			got[strings.TrimPrefix(ev.Data.ContextKey, "exec:")]++
		}
	}
	var last string
	handled := 0
	d.sseRead(key, "", 20*time.Second, func(ev sseEvent) bool {
		count(ev)
		last = ev.ID
		handled++
		return handled < 10
	})
	if handled != 10 || last == "" {
		t.Fatalf("first consumer handled %d events (last id %q)", handled, last)
	}
	later := d.startMany(key, "gateway", "echo f9-later-%d", 10)
	d.waitEnded(key, later, 30*time.Second)
	all := append(append([]string{}, ids...), later...)
	missing := func() int {
		n := 0
		for _, id := range all {
			if got[id] == 0 {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(20 * time.Second)
	settleUntil := time.Time{}
	d.sseRead(key, last, 25*time.Second, func(ev sseEvent) bool {
		count(ev)
		if missing() == 0 && settleUntil.IsZero() {
			settleUntil = time.Now().Add(time.Second)
		}
		return time.Now().Before(deadline) && (settleUntil.IsZero() || time.Now().Before(settleUntil))
	})
	dup, delivered := 0, 0
	for _, id := range all {
		if got[id] > 0 {
			delivered++
			dup += got[id] - 1
		}
	}
	t.Logf("event stream across a consumer crash: expected %d, delivered %d, duplicated %d", len(all), delivered, dup)
	if delivered != len(all) || dup != 0 {
		t.Errorf("event stream resumed with Last-Event-ID: expected %d, delivered %d, duplicated %d", len(all), delivered, dup)
	}
	// What the resumed stream sent is confirmed once a reader comes back
	// after its last id; the long poll starts from an empty queue then.
	d.sseRead(key, fmt.Sprint(lastSSEID(t, d, key)), 2*time.Second, func(sseEvent) bool { return false })

	// Long poll: take 5, handle 2, crash; the next take confirms only
	// the 2 (ack) and gets the other 3 again.
	five := d.startMany(key, "gateway", "echo f9-poll-%d", 5)
	d.waitEnded(key, five, 30*time.Second)
	time.Sleep(500 * time.Millisecond)
	var first []protocol.SystemEvent
	clCheckFor(t, "5 events in one answer", 10*time.Second, 100*time.Millisecond, func() error {
		evs, st, raw := d.events(key, time.Second, "")
		if st != 200 {
			return fmt.Errorf("%d %s", st, raw)
		}
		first = append(first, evs...)
		if len(first) < 5 {
			return fmt.Errorf("%d events", len(first))
		}
		return nil
	})
	again, st, raw := d.events(key, time.Second, first[1].ID)
	if st != 200 {
		t.Fatalf("events with ack: %d %s", st, raw)
	}
	var ids2 []string
	for _, ev := range again {
		ids2 = append(ids2, ev.ContextKey)
	}
	want := []string{first[2].ContextKey, first[3].ContextKey, first[4].ContextKey}
	t.Logf("long poll after a crash: handled 2 of 5, got again %d: %v", len(again), ids2)
	if strings.Join(ids2, " ") != strings.Join(want, " ") {
		t.Fatalf("after ack of the 2nd event: got %v, want %v", ids2, want)
	}
	if evs, st, _ := d.events(key, 0, ""); st != 200 || len(evs) != 0 {
		t.Fatalf("after the client came back for more: %d events %+v", len(evs), evs)
	}
}

// lastSSEID returns the id of the newest event the stream of sessionKey
// still holds, 0 when none.
func lastSSEID(t *testing.T, d *fltDaemon, key string) uint64 {
	var last uint64
	d.sseRead(key, "", 2*time.Second, func(ev sseEvent) bool {
		var n uint64
		if _, err := fmt.Sscan(ev.ID, &n); err == nil {
			last = n
		}
		return true
	})
	return last
}
