package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// These tests need no real bwrap: a fake bwrap script stands in for the
// probe, and the argv is only inspected. They do not call t.Parallel, so no
// other test forks while a script is being written (ETXTBSY).

// fakeBwrap writes an executable shell script that acts as bwrap.
func fakeBwrap(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bwrap")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// fakeRuntime returns a bwrap Runtime on a fake bwrap that always succeeds,
// with a fresh workspace root, and the root.
func fakeRuntime(t *testing.T, cfg Config) (Runtime, string) {
	t.Helper()
	cfg.Mode = ModeBwrap
	cfg.BwrapPath = fakeBwrap(t, "exit 0")
	if cfg.Workspace == "" {
		cfg.Workspace = filepath.Join(t.TempDir(), "workspace")
	}
	rt, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	root, err := filepath.EvalSymlinks(filepath.Dir(cfg.Workspace))
	if err != nil {
		t.Fatal(err)
	}
	return rt, filepath.Join(root, filepath.Base(cfg.Workspace))
}

// setenvs collects the --setenv K V arguments of argv.
func setenvs(argv []string) map[string]string {
	m := map[string]string{}
	for i := 0; i+2 < len(argv); i++ {
		if argv[i] == "--setenv" {
			m[argv[i+1]] = argv[i+2]
			i += 2
		}
	}
	return m
}

// index returns where seq starts in argv, or -1.
func index(argv []string, seq ...string) int {
	for i := 0; i+len(seq) <= len(argv); i++ {
		if slices.Equal(argv[i:i+len(seq)], seq) {
			return i
		}
	}
	return -1
}

func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig("/var/lib/execmesh")
	if c.Mode != ModeOff || c.Network || c.Workspace != "/var/lib/execmesh/workspace" {
		t.Fatalf("DefaultConfig = %+v", c)
	}
	if !slices.Equal(c.Hide, []string{"/run", "/var/lib/execmesh"}) {
		t.Fatalf("Hide = %q, want /run and the state dir", c.Hide)
	}
	// A fresh value each call: changing one must not change the next.
	c.Hide[0] = "x"
	if DefaultConfig("/var/lib/execmesh").Hide[0] != "/run" {
		t.Fatal("DefaultConfig shares its slices")
	}
}

func TestOff(t *testing.T) {
	for _, mode := range []string{ModeOff, ""} {
		rt, err := New(Config{Mode: mode, Workspace: "/nonexistent/dir/ws"})
		if err != nil {
			t.Fatalf("New(mode %q): %v", mode, err)
		}
		if rt.Mode() != ModeOff || rt.Available() != nil {
			t.Fatalf("mode %q: Mode %q, Available %v", mode, rt.Mode(), rt.Available())
		}
		p, err := rt.Prepare(Request{Command: "ls", Workdir: "/srv"})
		if err != nil || p.Argv != nil || p.Env != nil || p.Workdir != "/srv" {
			t.Fatalf("Prepare = %+v, %v; want nil Argv and the workdir unchanged", p, err)
		}
		if ws, err := rt.Workspace("main"); ws != "" || err != nil {
			t.Fatalf("Workspace = %q, %v", ws, err)
		}
	}
}

func TestNewErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	bw := fakeBwrap(t, "exit 0")
	ws := filepath.Join(dir, "ws")
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"unknown mode", Config{Mode: "docker"}, []string{`sandbox.mode "docker"`, "off", "bwrap"}},
		{"workspace is a file", Config{Mode: ModeBwrap, BwrapPath: bw, Workspace: file},
			[]string{"sandbox.workspace", file, "not a directory"}},
		{"workspace parent missing", Config{Mode: ModeBwrap, BwrapPath: bw, Workspace: filepath.Join(dir, "no", "ws")},
			[]string{"sandbox.workspace", "does not exist"}},
		{"workspace empty", Config{Mode: ModeBwrap, BwrapPath: bw}, []string{"sandbox.workspace"}},
		{"missing read-only bind", Config{Mode: ModeBwrap, BwrapPath: bw, Workspace: ws,
			ReadOnlyBinds: []string{dir, filepath.Join(dir, "missing") + ":/opt/x"}},
			[]string{"sandbox.readOnlyBinds[1]", filepath.Join(dir, "missing")}},
		{"missing read-write bind", Config{Mode: ModeBwrap, BwrapPath: bw, Workspace: ws,
			ReadWriteBinds: []string{"/nonexistent-execmesh-bind"}},
			[]string{"sandbox.readWriteBinds[0]", "/nonexistent-execmesh-bind"}},
		{"relative bind", Config{Mode: ModeBwrap, BwrapPath: bw, Workspace: ws, ReadOnlyBinds: []string{"data"}},
			[]string{"sandbox.readOnlyBinds[0]", "absolute"}},
		{"relative hide", Config{Mode: ModeBwrap, BwrapPath: bw, Workspace: ws, Hide: []string{"state"}},
			[]string{"sandbox.hide[0]"}},
		{"bad env name", Config{Mode: ModeBwrap, BwrapPath: bw, Workspace: ws, Env: map[string]string{"A=B": "x"}},
			[]string{"sandbox.env", `"A=B"`}},
		{"bwrap missing", Config{Mode: ModeBwrap, BwrapPath: filepath.Join(dir, "no-bwrap"), Workspace: ws},
			[]string{"sandbox.bwrapPath", ErrNotInstalled.Error()}},
		{"bwrap not executable", Config{Mode: ModeBwrap, BwrapPath: file, Workspace: ws},
			[]string{"sandbox.bwrapPath", ErrNotInstalled.Error()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt, err := New(tt.cfg)
			if err == nil {
				t.Fatalf("New succeeded (%v), want an error", rt)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}

	t.Run("bwrap missing is the sentinel", func(t *testing.T) {
		_, err := New(Config{Mode: ModeBwrap, BwrapPath: filepath.Join(dir, "no-bwrap"), Workspace: ws})
		if !errors.Is(err, ErrNotInstalled) {
			t.Fatalf("error %v is not ErrNotInstalled", err)
		}
		want := `bubblewrap (bwrap) is not installed; install the Debian/Ubuntu package "bubblewrap" or set sandbox.mode=off`
		if ErrNotInstalled.Error() != want {
			t.Fatalf("ErrNotInstalled = %q", ErrNotInstalled)
		}
		t.Setenv("PATH", dir) // no bwrap there
		_, err = New(Config{Mode: ModeBwrap, Workspace: ws})
		if err != ErrNotInstalled {
			t.Fatalf("lookup in PATH: error %v, want exactly ErrNotInstalled", err)
		}
	})

	t.Run("every problem at once", func(t *testing.T) {
		_, err := New(Config{Mode: ModeBwrap, BwrapPath: filepath.Join(dir, "no-bwrap"), Workspace: file,
			ReadOnlyBinds: []string{"/nonexistent-execmesh-bind"}})
		for _, w := range []string{"sandbox.workspace", "sandbox.readOnlyBinds[0]", "sandbox.bwrapPath"} {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("error %v does not name %s", err, w)
			}
		}
		if !errors.Is(err, ErrNotInstalled) {
			t.Errorf("joined error hides ErrNotInstalled")
		}
	})
}

