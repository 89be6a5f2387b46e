package session

import (
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// Spec §23.2 cases 21–22: only background sessions are kept, at most 50,
// and at most 2,000,000 chars of output in all.
func TestRetentionLimits(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	fg := mustExec(t, m, ExecRequest{Command: "echo fg", ScopeKey: "k"})
	if fg.Status() != "completed" || len(proc(t, m, "k", protocol.ProcessArgs{Action: "list"}).Details.Sessions.Value()) != 0 {
		t.Fatalf("foreground session kept")
	}
	var ids []string
	for i := 0; i < 51; i++ {
		id := startBackground(t, m, ExecRequest{Command: "true", ScopeKey: "k"})
		waitExited(t, m, id)
		ids = append(ids, id)
	}
	list := proc(t, m, "k", protocol.ProcessArgs{Action: "list"}).Details.Sessions.Value()
	if len(list) != 50 || m.Has("k", ids[0]) || !m.Has("k", ids[1]) || !m.Has("k", ids[50]) {
		t.Errorf("%d retained; oldest kept %v", len(list), m.Has("k", ids[0]))
	}
	e := list[0]
	if e.Status.Value() != "completed" || e.ExitCode.Ptr() == nil || e.ExitCode.Value() != 0 || e.EndedAt.IsZero() || !e.ExitSignal.IsZero() {
		t.Errorf("finished entry: %v", e)
	}
}

func TestRetentionChars(t *testing.T) {
	t.Parallel()
	m := newManager(t, func(c *Config) { c.MaxFinishedChars = 3000 })
	a := startBackground(t, m, ExecRequest{Command: "head -c 2000 /dev/zero | tr '\\0' a"})
	waitExited(t, m, a)
	b := startBackground(t, m, ExecRequest{Command: "head -c 2000 /dev/zero | tr '\\0' b"})
	waitExited(t, m, b)
	if m.Has("", a) || !m.Has("", b) {
		t.Errorf("older session not evicted by the char limit")
	}
	// A single session over the limit is still kept.
	c := startBackground(t, m, ExecRequest{Command: "head -c 5000 /dev/zero | tr '\\0' c"})
	waitExited(t, m, c)
	if !m.Has("", c) || m.Has("", b) {
		t.Errorf("char limit: b kept %v, c kept %v", m.Has("", b), m.Has("", c))
	}
}

// TestTTLExpiry: finished sessions disappear after JobTTL, from one timer.
func TestTTLExpiry(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	// JobTTL cannot be configured below a minute; tests shorten it here,
	// before any session exists.
	m.cfg.JobTTL = 2 * time.Second
	first := startBackground(t, m, ExecRequest{Command: "true"})
	waitExited(t, m, first)
	second := startBackground(t, m, ExecRequest{Command: "sleep 0.5"})
	waitExited(t, m, second)
	if !m.Has("", second) {
		t.Fatalf("session dropped at exit")
	}
	checkFor(t, waitLimit, 20*time.Millisecond, func() error {
		if m.Has("", first) || m.Has("", second) {
			return fmt.Errorf("still retained: %v %v", m.Has("", first), m.Has("", second))
		}
		return nil
	})
}

// TestSweep checks the expiry bookkeeping without waiting: sweep drops what
// expired and names the next expiry, which the janitor's single timer uses.
func TestSweep(t *testing.T) {
	m := newManager(t, nil)
	now := time.Now()
	mk := func(id string, ended time.Time) *session {
		s := &session{m: m, id: id, startedAt: ended, out: newOutputBuffer(1000, 1000), done: make(chan struct{}), termDone: make(chan struct{})}
		s.exited, s.backgrounded, s.endedAt = true, true, ended
		m.mu.Lock()
		m.sessions[id] = s
		m.retainLocked(s, ended)
		m.mu.Unlock()
		return s
	}
	mk("amber-atlas", now)
	mk("brisk-basil", now.Add(time.Minute))
	next, ok := m.sweep(now.Add(29 * time.Minute))
	if !ok || !next.Equal(now.Add(defaultJobTTL)) || !m.Has("", "amber-atlas") {
		t.Errorf("before expiry: next %v %v", next, ok)
	}
	next, ok = m.sweep(now.Add(30*time.Minute + time.Second))
	if !ok || !next.Equal(now.Add(time.Minute+defaultJobTTL)) || m.Has("", "amber-atlas") || !m.Has("", "brisk-basil") {
		t.Errorf("after first expiry: next %v %v", next, ok)
	}
	if _, ok := m.sweep(now.Add(time.Hour)); ok || m.Has("", "brisk-basil") {
		t.Errorf("everything should have expired")
	}
}

func TestClearAndRemoveFinished(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	for _, action := range []string{"clear", "remove"} {
		id := startBackground(t, m, ExecRequest{Command: "echo a"})
		running := startBackground(t, m, ExecRequest{Command: "sleep 30"})
		if r := proc(t, m, "", protocol.ProcessArgs{Action: "clear", SessionID: running}); r.Text() != "No finished session found for "+running {
			t.Errorf("clear of a running session: %q", r.Text())
		}
		waitExited(t, m, id)
		r := proc(t, m, "", protocol.ProcessArgs{Action: action, SessionID: id})
		want := map[string]string{"clear": "Cleared session " + id + ".", "remove": "Removed session " + id + "."}[action]
		if r.Text() != want || r.Status() != "completed" {
			t.Errorf("%s: %q", action, r.Text())
		}
		if m.Has("", id) {
			t.Errorf("%s left the session", action)
		}
		proc(t, m, "", protocol.ProcessArgs{Action: "kill", SessionID: running})
	}
}

// Spec §23.6 cases 55–59.
func TestResolveShell(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string) string {
		d := filepath.Join(dir, name+"-dir")
		p := filepath.Join(d, name)
		if err := mkExecutable(p); err != nil {
			t.Fatal(err)
		}
		return d
	}
	bashDir, shDir := mk("bash"), mk("sh")
	tests := []struct{ shell, path, want string }{
		{"/usr/bin/fish", bashDir, filepath.Join(bashDir, "bash")},
		{"/usr/bin/fish", shDir, filepath.Join(shDir, "sh")},
		{"/usr/bin/fish", "", "/usr/bin/fish"},
		{"", "", "sh"},
		{"", shDir + ":" + bashDir, filepath.Join(shDir, "sh")},
		{"", bashDir, filepath.Join(bashDir, "bash")},
		{"/usr/bin/false", shDir, filepath.Join(shDir, "sh")},
		{"/sbin/nologin", "", "sh"},
		{" /bin/zsh ", bashDir, "/bin/zsh"},
	}
	for _, tt := range tests {
		if got := ResolveShell(tt.shell, tt.path); got != tt.want {
			t.Errorf("ResolveShell(%q, %q) = %q, want %q", tt.shell, tt.path, got, tt.want)
		}
	}
	for shell, want := range map[string]string{
		"/bin/bash": "--noprofile --norc -c", "/bin/zsh": "-f -c", "/usr/bin/fish": "--no-config -c", "/bin/dash": "-c", "sh": "-c",
	} {
		if got := strings.Join(shellArgs(shell), " "); got != want {
			t.Errorf("shellArgs(%q) = %q, want %q", shell, got, want)
		}
	}
}

