package confine

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	RunHelperIfRequested()
	os.Exit(m.Run())
}

// realPath resolves a program name on the test's PATH to its real path.
func realPath(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s not installed", name)
	}
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// interp returns the ELF interpreter of a program.
func interp(t *testing.T, path string) string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				t.Fatal(err)
			}
			r, err := filepath.EvalSymlinks(string(bytes.TrimRight(b, "\x00")))
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
	}
	return ""
}

func requireLandlock(t *testing.T) {
	t.Helper()
	if v, err := ll.LandlockGetABIVersion(); err != nil || v < MinABI {
		t.Skipf("Landlock ABI %d (%v) below %d", v, err, MinABI)
	}
}

type run struct {
	stdout, stderr string
	code           int
	refused        []string
}

// runHelper starts the test binary as the helper with spec, as the daemon
// does, supervised, and waits for the tree.
func runHelper(t *testing.T, spec Spec, dir string) run {
	t.Helper()
	spec.Confine = true
	sup, err := NewSupervisor(&spec, SupervisorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	args, err := spec.Args()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/proc/self/exe", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	cmd.ExtraFiles = []*os.File{sup.ChildFile()}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	SetSysProcAttr(cmd.SysProcAttr)
	sup.Start()
	err = cmd.Start()
	sup.ReleaseChild()
	if err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	select {
	case <-sup.Done():
	case <-ctx.Done():
		t.Fatal("supervisor did not finish")
	}
	r := run{stdout: so.String(), stderr: se.String(), refused: sup.Refused()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestExecConfinement(t *testing.T) {
	requireLandlock(t)
	sh := realPath(t, "sh")
	ls := realPath(t, "ls")
	id := realPath(t, "id")
	ld := interp(t, sh)
	if ld == "" {
		t.Skip("sh is static")
	}
	dir := t.TempDir()
	base := Spec{
		Exec:         []File{{Path: sh}, {Path: ls}},
		Interpreters: []File{{Path: ld}},
		Write:        []string{dir},
	}
	for _, tc := range []struct {
		name        string
		script      string
		wantOut     string
		wantRefused string
		wantCode    int
	}{
		{name: "allowed program runs", script: "ls -d /", wantOut: "/\n"},
		{name: "other program refused", script: "id -u", wantRefused: id, wantCode: 126},
		{name: "absolute path refused", script: id + " -u", wantRefused: id, wantCode: 126},
		{name: "interpreter direct", script: ld + " " + id, wantRefused: ld + " (an ELF interpreter", wantCode: 126},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := base
			spec.Pipeline = [][]string{{sh, "-c", tc.script}}
			r := runHelper(t, spec, dir)
			if tc.wantOut != "" && r.stdout != tc.wantOut {
				t.Errorf("stdout %q, want %q (stderr %q)", r.stdout, tc.wantOut, r.stderr)
			}
			if r.code != tc.wantCode {
				t.Errorf("exit %d, want %d (stderr %q)", r.code, tc.wantCode, r.stderr)
			}
			if tc.wantRefused != "" {
				if len(r.refused) == 0 || !strings.HasPrefix(r.refused[0], tc.wantRefused) {
					t.Errorf("refused %q, want %q", r.refused, tc.wantRefused)
				}
				if !strings.Contains(r.stderr, "exec refused by policy: "+tc.wantRefused) {
					t.Errorf("stderr %q does not name %s", r.stderr, tc.wantRefused)
				}
			}
		})
	}
}

func TestPlantedProgramRefused(t *testing.T) {
	requireLandlock(t)
	sh := realPath(t, "sh")
	id := realPath(t, "id")
	ld := interp(t, sh)
	dir := t.TempDir()
	// A copy of a program in the writable workdir: neither its direct
	// exec nor a run through the interpreter.
	b, err := os.ReadFile(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "planted"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, script := range []string{"./planted", ld + " ./planted"} {
		r := runHelper(t, Spec{
			Pipeline:     [][]string{{sh, "-c", script}},
			Exec:         []File{{Path: sh}},
			Interpreters: []File{{Path: ld}},
			Write:        []string{dir},
		}, dir)
		if r.code != 126 || len(r.refused) == 0 {
			t.Errorf("%s: exit %d, refused %q, stderr %q", script, r.code, r.refused, r.stderr)
		}
	}
}

func TestWriteConfinement(t *testing.T) {
	requireLandlock(t)
	sh := realPath(t, "sh")
	ld := interp(t, sh)
	work, other := t.TempDir(), t.TempDir()
	r := runHelper(t, Spec{
		Pipeline: [][]string{{sh, "-c", `echo in > in.txt && echo ok; (echo out > ` + other + `/out.txt) 2>/dev/null || echo refused; : > /dev/null && echo null`}},
		Exec:     []File{{Path: sh}}, Interpreters: []File{{Path: ld}},
		Write: []string{work, "/dev/null"},
	}, work)
	if r.stdout != "ok\nrefused\nnull\n" {
		t.Fatalf("stdout %q stderr %q", r.stdout, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(other, "out.txt")); err == nil {
		t.Fatal("wrote outside the write roots")
	}
}

func TestHide(t *testing.T) {
	requireLandlock(t)
	sh := realPath(t, "sh")
	cat := realPath(t, "cat")
	ld := interp(t, sh)
	state := t.TempDir()
	secret := filepath.Join(state, "operator.token")
	if err := os.WriteFile(secret, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(cfg, []byte(`{"token":"s3cret"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	r := runHelper(t, Spec{
		Pipeline: [][]string{{sh, "-c", "cat " + secret + " " + cfg + " /proc/1/root" + secret + "; echo done"}},
		Exec:     []File{{Path: sh}, {Path: cat}}, Interpreters: []File{{Path: ld}},
		Write: []string{work}, Hide: []string{state, cfg},
	}, work)
	if strings.Contains(r.stdout+r.stderr, "s3cret") || !strings.HasSuffix(r.stdout, "done\n") {
		t.Fatalf("stdout %q stderr %q", r.stdout, r.stderr)
	}
	// The daemon's view is untouched.
	if b, _ := os.ReadFile(secret); string(b) != "s3cret" {
		t.Fatalf("secret changed outside: %q", b)
	}
}

func TestPipeline(t *testing.T) {
	requireLandlock(t)
	seq, wc, sh := realPath(t, "seq"), realPath(t, "wc"), realPath(t, "sh")
	ld := interp(t, seq)
	r := runHelper(t, Spec{
		Pipeline: [][]string{{seq, "1", "1000"}, {wc, "-l"}},
		Exec:     []File{{Path: seq}, {Path: wc}}, Interpreters: []File{{Path: ld}},
	}, t.TempDir())
	if strings.TrimSpace(r.stdout) != "1000" || r.code != 0 {
		t.Fatalf("stdout %q code %d stderr %q", r.stdout, r.code, r.stderr)
	}
	// A segment that may not run: the pipeline goes on without it and
	// the refusal is named.
	r = runHelper(t, Spec{
		Pipeline: [][]string{{seq, "1", "3"}, {sh, "-c", "cat"}},
		Exec:     []File{{Path: seq}}, Interpreters: []File{{Path: ld}},
	}, t.TempDir())
	if r.code != 126 || len(r.refused) == 0 || r.refused[0] != sh {
		t.Fatalf("code %d refused %q stderr %q", r.code, r.refused, r.stderr)
	}
}

func TestInodeBinding(t *testing.T) {
	requireLandlock(t)
	sh := realPath(t, "sh")
	ld := interp(t, sh)
	dir := t.TempDir()
	tool := filepath.Join(dir, "tool")
	if err := os.WriteFile(tool, []byte("#!"+sh+"\necho approved\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(tool, &st); err != nil {
		t.Fatal(err)
	}
	approved := File{Path: tool, Dev: st.Dev, Ino: st.Ino}
	spec := Spec{
		Pipeline: [][]string{{tool}},
		Exec:     []File{{Path: sh}, approved}, Interpreters: []File{{Path: ld}},
	}
	if r := runHelper(t, spec, dir); r.stdout != "approved\n" {
		t.Fatalf("approved file: stdout %q stderr %q", r.stdout, r.stderr)
	}
	// Renamed over after the approval: the path names another inode.
	swap := filepath.Join(dir, "swap")
	if err := os.WriteFile(swap, []byte("#!"+sh+"\necho swapped\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(swap, tool); err != nil {
		t.Fatal(err)
	}
	if r := runHelper(t, spec, dir); strings.Contains(r.stdout, "swapped") || r.code != 126 {
		t.Fatalf("swapped file ran: stdout %q code %d stderr %q", r.stdout, r.code, r.stderr)
	}
}

func TestShebangInterpreterRefused(t *testing.T) {
	requireLandlock(t)
	sh := realPath(t, "sh")
	perl := realPath(t, "perl")
	ld := interp(t, sh)
	dir := t.TempDir()
	script := filepath.Join(dir, "s.pl")
	if err := os.WriteFile(script, []byte("#!"+perl+"\nprint \"ran\\n\";\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := runHelper(t, Spec{
		Pipeline: [][]string{{sh, "-c", script}},
		Exec:     []File{{Path: sh}, {Path: script}}, Interpreters: []File{{Path: ld}},
	}, dir)
	if strings.Contains(r.stdout, "ran") || len(r.refused) == 0 || !strings.HasPrefix(r.refused[0], perl) {
		t.Fatalf("stdout %q refused %q stderr %q", r.stdout, r.refused, r.stderr)
	}
}

func TestProbe(t *testing.T) {
	requireLandlock(t)
	if err := Probe(context.Background(), "/proc/self/exe"); err != nil {
		t.Fatalf("Probe: %v", err)
	}
	// A helper that does not confine is found out.
	if err := Probe(context.Background(), "/bin/true"); err == nil {
		t.Fatal("Probe accepted a helper that confines nothing")
	}
}

// TestPipelineSignalsStayDefault: the helper outlives the terminal's
// signals, but its children keep the default dispositions: `yes | head`
// ends at once, yes killed by SIGPIPE without a word.
func TestPipelineSignalsStayDefault(t *testing.T) {
	requireLandlock(t)
	yes, head := realPath(t, "yes"), realPath(t, "head")
	ld := interp(t, yes)
	r := runHelper(t, Spec{
		Pipeline: [][]string{{yes}, {head, "-n", "1"}},
		Exec:     []File{{Path: yes}, {Path: head}}, Interpreters: []File{{Path: ld}},
	}, t.TempDir())
	if r.stdout != "y\n" || r.code != 0 || r.stderr != "" {
		t.Fatalf("stdout %q code %d stderr %q", r.stdout, r.code, r.stderr)
	}
}

// TestExecThroughProcRefused: /proc/self names the caller's files, and the
// supervisor would resolve it as its own: an exec through /proc (a path,
// a link to it, a descriptor link) is refused, so the interpreter cannot
// be reached that way.
func TestExecThroughProcRefused(t *testing.T) {
	requireLandlock(t)
	sh, id := realPath(t, "sh"), realPath(t, "id")
	ld := interp(t, sh)
	dir := t.TempDir()
	if err := os.Symlink("/proc/self/cwd/ldso", filepath.Join(dir, "viaproc")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ld, filepath.Join(dir, "ldso")); err != nil {
		t.Fatal(err)
	}
	for _, script := range []string{
		"cd " + filepath.Dir(ld) + " && /proc/self/cwd/" + filepath.Base(ld) + " " + id,
		"./viaproc " + id,
		"exec 9<" + ld + "; /proc/self/fd/9 " + id,
		"./ldso " + id,
	} {
		r := runHelper(t, Spec{
			Pipeline: [][]string{{sh, "-c", script}},
			Exec:     []File{{Path: sh}}, Interpreters: []File{{Path: ld}},
			Write: []string{dir},
		}, dir)
		if r.code != 126 || len(r.refused) == 0 || strings.Contains(r.stdout, "uid=") {
			t.Errorf("%s: code %d refused %q stdout %q stderr %q", script, r.code, r.refused, r.stdout, r.stderr)
		}
	}
}

// TestLayout: write roots are noexec; what may run beneath them is
// read-only; the parents of the hidden state beneath them cannot be moved
// aside; set-user-ID bits cannot be set; root keeps no capability that
// steps around the confinement.
func TestLayout(t *testing.T) {
	requireLandlock(t)
	sh, mv, chmod := realPath(t, "sh"), realPath(t, "mv"), realPath(t, "chmod")
	ld := interp(t, sh)
	work := t.TempDir()
	state := filepath.Join(work, "a", "b", "state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "secret"), []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	tool := filepath.Join(work, "tool")
	if err := os.WriteFile(tool, []byte("#!"+sh+"\necho tool\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	script := `
while read -r l; do case "$l" in *" ` + work + ` "*noexec*) echo noexec;; esac; done </proc/self/mountinfo
./tool
test -e a/b/state/secret && echo state-visible
(echo x >> tool) 2>/dev/null || echo tool-ro
mv tool tool2 2>/dev/null || echo tool-pinned
mv a a2 2>/dev/null || echo a-pinned
mv a/b a/b2 2>/dev/null || echo b-pinned
chmod u+s f 2>/dev/null || echo no-setuid
chmod +x f && echo chmod-ok
while read -r k v; do case "$k" in CapBnd:) echo "bnd=$v";; esac; done </proc/self/status
`
	r := runHelper(t, Spec{
		Pipeline: [][]string{{sh, "-c", script}},
		Exec:     []File{{Path: sh}, {Path: mv}, {Path: chmod}, {Path: tool}}, Interpreters: []File{{Path: ld}},
		Write: []string{work, "/dev/null"}, Hide: []string{state}, Workdir: work,
	}, work)
	for _, want := range []string{"noexec", "tool\n", "tool-ro", "tool-pinned", "a-pinned", "b-pinned", "no-setuid", "chmod-ok"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q in stdout %q (stderr %q)", want, r.stdout, r.stderr)
		}
	}
	if strings.Contains(r.stdout, "state-visible") {
		t.Error("the hidden state two levels beneath the workdir is visible")
	}
	if _, err := os.Stat(filepath.Join(work, "a")); err != nil {
		t.Errorf("a was moved: %v", err)
	}
	if os.Geteuid() == 0 {
		// CAP_DAC_READ_SEARCH (2), CAP_SYS_PTRACE (19), CAP_SYS_ADMIN (21).
		var bnd uint64
		for _, l := range strings.Split(r.stdout, "\n") {
			if v, ok := strings.CutPrefix(l, "bnd="); ok {
				fmt.Sscanf(v, "%x", &bnd)
			}
		}
		if bnd == 0 || bnd&(1<<2|1<<19|1<<21) != 0 {
			t.Errorf("root's bounding set %#x keeps capabilities that step around the confinement", bnd)
		}
	}
}

// TestLinkedExecutableDoesNotRun: an allowed file beneath a write root
// that has another name there could be rewritten through that name
// (read-only binds guard names, not inodes): it does not run.
func TestLinkedExecutableDoesNotRun(t *testing.T) {
	requireLandlock(t)
	sh := realPath(t, "sh")
	ld := interp(t, sh)
	work := t.TempDir()
	tool := filepath.Join(work, "tool")
	if err := os.WriteFile(tool, []byte("#!"+sh+"\necho tool\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(tool, filepath.Join(work, "alias")); err != nil {
		t.Fatal(err)
	}
	r := runHelper(t, Spec{
		Pipeline: [][]string{{sh, "-c", "./tool"}},
		Exec:     []File{{Path: sh}, {Path: tool}}, Interpreters: []File{{Path: ld}},
		Write: []string{work}, Workdir: work,
	}, work)
	if strings.Contains(r.stdout, "tool") || !strings.Contains(r.stderr, "another name") {
		t.Fatalf("stdout %q stderr %q", r.stdout, r.stderr)
	}
}

// TestWriteRootMovedAfterCheck: a write root is granted only at the real
// path the daemon checked. A root whose path leads elsewhere when the
// helper makes its rule (a directory swapped for a link to /etc by a
// command racing the check; here a link from the start) makes the helper
// refuse to run, and nothing is written where the link leads.
func TestWriteRootMovedAfterCheck(t *testing.T) {
	requireLandlock(t)
	sh := realPath(t, "sh")
	ld := interp(t, sh)
	work, elsewhere := t.TempDir(), t.TempDir()
	link := filepath.Join(work, "p")
	if err := os.Symlink(elsewhere, link); err != nil {
		t.Fatal(err)
	}
	r := runHelper(t, Spec{
		Pipeline: [][]string{{sh, "-c", "echo planted > " + filepath.Join(link, "x") + " && echo wrote"}},
		Exec:     []File{{Path: sh}}, Interpreters: []File{{Path: ld}},
		Write: []string{link, "/dev/null"},
	}, work)
	if r.code == 0 || strings.Contains(r.stdout, "wrote") || !strings.Contains(r.stderr, "changed since it was checked") {
		t.Fatalf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(elsewhere, "x")); err == nil {
		t.Fatal("wrote through a write root that led elsewhere")
	}
}
