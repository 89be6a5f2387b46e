package approvals

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// host is a fake machine in a temp dir: executables are small shell
// scripts, PATH and the allowlist are controlled, and the host's own
// allowlist or binaries never matter (except /bin and /usr/bin, which are
// trusted by default and only reached by tests that say so).
type host struct {
	root    string
	bin     string // general tools, shells, carriers: allowlisted by the "generous" allowlists
	trusted string // safe bins and kept wrappers: a configured trusted dir, not allowlisted
	evil    string // on PATH, never allowlisted: id, rm, whoami
	shim    string // symlink tricks
	work    string // the workdir, with a planted ./ls
	home    string
	path    string
}

var (
	binTools = []string{"ls", "cat", "echo", "grep", "git", "find", "rg", "jq", "make", "npm",
		"sh", "bash", "dash", "zsh", "xargs", "sudo", "doas", "busybox", "python3", "node",
		"watch", "setsid", "true", "sleep", "obsidian-cli", "tar", "sed", "awk", "gawk", "less",
		"more", "man", "vim", "vi", "ex", "nano", "perl"}
	trustedTools = []string{"head", "tail", "wc", "tr", "cut", "uniq", "sort",
		"env", "nice", "nohup", "timeout", "stdbuf", "flock", "time"}
	evilTools = []string{"id", "rm", "whoami"}
)

func writeExec(t testing.TB, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

func newHost(t testing.TB) *host {
	t.Helper()
	root := t.TempDir()
	if real, err := filepath.EvalSymlinks(root); err == nil {
		root = real // macOS: /var → /private/var
	}
	h := &host{
		root:    root,
		bin:     filepath.Join(root, "bin"),
		trusted: filepath.Join(root, "trusted"),
		evil:    filepath.Join(root, "evil"),
		shim:    filepath.Join(root, "shim"),
		work:    filepath.Join(root, "work"),
		home:    filepath.Join(root, "home"),
	}
	for _, n := range binTools {
		writeExec(t, filepath.Join(h.bin, n), "exit 0")
	}
	for _, n := range trustedTools {
		writeExec(t, filepath.Join(h.trusted, n), "exit 0")
	}
	for _, n := range evilTools {
		writeExec(t, filepath.Join(h.evil, n), "exit 0")
	}
	// A file named like an allowlisted tool in the workdir, and a script.
	writeExec(t, filepath.Join(h.work, "ls"), "exit 0")
	writeExec(t, filepath.Join(h.work, "x"), "exit 0")
	writeExec(t, filepath.Join(h.home, "bin", "tool"), "exit 0")
	// Symlinks: ls → /bin/sh in shim, and a link inside the allowlisted bin
	// dir pointing at a non-allowlisted binary.
	if err := os.MkdirAll(h.shim, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/bin/sh", filepath.Join(h.shim, "ls")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(h.evil, "id"), filepath.Join(h.bin, "evil-link")); err != nil {
		t.Fatal(err)
	}
	// A non-executable file and a directory on PATH named like tools.
	if err := os.WriteFile(filepath.Join(h.bin, "noexec"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(h.bin, "adir"), 0o755); err != nil {
		t.Fatal(err)
	}
	// "." and "" on PATH must be ignored even though ./ls exists.
	h.path = strings.Join([]string{".", "", h.bin, h.trusted, h.evil}, string(os.PathListSeparator))
	return h
}

// globAllowlist allowlists everything in bin (and the shim dir): generous,
// "/usr/bin/*" style.
func (h *host) globAllowlist() []Entry {
	return []Entry{{ID: "g1", Pattern: h.bin + "/*"}, {ID: "g2", Pattern: h.shim + "/*"}, {ID: "g3", Pattern: "~/bin/*"}}
}

// specificAllowlist names every bin tool by path.
func (h *host) specificAllowlist() []Entry {
	var out []Entry
	for _, n := range binTools {
		out = append(out, Entry{ID: "s-" + n, Pattern: filepath.Join(h.bin, n)})
	}
	out = append(out, Entry{ID: "s-shim", Pattern: filepath.Join(h.shim, "ls")})
	out = append(out, Entry{ID: "s-link", Pattern: filepath.Join(h.bin, "evil-link")})
	out = append(out, Entry{ID: "s-tool", Pattern: "~/bin/tool"})
	return out
}

func (h *host) opts(allow []Entry) EvalOptions {
	return EvalOptions{
		Cwd:         h.work,
		PATH:        h.path,
		Home:        h.home,
		Allowlist:   allow,
		TrustedDirs: []string{h.trusted},
	}
}

// sub replaces placeholders in test commands: {bin} {trusted} {evil} {shim}
// {work} {home}.
func (h *host) sub(s string) string {
	return strings.NewReplacer("{bin}", h.bin, "{trusted}", h.trusted, "{evil}", h.evil,
		"{shim}", h.shim, "{work}", h.work, "{home}", h.home).Replace(s)
}
