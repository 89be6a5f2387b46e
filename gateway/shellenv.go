package gateway

import (
	"bufio"
	"bytes"
	"context"
	"github.com/execmesh/execmesh/protocol"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// loginShellProbeTimeout bounds the one-time login-shell PATH probe.
const loginShellProbeTimeout = 15 * time.Second

// probeLoginShellPath asks the user's login shell for its PATH, as
// OpenClaw does (spec §7.4): $SHELL when absolute and listed in
// /etc/shells, else /bin/sh; `-l -c 'env -0'`; stdin closed; 15 s bound.
// It returns "" on any failure.
func probeLoginShellPath(lookup func(string) string) string {
	shell := lookup("SHELL")
	if !filepath.IsAbs(shell) || filepath.Clean(shell) != shell || !listedInEtcShells(shell) {
		shell = "/bin/sh"
	}
	ctx, cancel := context.WithTimeout(context.Background(), loginShellProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, shell, "-l", "-c", "env -0")
	home, _ := os.UserHomeDir()
	env := []string{"HOME=" + home, "PATH=" + lookup("PATH"), "USER=" + lookup("USER"), "LANG=" + lookup("LANG")}
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	var out bytes.Buffer
	cmd.Stdout = &limitedWriter{w: &out, n: 2 << 20}
	if err := cmd.Run(); err != nil {
		return ""
	}
	for _, kv := range bytes.Split(out.Bytes(), []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok && k == "PATH" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func listedInEtcShells(shell string) bool {
	f, err := os.Open("/etc/shells")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line != "" && !strings.HasPrefix(line, "#") && line == shell {
			return true
		}
	}
	return false
}

type limitedWriter struct {
	w *bytes.Buffer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if room := l.n - l.w.Len(); room > 0 {
		if len(p) > room {
			l.w.Write(p[:room])
		} else {
			l.w.Write(p)
		}
	}
	return len(p), nil
}

// envLookup returns a lookup function over a KEY=VALUE list.
func envLookup(environ []string) func(string) string {
	m := protocol.EnvMap(environ)
	return func(k string) string { return m[k] }
}

// mergePathEntries puts the entries of front ahead of path, de-duplicated
// (first occurrence wins) and without empty entries.
func mergePathEntries(front, path string) string {
	seen := map[string]bool{}
	var out []string
	for _, part := range append(strings.Split(front, ":"), strings.Split(path, ":")...) {
		part = strings.TrimSpace(part)
		if part == "" || seen[part] {
			continue
		}
		seen[part] = true
		out = append(out, part)
	}
	return strings.Join(out, ":")
}
