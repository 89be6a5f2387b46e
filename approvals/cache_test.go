package approvals

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestFileCache: the cache returns the file Load would, reuses the parsed
// file while the file is unchanged (and old enough to trust its times),
// and reads it again after any change.
func TestFileCache(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := Path(dir)
	c := NewFileCache(path)
	age := func() {
		t.Helper()
		old := time.Now().Add(-5 * time.Second)
		if err := os.Chtimes(path, old, old); err != nil {
			t.Fatal(err)
		}
	}
	security := func(f *File) string {
		if a := f.Agents["main"]; a != nil {
			return a.Security
		}
		return ""
	}

	f1, err := c.Load()
	if err != nil || len(f1.Agents) != 0 {
		t.Fatalf("missing file: %+v, %v", f1, err)
	}
	if f2, _ := c.Load(); f2 != f1 {
		t.Error("missing file read again")
	}

	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"version":1,"agents":{"main":{"security":"deny"}}}`)
	f3, err := c.Load()
	if err != nil || security(f3) != "deny" {
		t.Fatalf("new file: %+v, %v", f3, err)
	}
	// Just written: its times cannot be trusted yet, so it is read again.
	write(`{"version":1,"agents":{"main":{"security":"full"}}}`)
	if f, _ := c.Load(); security(f) != "full" {
		t.Errorf("same-size rewrite within a tick: security %q, want full", security(f))
	}
	age()
	f4, _ := c.Load()
	if f5, _ := c.Load(); f5 != f4 || security(f5) != "full" {
		t.Errorf("unchanged old file read again (or wrong): %v", security(f5))
	}

	// Save renames a new file over it.
	nf := NewFile()
	nf.Agents["main"] = &Agent{Settings: Settings{Security: "allowlist"}}
	if _, err := Save(path, nf, Hash(mustRead(t, path))); err != nil {
		t.Fatal(err)
	}
	if f, _ := c.Load(); security(f) != "allowlist" {
		t.Errorf("after Save: security %q", security(f))
	}

	write(`{not json`)
	age()
	if _, err := c.Load(); !errors.Is(err, ErrCorrupt) {
		t.Errorf("corrupt file: %v", err)
	}
	if _, err := c.Load(); !errors.Is(err, ErrCorrupt) {
		t.Errorf("corrupt file, cached: %v", err)
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if f, err := c.Load(); err != nil || len(f.Agents) != 0 {
		t.Errorf("removed file: %+v, %v", f, err)
	}
	target := filepath.Join(dir, "elsewhere.json")
	if err := os.WriteFile(target, []byte(`{"version":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Load(); !errors.Is(err, ErrUnsafePath) {
		t.Errorf("symbolic link: %v", err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
