package session

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// wantListReply is the list reply List builds, encoded as the list
// endpoint did before AppendListReply: the reference it must match.
func wantListReply(m *Manager, scope string, limit int, instance string, now time.Time) []byte {
	page := ListPage{}
	if limit > 0 {
		page = ListPage{Paged: true, Limit: limit}
	}
	entries, total := m.listEntries(scope, page, now)
	if limit <= 0 {
		total = len(entries)
	}
	r := protocol.ListReply{Instance: instance, Sessions: make([]protocol.ListedSession, 0, len(entries)), Total: total, Partial: total > len(entries)}
	for _, d := range entries {
		r.Sessions = append(r.Sessions, protocol.ListedSession{SessionKey: scope, Details: d})
	}
	return r.AppendJSON(nil)
}

// checkListReply fails the test unless AppendListReply writes what List
// and ListReply.AppendJSON do at now. A background usage refresh can land
// between the two, so a difference is looked at again a few times; a
// stale cached entry stays different.
func checkListReply(t *testing.T, m *Manager, scope string, limit int, now time.Time) []byte {
	t.Helper()
	var got, want []byte
	for range 5 {
		got = m.appendListReply([]byte("prefix"), scope, limit, "inst-1", now)
		want = append([]byte("prefix"), wantListReply(m, scope, limit, "inst-1", now)...)
		if bytes.Equal(got, want) {
			return got[len("prefix"):]
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("AppendListReply (limit %d) differs from List's reply:\n got %s\nwant %s", limit, got, want)
	return nil
}

// TestAppendListReplyMatchesList lists random sessions (quiet and
// talkative, PTY and pipe, finished ok and failed, texts that look like
// the keys the cache cuts at) and checks the reply written from the
// cached entries byte for byte against the reply built from Details, at
// several clocks, and again after each thing that changes an entry:
// output, the usage figure, the exit.
func TestAppendListReplyMatchesList(t *testing.T) {
	t.Parallel()
	m := newManager(t, func(c *Config) { c.InputWaitIdle = time.Second })
	const scope = "cache"
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	commands := []struct {
		cmd     string
		pty     bool
		running bool
	}{
		{"sleep 600", false, true},
		{"printf 'out\\n'; exec sleep 600", false, true},
		{`printf '"idleMs":1,"runtimeMs":2,"waitingForInput":true} é \001'; exec sleep 600`, false, true},
		{`echo '"idleMs":' "runtimeMs\":" && exec sleep 600`, false, true},
		{"cat", true, true},
		{"echo done", false, false},
		{"echo failing >&2; exit 3", false, false},
		{"printf 'pty\\n'", true, false},
	}
	var running, pty []string
	for range 12 {
		c := commands[rng.IntN(len(commands))]
		id := startBackground(t, m, ExecRequest{Command: c.cmd, ScopeKey: scope, PTY: c.pty})
		switch {
		case !c.running:
			waitExited(t, m, id)
		case c.pty:
			pty = append(pty, id)
			running = append(running, id)
		default:
			running = append(running, id)
		}
	}
	if len(pty) == 0 {
		id := startBackground(t, m, ExecRequest{Command: "cat", ScopeKey: scope, PTY: true})
		pty, running = append(pty, id), append(running, id)
	}
	startBackground(t, m, ExecRequest{Command: "sleep 600", ScopeKey: "another"})
	mustExec(t, m, ExecRequest{Command: "echo foreground", ScopeKey: scope}) // not listed

	// Until every session's first output is in (the texts stay then).
	time.Sleep(200 * time.Millisecond)
	now := time.Now()
	for _, at := range []time.Duration{0, 10 * time.Millisecond, 2 * time.Second, 7 * time.Second} {
		checkListReply(t, m, scope, 0, now.Add(at))
		checkListReply(t, m, scope, 3, now.Add(at))
	}
	checkListReply(t, m, "nobody", 0, time.Now())

	// Output: a PTY session echoes what it is sent.
	before := checkListReply(t, m, scope, 0, time.Now())
	text := "hello\n"
	if res := proc(t, m, scope, protocol.ProcessArgs{Action: "write", SessionID: pty[0], Data: &text}); res.Status() == protocol.StatusFailed {
		t.Fatalf("write: %s", res.Text())
	}
	checkFor(t, waitLimit, 10*time.Millisecond, func() error {
		if s := m.anySession(pty[0]); s != nil {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.out.tail() == "" {
				return errors.New("no output yet")
			}
		}
		return nil
	})
	after := checkListReply(t, m, scope, 0, time.Now())
	if bytes.Equal(before, after) || !bytes.Contains(after, []byte(`hello`)) {
		t.Fatalf("the echoed output is not in the list:\n%s", after)
	}

	// The usage figure read again.
	s := m.anySession(running[0])
	s.mu.Lock()
	s.listUsage, s.listUsageAt = protocol.Usage{CPUUserMs: 987654321, Scope: "test"}, time.Now()
	s.listUsageVer++
	s.mu.Unlock()
	if got := checkListReply(t, m, scope, 0, time.Now()); !bytes.Contains(got, []byte(`987654321`)) {
		t.Fatalf("the new usage figure is not in the list:\n%s", got)
	}

	// The exit of a running session.
	if res := proc(t, m, scope, protocol.ProcessArgs{Action: "kill", SessionID: running[0]}); res.Status() == protocol.StatusFailed {
		t.Fatalf("kill: %s", res.Text())
	}
	waitExited(t, m, running[0])
	checkListReply(t, m, scope, 0, time.Now())
	checkListReply(t, m, scope, 0, time.Now().Add(3*time.Second))
}