func TestAvailableProbe(t *testing.T) {
	t.Run("unusable", func(t *testing.T) {
		bw := fakeBwrap(t, `echo "bwrap: No permissions to create new namespace" >&2; exit 1`)
		rt, err := New(Config{Mode: ModeBwrap, BwrapPath: bw, Workspace: filepath.Join(t.TempDir(), "ws")})
		if err != nil {
			t.Fatal(err)
		}
		err = rt.Available()
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "No permissions to create new namespace") {
			t.Fatalf("Available = %v, want ErrUnavailable with bwrap's message", err)
		}
		if _, perr := rt.Prepare(Request{Command: "true"}); !errors.Is(perr, ErrUnavailable) {
			t.Fatalf("Prepare = %v, want the probe error", perr)
		}
	})

	t.Run("cached per runtime", func(t *testing.T) {
		count := filepath.Join(t.TempDir(), "count")
		bw := fakeBwrap(t, `echo run >> '`+count+`'; exit 0`)
		cfg := Config{Mode: ModeBwrap, BwrapPath: bw, Workspace: filepath.Join(t.TempDir(), "ws")}
		rt, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if err := rt.Available(); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := rt.Prepare(Request{Command: "true"}); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(count); string(b) != "run\n" {
			t.Fatalf("probe ran %d times, want once", strings.Count(string(b), "run"))
		}
		// A second Runtime probes again.
		rt2, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := rt2.Available(); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(count); strings.Count(string(b), "run") != 2 {
			t.Fatalf("second runtime did not probe: %q", b)
		}
	})

	t.Run("removed after New", func(t *testing.T) {
		bw := fakeBwrap(t, "exit 0")
		rt, err := New(Config{Mode: ModeBwrap, BwrapPath: bw, Workspace: filepath.Join(t.TempDir(), "ws")})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(bw); err != nil {
			t.Fatal(err)
		}
		if err := rt.Available(); !errors.Is(err, ErrNotInstalled) {
			t.Fatalf("Available = %v, want ErrNotInstalled", err)
		}
	})
}

func TestWorkspace(t *testing.T) {
	rt, root := fakeRuntime(t, Config{})
	ws, err := rt.Workspace("agent-1")
	if err != nil {
		t.Fatal(err)
	}
	if ws != filepath.Join(root, "agent-1") {
		t.Fatalf("Workspace = %q, want %q", ws, filepath.Join(root, "agent-1"))
	}
	for _, p := range []string{root, ws} {
		fi, err := os.Stat(p)
		if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v %v, want a 0700 directory", p, fi.Mode(), err)
		}
	}
	if def, err := rt.Workspace(""); err != nil || def != filepath.Join(root, DefaultAgentID) {
		t.Fatalf("Workspace(\"\") = %q, %v", def, err)
	}
	for _, bad := range []string{"..", "../x", "a/b", ".hidden", "-x", "a b", strings.Repeat("a", 129)} {
		if _, err := rt.Workspace(bad); !errors.Is(err, ErrInvalidAgentID) {
			t.Errorf("Workspace(%q) = %v, want ErrInvalidAgentID", bad, err)
		}
		if _, err := rt.Prepare(Request{AgentID: bad, Command: "true"}); !errors.Is(err, ErrInvalidAgentID) {
			t.Errorf("Prepare(agent %q) = %v, want ErrInvalidAgentID", bad, err)
		}
	}
	// A symlink in place of an agent's workspace could aim the read-write
	// bind anywhere.
	if err := os.Symlink(t.TempDir(), filepath.Join(root, "linked")); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Workspace("linked"); err == nil {
		t.Fatal("Workspace accepted a symlink")
	}
}

