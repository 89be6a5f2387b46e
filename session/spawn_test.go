package session

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// TestDedupEnv: the environment a pipe session is spawned with follows
// os/exec's rules: the last of duplicate variables wins, order is kept,
// entries without "=" stay, empty ones go, a NUL byte is refused.
func TestDedupEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, want []string
		err      bool
	}{
		{in: []string{"A=1", "B=2", "A=3"}, want: []string{"B=2", "A=3"}},
		{in: []string{"A=1", "junk", "", "=X=1", "=X=2"}, want: []string{"A=1", "junk", "=X=2"}},
		{in: []string{"A=1", "B=x\x00y"}, want: []string{"A=1"}, err: true},
	} {
		got, err := dedupEnv(tc.in)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("dedupEnv(%q) = %q, %v; want %q (error %v)", tc.in, got, err, tc.want, tc.err)
		}
	}
	m := newManager(t, nil)
	res := mustExec(t, m, ExecRequest{Command: "echo $A", Env: []string{"A=1", "PATH=/usr/bin:/bin", "A=2"}})
	if strings.TrimSpace(res.Text()) != "2" {
		t.Errorf("duplicate variable: %q, want 2", res.Text())
	}
	res, err := m.Exec(context.Background(), ExecRequest{Command: "true", Env: []string{"A=x\x00y"}})
	if err != nil || res.Status() != "failed" || !strings.Contains(res.Text(), "environment variable contains NUL") {
		t.Errorf("NUL in env: %v %s %q", err, res.Status(), res.Text())
	}
}

// TestPipeSessionStdin: a pipe session's stdin is /dev/null (one
// descriptor the Manager opened once), at end of file for every command.
func TestPipeSessionStdin(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	for range 3 {
		res := mustExec(t, m, ExecRequest{Command: "cat; readlink /proc/self/fd/0; echo done"})
		if got := strings.TrimSpace(res.Text()); got != "/dev/null\ndone" {
			t.Errorf("stdin: %q", got)
		}
	}
}
