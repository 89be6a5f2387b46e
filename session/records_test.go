package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/internal/testutil"
	"github.com/execmesh/execmesh/protocol"
)

// TestRecordSlotsReused: sessions one after another reuse one record
// file, overwritten in place (no file is created or unlinked per
// session), and a short record written over a long one still reads back
// as itself; blank slots are removed at Close.
func TestRecordSlotsReused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	m := newManager(t, func(c *Config) { c.StateDir = dir })
	inode := func() (string, uint64) {
		t.Helper()
		ents, err := os.ReadDir(dir)
		if err != nil || len(ents) != 1 {
			t.Fatalf("state dir holds %v (%v), want one record file", ents, err)
		}
		fi, err := os.Stat(filepath.Join(dir, ents[0].Name()))
		if err != nil {
			t.Fatal(err)
		}
		return ents[0].Name(), fi.Sys().(*syscall.Stat_t).Ino
	}
	long := "sleep " + token() + " # " + strings.Repeat("x", 3000)
	id := startBackground(t, m, ExecRequest{Command: long})
	name, ino := inode()
	blank := func() {
		t.Helper()
		checkFor(t, waitLimit, 10*time.Millisecond, func() error {
			b, _ := os.ReadFile(filepath.Join(dir, name))
			if strings.TrimSpace(string(b)) != "" {
				return fmt.Errorf("slot still holds %.80q after the kill", b)
			}
			// Blanked first, then handed back for reuse.
			if freeSlots(m) == 0 {
				return fmt.Errorf("blank slot not back in the free list yet")
			}
			return nil
		})
	}
	killSession(t, m, "", id)
	blank()
	// A foreground session's record goes once its exit is handled, a
	// moment after the call answered: each run waits for its slot to be
	// blank and free again, so that all of them share slot 0.
	settled := func() {
		t.Helper()
		checkFor(t, waitLimit, 5*time.Millisecond, func() error {
			free := freeSlots(m)
			m.records.mu.Lock()
			defer m.records.mu.Unlock()
			if len(m.records.inUse) > 0 || free == 0 {
				return fmt.Errorf("%d records in use, %d free", len(m.records.inUse), free)
			}
			return nil
		})
	}
	for range 20 {
		mustExec(t, m, ExecRequest{Command: "true"})
		settled()
	}
	short := "sleep " + token()
	id = startBackground(t, m, ExecRequest{Command: short})
	if n, i := inode(); n != name || i != ino {
		t.Errorf("record file %s (inode %d), want %s (inode %d) reused", n, i, name, ino)
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	var r record
	if err := jsonUnmarshal(b, &r); err != nil || r.SessionID != id || r.Command != short {
		t.Errorf("record over a longer one: %+v, %v", r, err)
	}
	killSession(t, m, "", id)
	blank()
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("state dir after Close: %v", ents)
	}
}

// TestRecoverySkipsBlankSlots: a blank slot left by a killed daemon is
// removed without a lost session; a padded record is recovered.
func TestRecoverySkipsBlankSlots(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "slot-0.json"), []byte(strings.Repeat(" ", 200)), 0o600); err != nil {
		t.Fatal(err)
	}
	rec := `{"sessionId":"gone-one","sessionKey":"agent:x","command":"true","pid":999999999,"pidStart":1,"startedAt":1}`
	if err := os.WriteFile(filepath.Join(dir, "slot-1.json"), []byte(rec+strings.Repeat(" ", 300)), 0o600); err != nil {
		t.Fatal(err)
	}
	var lost []LostSession
	newManager(t, func(c *Config) {
		c.Containment = ContainmentProcessGroup
		c.StateDir = dir
		c.OnLost = func(l LostSession) { lost = append(lost, l) }
	})
	if len(lost) != 1 || lost[0].SessionID != "gone-one" {
		t.Errorf("lost: %+v, want gone-one only", lost)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("state dir after recovery: %v", ents)
	}
}

// TestConfirmExitsKeepsRecord: with ConfirmExits the record of a finished
// background session stays until ExitStored (and says the exit is
// pending); a next Manager reports one never confirmed as lost with its
// exit status; a confirmed one leaves nothing. The exit event's taker is
// Config.OnExit or, as host.Local has it, the request's OnExitHook.
func TestConfirmExitsKeepsRecord(t *testing.T) {
	t.Parallel()
	for _, taker := range []string{"OnExit", "OnExitHook"} {
		t.Run(taker, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			exits := make(chan protocol.ExitEvent, 4)
			var hook func(protocol.ExitEvent)
			m := newManager(t, func(c *Config) {
				c.StateDir = dir
				c.ConfirmExits = true
				if taker == "OnExit" {
					c.OnExit = func(ev protocol.ExitEvent) { exits <- ev }
				} else {
					hook = func(ev protocol.ExitEvent) { exits <- ev }
				}
			})
			unconfirmed := startBackground(t, m, ExecRequest{Command: "exit 3", ScopeKey: "agent:a:main", OnExitHook: hook})
			confirmed := startBackground(t, m, ExecRequest{Command: "true", ScopeKey: "agent:a:main", OnExitHook: hook})
			for range 2 {
				select {
				case ev := <-exits:
					if ev.SessionID == confirmed {
						m.ExitStored(confirmed)
					}
				case <-time.After(waitLimit):
					t.Fatal("no exit event")
				}
			}
			time.Sleep(200 * time.Millisecond) // the trees are gone
			var held []record
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
				var r record
				if strings.TrimSpace(string(b)) != "" && jsonUnmarshal(b, &r) == nil {
					held = append(held, r)
				}
			}
			if len(held) != 1 || held[0].SessionID != unconfirmed || !held[0].ExitPending {
				t.Fatalf("records after the exits: %+v, want only %s's, exit pending", held, unconfirmed)
			}
			var lost []LostSession
			newManager(t, func(c *Config) {
				c.StateDir = dir
				c.OnLost = func(l LostSession) { lost = append(lost, l) }
			})
			if len(lost) != 1 || lost[0].SessionID != unconfirmed || !strings.Contains(lost[0].Reason, "exit code 3") || !strings.Contains(lost[0].Reason, "before its exit event was stored") {
				t.Fatalf("lost: %+v", lost)
			}
		})
	}
}