func TestArgv(t *testing.T) {
	rt, root := fakeRuntime(t, Config{Env: map[string]string{"FOO": "cfg", "BAR": "cfg", PrependPathVar: "/evil"}})
	ws := filepath.Join(root, "main")

	t.Run("env PATH via variable", func(t *testing.T) { // spec case 52
		p, err := rt.Prepare(Request{Command: "echo hello", Env: map[string]string{"PATH": "/custom/bin:/usr/local/bin:/usr/bin"}})
		if err != nil {
			t.Fatal(err)
		}
		if index(p.Argv, "--setenv", PrependPathVar, "/custom/bin:/usr/local/bin:/usr/bin") < 0 {
			t.Errorf("argv lacks --setenv %s: %q", PrependPathVar, p.Argv)
		}
		want := `export PATH="${OPENCLAW_PREPEND_PATH}:$PATH"; unset OPENCLAW_PREPEND_PATH; echo hello`
		if last := p.Argv[len(p.Argv)-1]; last != want {
			t.Errorf("last arg = %q, want %q", last, want)
		}
		if env := setenvs(p.Argv); env["PATH"] != DefaultPath {
			t.Errorf("PATH = %q, want %q (the request PATH goes through the variable)", env["PATH"], DefaultPath)
		}
	})

	t.Run("PATH value never in the command text", func(t *testing.T) { // case 53
		evil := "$(touch /tmp/x)"
		p, err := rt.Prepare(Request{Command: "echo hello", Env: map[string]string{"PATH": evil}})
		if err != nil {
			t.Fatal(err)
		}
		if last := p.Argv[len(p.Argv)-1]; strings.Contains(last, "touch") {
			t.Errorf("command text contains the PATH value: %q", last)
		}
		n := 0
		for _, a := range p.Argv {
			if strings.Contains(a, evil) {
				n++
			}
		}
		if n != 1 || setenvs(p.Argv)[PrependPathVar] != evil {
			t.Errorf("PATH value appears %d times, want once, as %s: %q", n, PrependPathVar, p.Argv)
		}
	})

	t.Run("no PATH", func(t *testing.T) { // case 54
		if err := os.Mkdir(filepath.Join(ws, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
		p, err := rt.Prepare(Request{Command: "echo hello", Workdir: "sub"})
		if err != nil {
			t.Fatal(err)
		}
		n := len(p.Argv)
		if !slices.Equal(p.Argv[n-3:], []string{"/bin/sh", "-lc", "echo hello"}) {
			t.Errorf("argv ends %q, want /bin/sh -lc and the bare command", p.Argv[n-3:])
		}
		if index(p.Argv, "--chdir", filepath.Join(ws, "sub"), "--") < 0 {
			t.Errorf("argv lacks --chdir to the workdir: %q", p.Argv)
		}
		if _, ok := setenvs(p.Argv)[PrependPathVar]; ok {
			t.Errorf("%s set without PATH or pathPrepend", PrependPathVar)
		}
		if p.Workdir != filepath.Join(ws, "sub") || p.DisplayCwd != p.Workdir {
			t.Errorf("Workdir %q DisplayCwd %q", p.Workdir, p.DisplayCwd)
		}
		if !slices.Equal(p.Env, []string{"PATH=" + DefaultPath}) {
			t.Errorf("Env = %q", p.Env)
		}
	})

	t.Run("layout", func(t *testing.T) {
		p, err := rt.Prepare(Request{Command: "true"})
		if err != nil {
			t.Fatal(err)
		}
		a := p.Argv
		for _, seq := range [][]string{
			{"--ro-bind", "/", "/"}, {"--dev", "/dev"}, {"--proc", "/proc"}, {"--tmpfs", "/tmp"},
			{"--unshare-pid"}, {"--unshare-ipc"}, {"--unshare-uts"}, {"--unshare-net"},
			{"--die-with-parent"}, {"--new-session"}, {"--clearenv"},
		} {
			if index(a, seq...) < 0 {
				t.Errorf("argv lacks %q: %q", seq, a)
			}
		}
		tmp, bind := index(a, "--tmpfs", "/tmp"), index(a, "--bind", ws, ws)
		mask, ro := index(a, "--tmpfs", root), index(a, "--remount-ro", root)
		if !(tmp < mask && mask < bind && bind < ro) {
			t.Errorf("mount order: /tmp %d, root mask %d, workspace bind %d, remount %d", tmp, mask, bind, ro)
		}
		if index(a, "--clearenv") > index(a, "--setenv") {
			t.Error("--setenv before --clearenv")
		}
		env := setenvs(a)
		want := map[string]string{"PATH": DefaultPath, "HOME": ws, "FOO": "cfg", "BAR": "cfg", "OPENCLAW_SHELL": "exec"}
		if len(env) != len(want) {
			t.Errorf("env = %q, want %q", env, want)
		}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("env %s = %q, want %q", k, env[k], v)
			}
		}
	})

	t.Run("request env wins", func(t *testing.T) {
		p, err := rt.Prepare(Request{Command: "true", Env: map[string]string{
			"FOO": "req", "HOME": "/elsewhere", "OPENCLAW_SHELL": "x", PrependPathVar: "/evil"}})
		if err != nil {
			t.Fatal(err)
		}
		env := setenvs(p.Argv)
		if env["FOO"] != "req" || env["BAR"] != "cfg" || env["HOME"] != "/elsewhere" || env["OPENCLAW_SHELL"] != "exec" {
			t.Errorf("env = %q", env)
		}
		if _, ok := env[PrependPathVar]; ok || strings.HasPrefix(p.Argv[len(p.Argv)-1], "export") {
			t.Errorf("a request %s reached the command: %q", PrependPathVar, p.Argv)
		}
	})

	t.Run("pathPrepend", func(t *testing.T) {
		p, err := rt.Prepare(Request{Command: "true", PathPrepend: []string{" /opt/a/bin", "", "/opt/b/bin", "/opt/a/bin"},
			Env: map[string]string{"PATH": "/custom/bin::/opt/b/bin"}})
		if err != nil {
			t.Fatal(err)
		}
		if got := setenvs(p.Argv)[PrependPathVar]; got != "/opt/a/bin:/opt/b/bin:/custom/bin" {
			t.Errorf("%s = %q", PrependPathVar, got)
		}
		p, err = rt.Prepare(Request{Command: "true", PathPrepend: []string{"/opt/a/bin"}})
		if err != nil {
			t.Fatal(err)
		}
		if got := setenvs(p.Argv)[PrependPathVar]; got != "/opt/a/bin" || !strings.HasPrefix(p.Argv[len(p.Argv)-1], PathPrefix) {
			t.Errorf("pathPrepend alone: %s = %q, command %q", PrependPathVar, got, p.Argv[len(p.Argv)-1])
		}
	})

	t.Run("pty", func(t *testing.T) {
		p, err := rt.Prepare(Request{Command: "true", PTY: true})
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(p.Argv, "--new-session") {
			t.Error("--new-session for a PTY run")
		}
		if !slices.Equal(p.Argv[len(p.Argv)-3:], []string{"/bin/sh", "-lc", "true"}) {
			t.Errorf("argv ends %q", p.Argv[len(p.Argv)-3:])
		}
		if env := setenvs(p.Argv); env["TERM"] != "xterm-256color" {
			t.Errorf("TERM = %q", env["TERM"])
		}
		p, err = rt.Prepare(Request{Command: "true", PTY: true, Env: map[string]string{"TERM": "dumb"}})
		if err != nil {
			t.Fatal(err)
		}
		if env := setenvs(p.Argv); env["TERM"] != "dumb" {
			t.Errorf("TERM = %q, want the request's", env["TERM"])
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, req := range []Request{
			{Command: "echo \x00"},
			{Command: "true", Env: map[string]string{"": "x"}},
			{Command: "true", Env: map[string]string{"A": "x\x00y"}},
		} {
			if _, err := rt.Prepare(req); err == nil {
				t.Errorf("Prepare(%+v) succeeded", req)
			}
		}
	})
}

func TestArgvBindsAndHide(t *testing.T) {
	state := t.TempDir()
	roSrc, rwSrc := t.TempDir(), t.TempDir()
	rt, root := fakeRuntime(t, Config{
		Workspace:      filepath.Join(state, "workspace"),
		Network:        true,
		Hide:           []string{state, filepath.Join(state, "missing")},
		ReadOnlyBinds:  []string{roSrc, roSrc + ":/opt/ro"},
		ReadWriteBinds: []string{rwSrc + ":/opt/rw"},
	})
	p, err := rt.Prepare(Request{Command: "true"})
	if err != nil {
		t.Fatal(err)
	}
	a, ws := p.Argv, filepath.Join(root, "main")
	if slices.Contains(a, "--unshare-net") {
		t.Error("--unshare-net with network enabled")
	}
	hide, mask, bind := index(a, "--tmpfs", root[:len(root)-len("/workspace")]), index(a, "--tmpfs", root), index(a, "--bind", ws, ws)
	if hide < 0 || !(hide < mask && mask < bind) {
		t.Errorf("state dir mask %d, root mask %d, workspace bind %d: %q", hide, mask, bind, a)
	}
	if slices.Contains(a, filepath.Join(state, "missing")) {
		t.Error("a missing Hide path was mounted")
	}
	if k := index(a, "--ro-bind", "/etc/resolv.conf"); k >= 0 {
		t.Errorf("resolv.conf bound though no mask hides it: %q", a)
	}
	ro1, ro2, rw := index(a, "--ro-bind", roSrc, roSrc), index(a, "--ro-bind", roSrc, "/opt/ro"), index(a, "--bind", rwSrc, "/opt/rw")
	last := index(a, "--remount-ro")
	if ro1 < bind || ro2 < bind || rw < bind || last < rw {
		t.Errorf("binds at %d %d %d, workspace %d, first remount %d", ro1, ro2, rw, bind, last)
	}
}

func TestWorkdirRefused(t *testing.T) {
	rt, root := fakeRuntime(t, Config{})
	ws := filepath.Join(root, "main")
	if _, err := rt.Workspace("main"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(ws, "dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(ws, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(ws, "dir"), filepath.Join(ws, "in")); err != nil {
		t.Fatal(err)
	}
	const tail = ` is unavailable or not a directory: command was not executed. workdir is treated as a literal path; shell expansions such as "~" are not applied. Use an existing directory, omit an explicit workdir to use the default cwd, or update the configured default cwd.`
	for _, w := range []string{"..", "../main", "dir/../..", "dir/../dir", ws + "/..", outside, "/etc", "out",
		"file", "missing", "~", "~/dir", "   ", root, filepath.Join(root, "other")} {
		_, err := rt.Prepare(Request{Command: "touch ran", Workdir: w})
		var we *WorkdirError
		if !errors.As(err, &we) {
			t.Errorf("workdir %q: error %v, want *WorkdirError", w, err)
			continue
		}
		if want := `workdir "` + w + `"` + tail; err.Error() != want {
			t.Errorf("workdir %q: text\n%s\nwant\n%s", w, err, want)
		}
	}
	for w, want := range map[string]string{"": ws, "dir": ws + "/dir", "./dir/": ws + "/dir", ws + "/dir": ws + "/dir", "in": ws + "/dir", ws: ws} {
		p, err := rt.Prepare(Request{Command: "true", Workdir: w})
		if err != nil || p.Workdir != want || p.DisplayCwd != want {
			t.Errorf("workdir %q: %q %q %v, want %q", w, p.Workdir, p.DisplayCwd, err, want)
		}
	}
}

func TestArgvKeepsResolvConf(t *testing.T) {
	run := t.TempDir()
	target := filepath.Join(run, "resolve", "stub-resolv.conf")
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, []byte("nameserver 127.0.0.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	rt, _ := fakeRuntime(t, Config{Hide: []string{run}})
	rt.(*bwrapRuntime).keep = []string{link}
	p, err := rt.Prepare(Request{Command: "true"})
	if err != nil {
		t.Fatal(err)
	}
	realRun, _ := filepath.EvalSymlinks(run)
	realTarget, _ := filepath.EvalSymlinks(target)
	mask, keep, ro := index(p.Argv, "--tmpfs", realRun), index(p.Argv, "--ro-bind", realTarget, realTarget), index(p.Argv, "--remount-ro", realRun)
	if mask < 0 || !(mask < keep && keep < ro) {
		t.Fatalf("mask %d, kept file %d, remount %d: %q", mask, keep, ro, p.Argv)
	}
}