// Spec §23.9 case 84 and the timeout rules.
func TestYieldAndTimeout(t *testing.T) {
	for _, tt := range []struct {
		in   *float64
		want time.Duration
	}{
		{nil, 10 * time.Second}, {ptr(0.0), 10 * time.Millisecond}, {ptr(5.0), 10 * time.Millisecond},
		{ptr(150000.0), 120 * time.Second}, {ptr(math.NaN()), 10 * time.Second}, {ptr(2500.0), 2500 * time.Millisecond},
	} {
		if got := yieldWindow(tt.in, defaultYieldMs); got != tt.want {
			t.Errorf("yieldWindow(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
	if _, d, ok := resolveTimeout(nil, 1800); !ok || d != 30*time.Minute {
		t.Errorf("default timeout %v %v", d, ok)
	}
	if _, _, ok := resolveTimeout(ptr(0.0), 1800); ok {
		t.Errorf("timeout 0 must disable the timeout")
	}
	if _, d, ok := resolveTimeout(ptr(1e12), 1800); !ok || d != maxTimeout {
		t.Errorf("huge timeout %v", d)
	}
}

func TestSessionIDs(t *testing.T) {
	slug := regexp.MustCompile(`^[a-z]+-[a-z]+$`)
	for i := 0; i < 100; i++ {
		if id := newSessionID(func(string) bool { return false }); !slug.MatchString(id) {
			t.Fatalf("id %q", id)
		}
	}
	if len(slugAdjectives) != 42 || len(slugNouns) != 54 {
		t.Errorf("word lists: %d adjectives, %d nouns", len(slugAdjectives), len(slugNouns))
	}
	// Every bare two-word id taken: numbered suffixes.
	if id := newSessionID(func(id string) bool { return strings.Count(id, "-") == 1 }); !regexp.MustCompile(`^[a-z]+-[a-z]+-([2-9]|1[0-2])$`).MatchString(id) {
		t.Errorf("suffixed id %q", id)
	}
	// Every two-word form taken: three words.
	if id := newSessionID(func(id string) bool { return !regexp.MustCompile(`^[a-z]+-[a-z]+-[a-z]+$`).MatchString(id) }); strings.Count(id, "-") != 2 {
		t.Errorf("three-word id %q", id)
	}
	// Everything but the random fallback taken.
	fallback := regexp.MustCompile(`^[a-z]+-[a-z]+-[a-z]+-[a-z0-9]{3}$`)
	if id := newSessionID(func(id string) bool { return !fallback.MatchString(id) }); !fallback.MatchString(id) {
		t.Errorf("fallback id %q", id)
	}
	if id := newSessionID(func(id string) bool {
		return !strings.Contains(id, "-") || fallback.MatchString(id) || strings.Count(id, "-") < 4
	}); strings.Count(id, "-") != 4 {
		t.Errorf("time-suffixed id %q", id)
	}
}

func TestParseStrictInteger(t *testing.T) {
	for in, want := range map[string]int64{" 300 ": 300, "+2000": 2000, "-5": -5, "  60000\n": 60000, "9007199254740991": 1<<53 - 1} {
		if got, ok := parseStrictInteger(in); !ok || got != want {
			t.Errorf("parseStrictInteger(%q) = %d %v", in, got, ok)
		}
	}
	for _, in := range []string{"", " ", "abc", "10abc", "1e3", "1.5", "0x10", "９９９", "9007199254740993", "+", "+-1"} {
		if got, ok := parseStrictInteger(in); ok {
			t.Errorf("parseStrictInteger(%q) = %d, want invalid", in, got)
		}
	}
}