// TestUnrecordableStartRefused: while the state dir takes no record (here
// every slot file a record could go to is a directory), a start is
// refused with a retryable error and leaves nothing: no session listed,
// no process running, no exit event; RecordsHealthy says why. Once the
// state dir takes records again, starts succeed and it is healthy.
func TestUnrecordableStartRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	exits := make(chan protocol.ExitEvent, 4)
	m := newManager(t, func(c *Config) {
		c.StateDir = dir
		c.ConfirmExits = true
		c.OnExit = func(ev protocol.ExitEvent) { exits <- ev }
	})
	for i := range 8 {
		if err := os.Mkdir(filepath.Join(dir, fmt.Sprintf("slot-%d.json", i)), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	marker := token()
	for attempt := range 3 { // the first is refused after its spawn, the others before
		_, err := m.Exec(context.Background(), ExecRequest{Command: "sleep " + marker, Background: true, ScopeKey: "agent:a:main"})
		var perr *protocol.Error
		if !errors.As(err, &perr) || perr.Type != protocol.ErrUnavailable || !perr.Retryable || !strings.Contains(perr.Message, "nothing was started") {
			t.Fatalf("start %d while no record can be written: %v, want a retryable unavailable error", attempt, err)
		}
	}
	if err := m.RecordsHealthy(); !errors.Is(err, ErrRecords) {
		t.Errorf("RecordsHealthy: %v, want ErrRecords", err)
	}
	res := m.Process(context.Background(), "agent:a:main", protocol.ProcessArgs{Action: "list"})
	if strings.Contains(res.Text(), marker) {
		t.Errorf("a refused session is listed: %s", res.Text())
	}
	checkFor(t, waitLimit, 10*time.Millisecond, func() error {
		if n := len(testutil.ProcsWith(marker)); n > 0 {
			return fmt.Errorf("%d processes of a refused start still run", n)
		}
		return nil
	})
	select {
	case ev := <-exits:
		t.Errorf("exit event of a refused start: %+v", ev)
	case <-time.After(200 * time.Millisecond):
	}
	for i := range 8 {
		_ = os.Remove(filepath.Join(dir, fmt.Sprintf("slot-%d.json", i)))
	}
	// It tries a write at most once a second.
	checkFor(t, 5*time.Second, 100*time.Millisecond, func() error { return m.RecordsHealthy() })
	id := startBackground(t, m, ExecRequest{Command: "true", ScopeKey: "agent:a:main"})
	select {
	case ev := <-exits:
		if ev.SessionID != id {
			t.Errorf("exit event of %s, want %s", ev.SessionID, id)
		}
	case <-time.After(waitLimit):
		t.Fatal("no exit event once records can be written")
	}
}

// TestLostRecordKeptUntilConfirmed: with ConfirmExits the record of a
// session reported lost stays in its slot (its processes ended, so it
// names none) until ExitStored confirms the report: a Manager closed
// before that leaves it to the next, which reports it again with the
// same reason; new sessions take other slots; once confirmed, nothing is
// left and no later Manager reports it.
func TestLostRecordKeptUntilConfirmed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rec := `{"sessionId":"gone-two","sessionKey":"agent:x","command":"true","pid":999999999,"pidStart":1,"pgid":999999999,"startedAt":1}`
	slot := filepath.Join(dir, "slot-5.json")
	if err := os.WriteFile(slot, []byte(rec+strings.Repeat(" ", 300)), 0o600); err != nil {
		t.Fatal(err)
	}
	open := func() (*Manager, []LostSession) {
		t.Helper()
		var lost []LostSession
		m := newManager(t, func(c *Config) {
			c.Containment = ContainmentProcessGroup
			c.StateDir = dir
			c.ConfirmExits = true
			c.OnLost = func(l LostSession) { lost = append(lost, l) }
		})
		return m, lost
	}
	m1, lost1 := open()
	if len(lost1) != 1 || lost1[0].SessionID != "gone-two" {
		t.Fatalf("first run lost: %+v", lost1)
	}
	b, err := os.ReadFile(slot)
	var r record
	if err == nil {
		err = jsonUnmarshal(b, &r)
	}
	if err != nil || r.SessionID != "gone-two" || r.LostReason != lost1[0].Reason || r.PID != 0 || r.PGID != 0 {
		t.Fatalf("kept record: %+v, %v", r, err)
	}
	id := startBackground(t, m1, ExecRequest{Command: "sleep " + token(), ScopeKey: "agent:x"})
	if b2, _ := os.ReadFile(slot); string(b2) != string(b) {
		t.Errorf("a new session (%s) took the kept record's slot: %q", id, b2)
	}
	if err := m1.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	m2, lost2 := open()
	if len(lost2) != 1 || lost2[0].SessionID != "gone-two" || lost2[0].Reason != lost1[0].Reason {
		t.Fatalf("second run lost: %+v, want gone-two again, reason %q", lost2, lost1[0].Reason)
	}
	m2.ExitStored("gone-two")
	if err := m2.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("state dir after the confirmation and Close: %v", ents)
	}
	if _, lost3 := open(); len(lost3) != 0 {
		t.Errorf("third run lost: %+v", lost3)
	}
}

