package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"

	"github.com/execmesh/execmesh/confine"
)

// The class these tests close: an allowlisted program starts, loads or
// writes something the allowlist never allowed, through its options,
// config files, helpers or the ELF interpreter. Each attack runs with the
// kernel confinement on and with it turned off: it must be refused by
// the kernel or asked for, and never run.

// confineDaemon starts `execmesh up` in allowlist mode with confinement
// mode ("auto" or "off") and the given allowlist for agent main.
func confineDaemon(t *testing.T, mode string, exec map[string]any, allowlist ...string) *daemonProc {
	t.Helper()
	ex := map[string]any{"security": "allowlist", "ask": "on-miss", "confine": mode}
	for k, v := range exec {
		ex[k] = v
	}
	d := startDaemon(t, "up", map[string]any{"tools": map[string]any{"exec": ex}})
	entries := make([]map[string]string, 0, len(allowlist))
	for _, p := range allowlist {
		entries = append(entries, map[string]string{"pattern": p})
	}
	b, _ := json.Marshal(map[string]any{"version": 1, "agents": map[string]any{"main": map[string]any{"allowlist": entries}}})
	if err := os.WriteFile(filepath.Join(d.stateDir, "exec-approvals.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	h := httpGetJSON(t, d.url+"/healthz")
	conf, _ := h["confinement"].(map[string]any)
	want := "landlock"
	if mode == "off" {
		want = "ask"
	}
	if conf["mode"] != want {
		t.Fatalf("healthz confinement %v, want mode %s", h["confinement"], want)
	}
	return d
}

func requireLandlock(t *testing.T) {
	t.Helper()
	if v, err := ll.LandlockGetABIVersion(); err != nil || v < confine.MinABI {
		t.Fatalf("this machine's kernel must have Landlock ABI >= %d (got %d, %v)", confine.MinABI, v, err)
	}
}

// realBin is the real path of a program the attack needs.
func realBin(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is needed (scripts/ensure-deps.sh installs it): %v", name, err)
	}
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func outText(res map[string]any) string {
	content, _ := res["content"].([]any)
	if len(content) == 0 {
		return ""
	}
	first, _ := content[0].(map[string]any)
	s, _ := first["text"].(string)
	return s
}

func outStatus(res map[string]any) string {
	d, _ := res["details"].(map[string]any)
	s, _ := d["status"].(string)
	return s
}

// staticProgram builds a statically linked program that creates the file
// named by its first argument.
func staticProgram(t *testing.T, dir string) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "main.go")
	if err := os.WriteFile(src, []byte("package main\nimport \"os\"\nfunc main() { os.WriteFile(os.Args[1], nil, 0o644) }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "static")
	cmd := exec.Command("go", "build", "-o", out, src)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building a static program: %v\n%s", err, b)
	}
	return out
}

func TestConfineAttacks(t *testing.T) {
	requireLandlock(t)
	for _, mode := range []string{"auto", "off"} {
		t.Run(mode, func(t *testing.T) {
			work := t.TempDir()
			marker := filepath.Join(work, "MARKER")
			write := func(name, body string, mode os.FileMode) {
				t.Helper()
				if err := os.WriteFile(filepath.Join(work, name), []byte(body), mode); err != nil {
					t.Fatal(err)
				}
			}
			write("evil", "#!/bin/sh\ntouch "+marker+"\n", 0o755)
			write("f", "hello\n", 0o644)
			write("Makefile", "all:\n\t./evil\n", 0o644)
			write("ssh_config", "Host *\n  ProxyCommand ./evil\n", 0o644)
			write("tool.pl", "#!"+realBin(t, "perl")+"\nopen(F, '>', '"+marker+"');\n", 0o755)
			if err := os.Mkdir(filepath.Join(work, "bin"), 0o755); err != nil {
				t.Fatal(err)
			}
			write("bin/git-evil", "#!/bin/sh\ntouch "+marker+"\n", 0o755)
			var big strings.Builder
			for i := 0; i < 60000; i++ {
				fmt.Fprintf(&big, "%d\n", (i*7919)%60000)
			}
			write("big", big.String(), 0o644)
			static := staticProgram(t, work)
			ld := "/lib64/ld-linux-x86-64.so.2"

			allow := []string{
				realBin(t, "ssh"), realBin(t, "zip"), realBin(t, "make"), realBin(t, "sort"),
				realBin(t, "git"), realBin(t, "find"), realBin(t, "cat"), filepath.Join(work, "tool.pl"),
			}
			d := confineDaemon(t, mode, map[string]any{"pathPrepend": []string{filepath.Join(work, "bin")}}, allow...)
			token := d.operatorToken()

			for _, c := range []struct{ name, command string }{
				{"ssh ProxyCommand", "ssh -o ProxyCommand=./evil -o BatchMode=yes x"},
				{"ssh planted config", "ssh -F ssh_config -o BatchMode=yes x"},
				{"zip -TT", "zip -T -TT ./evil z.zip f"},
				{"zip --unzip-command", "zip -T --unzip-command=./evil z2.zip f"},
				{"make --eval", "make --eval=x:;./evil x"},
				{"make --ev abbreviated", "make --ev=x:;./evil x"},
				{"make planted Makefile", "make"},
				{"sort --compress-prog", "sort --compress-prog=./evil -S 64K -T . big"},
				{"git alias", "git -c alias.x=!./evil x"},
				{"find -exec", "find . -maxdepth 0 -exec ./evil {} +"},
				{"find -exec sh -c", "find . -maxdepth 0 -exec sh -c ./evil {} +"},
				{"helper on a writable PATH dir", "git evil"},
				{"ld.so direct", "find . -maxdepth 0 -exec " + ld + " " + realBin(t, "touch") + " " + marker + " {} +"},
				{"static program in workdir", "find . -maxdepth 0 -exec " + static + " " + marker + " {} +"},
				{"shebang interpreter not allowed", filepath.Join(work, "tool.pl")},
			} {
				t.Run(c.name, func(t *testing.T) {
					os.Remove(marker)
					res := d.invoke("exec", map[string]any{"command": c.command, "workdir": work, "timeout": 30, "yieldMs": 30000})
					status, text := outStatus(res), outText(res)
					time.Sleep(50 * time.Millisecond) // a stray background child would have written by now
					mustNotExist(t, marker, c.command)
					switch {
					case status == "approval-pending":
						// Asked: the operator sees it before anything runs.
					case mode == "off":
						t.Errorf("%s ran without approval with no kernel confinement: %s %q", c.command, status, text)
					case !strings.Contains(text, "exec refused by policy") && !strings.Contains(text, "Permission denied"):
						// A program that checks access(X_OK) first (make)
						// finds the planted file not executable (noexec)
						// and never calls exec: "Permission denied".
						t.Errorf("%s: status %s, output shows no refused exec: %q", c.command, status, text)
					}
				})
			}

			t.Run("operator token", func(t *testing.T) {
				res := d.invoke("exec", map[string]any{"command": "cat " + filepath.Join(d.stateDir, "operator.token"), "workdir": work})
				if text := outText(res); strings.Contains(text, token) {
					t.Fatalf("an allowlisted cat read the operator token: %q", text)
				}
			})
		})
	}
}

// TestConfineAllowedCommandsWork: with the confinement on, what the
// allowlist and the safe bins allow keeps working, and it writes only
// where it may.
func TestConfineAllowedCommandsWork(t *testing.T) {
	requireLandlock(t)
	work := t.TempDir()
	git := realBin(t, "git")
	for _, args := range [][]string{{"init", "-q"}, {"-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "first commit"}} {
		cmd := exec.Command(git, args...)
		cmd.Dir = work
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(work, "f"), []byte("a\nb\nc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	d := confineDaemon(t, "auto", nil, git, realBin(t, "ls"), realBin(t, "cat"), realBin(t, "cp"))
	for _, c := range []struct{ command, want string }{
		{"git log --oneline", "first commit"},
		{"ls | head -n 1", "f"},
		{"cat f | wc -l", "3"},
		{"cp f copy", ""},
	} {
		res := d.invoke("exec", map[string]any{"command": c.command, "workdir": work})
		if st, text := outStatus(res), outText(res); st != "completed" || !strings.Contains(text, c.want) || strings.Contains(text, "exited with code") {
			t.Errorf("%s: %s %q", c.command, st, text)
		}
	}
	if _, err := os.Stat(filepath.Join(work, "copy")); err != nil {
		t.Errorf("cp in the workdir: %v", err)
	}
	res := d.invoke("exec", map[string]any{"command": "cp f " + filepath.Join(outside, "copy"), "workdir": work})
	if _, err := os.Stat(filepath.Join(outside, "copy")); err == nil {
		t.Errorf("cp wrote outside the workdir: %q", outText(res))
	}
	// TMPDIR is the session's own, writable, and gone with it.
	res = d.invoke("exec", map[string]any{"command": "cp f " + "/tmp/execmesh-confine-test-" + filepath.Base(work), "workdir": work})
	if _, err := os.Stat("/tmp/execmesh-confine-test-" + filepath.Base(work)); err == nil {
		t.Errorf("cp wrote into /tmp outside its TMPDIR: %q", outText(res))
	}
}

// TestConfineNonRootDaemon: the daemon as an ordinary user (as `execmesh
// up` runs on a laptop) holds the same confinement, through a user
// namespace.
func TestConfineNonRootDaemon(t *testing.T) {
	requireLandlock(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to start the daemon as another user")
	}
	bin, err := execmeshBinary()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "execmesh-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	nbin := filepath.Join(dir, "execmesh")
	if err := os.WriteFile(nbin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	state, work := filepath.Join(dir, "state"), filepath.Join(dir, "work")
	for _, p := range []string{state, work} {
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	appr, _ := json.Marshal(map[string]any{"version": 1, "agents": map[string]any{"main": map[string]any{"allowlist": []map[string]string{{"pattern": realBin(t, "cat")}, {"pattern": realBin(t, "find")}}}}})
	if err := os.WriteFile(filepath.Join(state, "exec-approvals.json"), appr, 0o600); err != nil {
		t.Fatal(err)
	}
	_ = os.Chown(filepath.Join(state, "exec-approvals.json"), 65534, 65534)
	listen, natsAddr := freeAddr(t), freeAddr(t)
	cmd := exec.Command(nbin, "up", "--state-dir", state, "--listen", listen, "--nats-listen", natsAddr)
	cmd.Dir = work
	cmd.Env = []string{"HOME=" + dir, "PATH=/usr/local/bin:/usr/bin:/bin", "SHELL=/bin/sh"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var log strings.Builder
	cmd.Stderr = &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	d := &daemonProc{t: t, url: "http://" + listen, stateDir: state}
	waitHealthy(t, d.url, done, stringer(func() string { return log.String() }))
	h := httpGetJSON(t, d.url+"/healthz")
	if conf, _ := h["confinement"].(map[string]any); conf["mode"] != "landlock" {
		t.Fatalf("non-root daemon's confinement: %v", h["confinement"])
	}
	token, err := os.ReadFile(filepath.Join(state, "operator.token"))
	if err != nil {
		t.Fatal(err)
	}
	res := d.invoke("exec", map[string]any{"command": "cat " + filepath.Join(state, "operator.token"), "workdir": work})
	if strings.Contains(outText(res), strings.TrimSpace(string(token))) {
		t.Fatalf("cat read the operator token: %q", outText(res))
	}
	marker := filepath.Join(work, "MARKER")
	res = d.invoke("exec", map[string]any{"command": "find . -maxdepth 0 -exec " + realBin(t, "touch") + " " + marker + " {} +", "workdir": work})
	mustNotExist(t, marker, "find -exec touch")
	if st := outStatus(res); st != "approval-pending" && !strings.Contains(outText(res), "exec refused by policy") {
		t.Fatalf("find -exec touch: %s %q", st, outText(res))
	}
	// The daemon is not dumpable: its /proc files belong to root, so a
	// process of the same user cannot read its memory or environment.
	var st syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/environ", cmd.Process.Pid), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 0 {
		t.Fatalf("/proc/<daemon>/environ belongs to uid %d: the daemon is dumpable", st.Uid)
	}
}

// stringer adapts a function to fmt.Stringer.
type stringer func() string

func (s stringer) String() string { return s() }

// TestConfinePlantedUnderPattern: an allowlist pattern over a directory a
// command may write allows nothing there: a program one session plants
// where the pattern points does not run in the next.
func TestConfinePlantedUnderPattern(t *testing.T) {
	requireLandlock(t)
	work := t.TempDir()
	marker := filepath.Join(work, "MARKER")
	d := confineDaemon(t, "auto", nil, filepath.Join(work, "bin", "*"), realBin(t, "mkdir"), realBin(t, "cp"))
	src := filepath.Join(t.TempDir(), "evil")
	if err := os.WriteFile(src, []byte("#!/bin/sh\ntouch "+marker+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"mkdir bin", "cp " + src + " bin/evil"} {
		if res := d.invoke("exec", map[string]any{"command": c, "workdir": work}); outStatus(res) != "completed" {
			t.Fatalf("%s: %s %q", c, outStatus(res), outText(res))
		}
	}
	res := d.invoke("exec", map[string]any{"command": filepath.Join(work, "bin", "evil"), "workdir": work})
	mustNotExist(t, marker, "a program planted under an allowlist pattern")
	if st, text := outStatus(res), outText(res); st != "approval-pending" && !strings.Contains(text, "Permission denied") && !strings.Contains(text, "refused by policy") {
		t.Fatalf("planted program: %s %q", st, text)
	}
}

// TestConfineWorkdirNotWhereCodeRunsLater: a confined command may write
// beneath its workdir, so a workdir in the system's directories (or
// above them), or in a dot-directory of the home, is refused before
// anything runs: an allowlisted git told to write its config into
// /etc would otherwise leave what cron, a profile or the loader runs
// later, outside any policy.
func TestConfineWorkdirNotWhereCodeRunsLater(t *testing.T) {
	requireLandlock(t)
	d := confineDaemon(t, "auto", nil, realBin(t, "git"))
	probe := "/etc/execmesh-probe-" + strconv.Itoa(os.Getpid()) + ".cfg"
	t.Cleanup(func() { os.Remove(probe) })
	for _, workdir := range []string{"/etc", "/var", "/usr/local"} {
		b, _ := json.Marshal(map[string]any{"tool": "exec", "args": map[string]any{"command": "git config --file " + probe + " a.b c", "workdir": workdir, "timeout": 30}})
		res, err := http.Post(d.url+"/tools/invoke", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "Security Violation: workdir "+workdir) {
			t.Errorf("workdir %s: %d %s", workdir, res.StatusCode, body)
		}
		mustNotExist(t, probe, "git config --file "+probe)
	}
	// A project directory works as before.
	work := t.TempDir()
	res := d.invoke("exec", map[string]any{"command": "git config --file " + filepath.Join(work, "x.cfg") + " a.b c", "workdir": work, "timeout": 30})
	if outStatus(res) != "completed" {
		t.Fatalf("git config in a project directory: %s %q", outStatus(res), outText(res))
	}
}
