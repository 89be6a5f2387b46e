package session

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

func TestExecCommand(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	other := filepath.Join(dir, "other")
	for _, d := range []string{bin, other, filepath.Join(dir, "adir")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(path string, mode os.FileMode) {
		t.Helper()
		if err := os.WriteFile(path, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(bin, "prog"), 0o755)
	write(filepath.Join(bin, "noexec"), 0o644)
	write(filepath.Join(other, "noexec"), 0o755) // found later on PATH: not what the shell runs
	write(filepath.Join(bin, "echo"), 0o755)     // a builtin's name
	write(filepath.Join(dir, "local"), 0o755)
	if err := os.Mkdir(filepath.Join(bin, "subdir"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := "PATH=" + bin + ":" + other
	for _, c := range []struct {
		name, shell, command string
		env                  []string
		want                 string
	}{
		{"program on PATH", "/bin/sh", "prog 600", []string{path}, "exec prog 600"},
		{"plain words", "/bin/sh", "prog --port=8000 a.b/c,d:e+f@g%h_i-j", []string{path}, "exec prog --port=8000 a.b/c,d:e+f@g%h_i-j"},
		{"blanks kept", "/usr/bin/dash", "  prog\t1 ", []string{path}, "exec   prog\t1 "},
		{"bash", "/bin/bash", "prog", []string{path}, "exec prog"},
		{"zsh", "zsh", "prog", []string{path}, "exec prog"},
		{"last PATH wins", "/bin/sh", "prog", []string{"PATH=/nonexistent", path}, "exec prog"},
		{"absolute path", "/bin/sh", filepath.Join(bin, "prog") + " x", nil, "exec " + filepath.Join(bin, "prog") + " x"},
		{"relative to the workdir", "/bin/sh", "./local", nil, "exec ./local"},
		{"fish", "/usr/bin/fish", "prog", []string{path}, "prog"},
		{"unknown shell", "/bin/csh", "prog", []string{path}, "prog"},
		{"builtin", "/bin/sh", "echo hi", []string{path}, "echo hi"},
		{"reserved word", "/bin/sh", "time prog", []string{path}, "time prog"},
		{"not found", "/bin/sh", "nosuchprog", []string{path}, "nosuchprog"},
		{"first found not executable", "/bin/sh", "noexec", []string{path}, "noexec"},
		{"a directory", "/bin/sh", filepath.Join(bin, "subdir"), []string{path}, filepath.Join(bin, "subdir")},
		{"path not executable", "/bin/sh", filepath.Join(bin, "noexec"), nil, filepath.Join(bin, "noexec")},
		{"no PATH", "/bin/sh", "prog", nil, "prog"},
		{"relative PATH entry first", "/bin/sh", "prog", []string{"PATH=.:" + bin}, "prog"},
		{"empty PATH entry first", "/bin/sh", "prog", []string{"PATH=:" + bin}, "prog"},
		{"assignment", "/bin/sh", "A=1 prog", []string{path}, "A=1 prog"},
		{"assignment alone", "/bin/sh", "A=1", []string{path}, "A=1"},
		{"list", "/bin/sh", "prog; prog", []string{path}, "prog; prog"},
		{"and", "/bin/sh", "prog && prog", []string{path}, "prog && prog"},
		{"pipe", "/bin/sh", "prog | prog", []string{path}, "prog | prog"},
		{"background", "/bin/sh", "prog &", []string{path}, "prog &"},
		{"redirection", "/bin/sh", "prog >out", []string{path}, "prog >out"},
		{"expansion", "/bin/sh", "prog $HOME", []string{path}, "prog $HOME"},
		{"command substitution", "/bin/sh", "prog `x`", []string{path}, "prog `x`"},
		{"quotes", "/bin/sh", "prog 'a b'", []string{path}, "prog 'a b'"},
		{"glob", "/bin/sh", "prog *", []string{path}, "prog *"},
		{"tilde", "/bin/sh", "prog ~", []string{path}, "prog ~"},
		{"comment", "/bin/sh", "prog #x", []string{path}, "prog #x"},
		{"escape", "/bin/sh", `prog \n`, []string{path}, `prog \n`},
		{"two lines", "/bin/sh", "prog\nprog", []string{path}, "prog\nprog"},
		{"subshell", "/bin/sh", "(prog)", []string{path}, "(prog)"},
		{"empty", "/bin/sh", " ", []string{path}, " "},
		{"not ASCII", "/bin/sh", "prog é", []string{path}, "prog é"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := execCommand(c.shell, c.command, c.env, dir); got != c.want {
				t.Errorf("execCommand(%q, %q) = %q, want %q", c.shell, c.command, got, c.want)
			}
		})
	}
}

// A background command that is one program runs as that program, not as
// a shell waiting for it: one process to hold, signal and reap. A list
// stays the shell's. Killing either ends it as a signal.
func TestExecSimpleCommandIsTheLeader(t *testing.T) {
	// /bin/sh, as on Debian dash: bash, the usual $SHELL, runs such a
	// command in its own place by itself.
	forEachContainment(t, func(t *testing.T, mode string) {
		m := newManager(t, func(c *Config) { c.Containment = mode; c.Shell = "/bin/sh" })
		for _, c := range []struct {
			command, comm string
			children      int
		}{
			{"sleep 30", "sleep", 0},
			{"sleep 30; true", filepath.Base(m.shell), 1},
		} {
			id := startBackground(t, m, ExecRequest{Command: c.command})
			m.mu.Lock()
			pid := m.sessions[id].pid
			m.mu.Unlock()
			// The leader is the shell until it execs or forks.
			checkFor(t, 10*time.Second, 5*time.Millisecond, func() error {
				b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
				if err != nil {
					return err
				}
				if comm := strings.TrimSpace(string(b)); comm != c.comm {
					return fmt.Errorf("%q: leader %d is %q, want %q", c.command, pid, comm, c.comm)
				}
				if kids := childrenOf(pid); len(kids) != c.children {
					return fmt.Errorf("%q: leader %d has children %v, want %d", c.command, pid, kids, c.children)
				}
				return nil
			})
			killSession(t, m, "", id)
			r := proc(t, m, "", protocol.ProcessArgs{Action: "poll", SessionID: id})
			if sig, _ := r.Details.ExitSignal.Get(); sig != "SIGKILL" && sig != "SIGTERM" {
				t.Errorf("%q killed: %s %q, want an exit by a signal", c.command, r.Status(), r.Text())
			}
		}
	})
}

// childrenOf lists the children of pid.
func childrenOf(pid int) []string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/children")
	return strings.Fields(string(b))
}