// openRecordFiles lists the descriptors of this process open on files
// in dir (fd → path).
func openRecordFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		if p, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(p, dir+"/") {
			out[e.Name()] = p
		}
	}
	return out
}

// TestForegroundRecordsKeepTheirFile: a foreground session's record is
// written through a descriptor kept open (no open and close on the
// command's path), the slot keeps it for the next foreground session, at
// most maxOpenSlots are kept, and background sessions hold none: a
// background start takes a slot without one, a foreground session that
// turns background gives its own back.
func TestForegroundRecordsKeepTheirFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	m := newManager(t, func(c *Config) { c.StateDir = dir })
	settled := func(want int) {
		t.Helper()
		checkFor(t, waitLimit, 5*time.Millisecond, func() error {
			m.records.mu.Lock()
			defer m.records.mu.Unlock()
			if n := len(m.records.inUse); n > 0 {
				return fmt.Errorf("%d records in use", n)
			}
			if n := len(m.records.freeOpen); n != want {
				return fmt.Errorf("%d free slots with a kept file, want %d", n, want)
			}
			return nil
		})
	}
	mustExec(t, m, ExecRequest{Command: "true"})
	settled(1)
	first := openRecordFiles(t, dir)
	if len(first) != 1 {
		t.Fatalf("after one foreground run %d record files are open (%v), want 1", len(first), first)
	}
	for range 5 {
		mustExec(t, m, ExecRequest{Command: "true"})
		settled(1)
	}
	if got := openRecordFiles(t, dir); fmt.Sprint(got) != fmt.Sprint(first) {
		t.Fatalf("the kept record file changed: %v, then %v", first, got)
	}

	// Concurrent foreground sessions keep at most maxOpenSlots files.
	const n = maxOpenSlots + 4
	y := 30000.0
	done := make(chan error, n)
	for range n {
		go func() {
			res, err := m.Exec(t.Context(), ExecRequest{Command: "sleep 0.5", YieldMs: &y})
			if err == nil && res.Status() != protocol.StatusCompleted {
				err = fmt.Errorf("status %s", res.Status())
			}
			done <- err
		}()
	}
	checkFor(t, waitLimit, 5*time.Millisecond, func() error {
		m.records.mu.Lock()
		defer m.records.mu.Unlock()
		if k := len(m.records.inUse); k != n {
			return fmt.Errorf("%d of %d sessions recorded", k, n)
		}
		return nil
	})
	if got := len(openRecordFiles(t, dir)); got != maxOpenSlots {
		t.Errorf("%d foreground sessions hold %d record files, want %d (maxOpenSlots)", n, got, maxOpenSlots)
	}
	for range n {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	settled(maxOpenSlots)

	// Background sessions hold none: every kept file stays with a free
	// slot, or is closed.
	var ids []string
	for i := range 4 {
		req := ExecRequest{Command: "sleep " + token(), Background: true}
		if i%2 == 1 {
			y := 10.0
			req = ExecRequest{Command: "sleep " + token(), YieldMs: &y}
		}
		res, err := m.Exec(t.Context(), req)
		if err != nil || res.Status() != protocol.StatusRunning {
			t.Fatalf("%v %s", err, res.Status())
		}
		ids = append(ids, res.SessionID())
	}
	m.records.mu.Lock()
	freeOpen := len(m.records.freeOpen)
	for name, sl := range m.records.inUse {
		if sl.file != nil {
			t.Errorf("background session %s holds its record file", name)
		}
	}
	m.records.mu.Unlock()
	if got := len(openRecordFiles(t, dir)); got != freeOpen {
		t.Errorf("%d record files open with 4 background sessions running, want the %d of free slots", got, freeOpen)
	}
	for _, id := range ids {
		killSession(t, m, "", id)
	}
}

// freeSlots is the number of blank record slots m keeps.
func freeSlots(m *Manager) int {
	m.records.mu.Lock()
	defer m.records.mu.Unlock()
	return len(m.records.free) + len(m.records.freeOpen)
}
