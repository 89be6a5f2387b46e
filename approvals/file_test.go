package approvals

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestLoadMissing(t *testing.T) {
	f, hash, err := Load(filepath.Join(t.TempDir(), FileName))
	if err != nil || hash != "" || f.Version != 1 || len(f.Agents) != 0 {
		t.Fatalf("missing file: %+v %q %v", f, hash, err)
	}
}

func TestLoadCorruptLeavesFileUntouched(t *testing.T) {
	for name, content := range map[string]string{
		"invalid json": `{"version": 1, "agents": {`,
		"version 2":    `{"version": 2, "agents": {"main": {"security": "full"}}}`,
		"no version":   `{"agents": {}}`,
		"not object":   `[1, 2]`,
		"empty":        ``,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			f, hash, err := Load(path)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err = %v, want ErrCorrupt", err)
			}
			if f == nil || f.Version != 1 || len(f.Agents) != 0 || f.Defaults != nil {
				t.Fatalf("corrupt file must load as empty: %+v", f)
			}
			if hash != Hash([]byte(content)) {
				t.Errorf("hash %q is not the hash of the bytes", hash)
			}
			f.AddAllowAlways("main", "/usr/bin/rg")
			if _, err := Save(path, f, hash); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Save over a corrupt file: %v, want ErrCorrupt", err)
			}
			called := false
			if _, err := Update(path, func(*File) error { called = true; return nil }); !errors.Is(err, ErrCorrupt) || called {
				t.Errorf("Update over a corrupt file: %v (fn called: %v)", err, called)
			}
			got, _ := os.ReadFile(path)
			if string(got) != content {
				t.Errorf("file changed: %q", got)
			}
		})
	}
}

func TestParseNormalises(t *testing.T) {
	f, err := Parse([]byte(`{
	  "version": 1,
	  "socket": {"path": "  ~/.x/exec-approvals.sock ", "token": 7},
	  "defaults": {"security": "allowlist", "ask": 3, "autoAllowSkills": true},
	  "agents": {
	    "default": {"security": "full", "ask": "always", "allowlist": ["/usr/bin/jq", {"pattern": "/USR/BIN/RG"}]},
	    "main": {"ask": "off", "allowlist": [
	       "/usr/bin/rg",
	       {"id": "keep", "pattern": " ~/bin/x ", "argPattern": "a", "source": "allow-always", "lastUsedAt": 1737150000000,
	        "lastUsedCommand": "x --y", "lastResolvedPath": "/home/u/bin/x", "commandText": "secret", "extra": 1},
	       {"pattern": ""}, {"id": "nopattern"}, 42, null, "   "
	    ]},
	    "weird": "not an object",
	    "*": {"allowlist": "not a list"}
	  }
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if f.Socket == nil || f.Socket.Path != "~/.x/exec-approvals.sock" || f.Socket.Token != "" {
		t.Errorf("socket %+v", f.Socket)
	}
	if f.Defaults == nil || f.Defaults.Security != "allowlist" || f.Defaults.Ask != "" || f.Defaults.AutoAllowSkills == nil || !*f.Defaults.AutoAllowSkills {
		t.Errorf("defaults %+v", f.Defaults)
	}
	if _, ok := f.Agents["default"]; ok {
		t.Error("agents.default must be merged away")
	}
	if _, ok := f.Agents["weird"]; ok {
		t.Error("non-object agents must be dropped")
	}
	main := f.Agents["main"]
	if main.Security != "full" || main.Ask != "off" {
		t.Errorf("merge: main fields win, default fills the rest: %+v", main.Settings)
	}
	var patterns []string
	for _, e := range main.Allowlist {
		patterns = append(patterns, e.Pattern)
		if e.ID == "" {
			t.Errorf("entry %q has no id", e.Pattern)
		}
	}
	// /USR/BIN/RG duplicates /usr/bin/rg (case-insensitive).
	if !slices.Equal(patterns, []string{"/usr/bin/rg", "~/bin/x", "/usr/bin/jq"}) {
		t.Errorf("patterns %q", patterns)
	}
	keep := main.Allowlist[1]
	want := Entry{ID: "keep", Pattern: "~/bin/x", ArgPattern: "a", Source: "allow-always", LastUsedAt: 1737150000000,
		LastUsedCommand: "x --y", LastResolvedPath: "/home/u/bin/x"}
	if keep != want {
		t.Errorf("entry %+v, want %+v", keep, want)
	}
	out, err := f.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(out, []byte("commandText")) || bytes.Contains(out, []byte("secret")) || bytes.Contains(out, []byte("extra")) {
		t.Errorf("stripped fields written back: %s", out)
	}
	if !bytes.HasPrefix(out, []byte("{\n  \"version\": 1,\n")) || !bytes.HasSuffix(out, []byte("}\n")) {
		t.Errorf("format: %s", out)
	}
	// Round trip.
	g, err := Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	out2, _ := g.Marshal()
	if !bytes.Equal(out, out2) {
		t.Errorf("round trip differs:\n%s\n%s", out, out2)
	}
}

func TestInvalidValuesSurviveSave(t *testing.T) {
	// An invalid per-agent value means "defaults, not *" (case 89); saving
	// for an unrelated reason must not change that meaning.
	path := filepath.Join(t.TempDir(), FileName)
	content := `{"version":1,"defaults":{"security":"full"},"agents":{"*":{"security":"allowlist"},"main":{"security":"bogus"}}}`
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Update(path, func(f *File) error {
		_, err := f.AddAllowAlways("main", "/usr/bin/rg")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	f, _, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if sec := f.Resolve("main", DefaultPolicy(HostGateway)).Security; sec != SecurityFull {
		t.Errorf("after save main security = %q, want full", sec)
	}
}

func TestSaveAtomicAndPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	path := filepath.Join(dir, FileName)
	f := NewFile()
	if _, err := f.AddAllowAlways("main", "/usr/bin/rg"); err != nil {
		t.Fatal(err)
	}
	hash, err := Save(path, f, "")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if hash != Hash(data) {
		t.Error("returned hash is not the file's")
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode %v, want 0600", fi.Mode().Perm())
	}
	di, _ := os.Stat(dir)
	if di.Mode().Perm() != 0o700 {
		t.Errorf("dir mode %v, want 0700", di.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("temp file left behind: %s", e.Name())
		}
	}
	g, h2, err := Load(path)
	if err != nil || h2 != hash {
		t.Fatalf("reload: %v %q", err, h2)
	}
	if len(g.Agents["main"].Allowlist) != 1 || g.Agents["main"].Allowlist[0].Source != "allow-always" {
		t.Errorf("reloaded %+v", g.Agents["main"])
	}
	// A world-readable existing directory is tightened.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Save(path, g, h2); err != nil {
		t.Fatal(err)
	}
	di, _ = os.Stat(dir)
	if di.Mode().Perm() != 0o700 {
		t.Errorf("dir mode after save %v", di.Mode().Perm())
	}
}

func TestTempFileName(t *testing.T) {
	// The temp file is created beside the target; make the rename fail to
	// see it (a directory in the way), then check nothing is left.
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Save(path, NewFile(), ""); err == nil {
		t.Fatal("saving over a directory must fail")
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".exec-approvals.") && strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("temp file left behind: %s", e.Name())
		}
	}
}

func TestSymlinkedFileRefused(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "elsewhere.json")
	content := []byte(`{"version":1,"agents":{"main":{"security":"full"}}}`)
	if err := os.WriteFile(target, content, 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, FileName)
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	f, hash, err := Load(path)
	if !errors.Is(err, ErrUnsafePath) || hash != "" || len(f.Agents) != 0 {
		t.Fatalf("symlink: %v %q %+v", err, hash, f.Agents)
	}
	if !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("error should say why: %v", err)
	}
	if _, err := Save(path, NewFile(), Hash(content)); !errors.Is(err, ErrUnsafePath) {
		t.Errorf("Save through a symlink: %v", err)
	}
	if got, _ := os.ReadFile(target); !bytes.Equal(got, content) {
		t.Error("symlink target changed")
	}
	if fi, _ := os.Lstat(path); fi.Mode()&os.ModeSymlink == 0 {
		t.Error("symlink replaced")
	}
}

func TestHardLinkedFileRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	content := []byte(`{"version":1,"agents":{}}`)
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(path, filepath.Join(dir, "other")); err != nil {
		t.Skipf("hard links not supported: %v", err)
	}
	if _, _, err := Load(path); !errors.Is(err, ErrUnsafePath) || !strings.Contains(err.Error(), "hard links") {
		t.Fatalf("hard link: %v", err)
	}
	if _, err := Save(path, NewFile(), Hash(content)); !errors.Is(err, ErrUnsafePath) {
		t.Errorf("Save over a hard-linked file: %v", err)
	}
}

func TestNotRegularRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Load(path); !errors.Is(err, ErrUnsafePath) {
		t.Fatalf("directory: %v", err)
	}
}

func TestSaveConflict(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	h1, err := Save(path, NewFile(), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Save(path, NewFile(), ""); !errors.Is(err, ErrConflict) {
		t.Fatalf("base \"\" over an existing file: %v", err)
	}
	f, h, _ := Load(path)
	f.AddAllowAlways("main", "/usr/bin/rg")
	h2, err := Save(path, f, h)
	if err != nil || h2 == h1 {
		t.Fatalf("save: %v", err)
	}
	g := NewFile()
	g.AddAllowAlways("main", "/usr/bin/jq")
	if _, err := Save(path, g, h1); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale base hash: %v", err)
	}
	// Changed behind our back by hand.
	if err := os.WriteFile(path, []byte(`{"version":1,"agents":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Save(path, f, h2); !errors.Is(err, ErrConflict) {
		t.Fatalf("hand edit not detected: %v", err)
	}
}

func TestConcurrentSaveOneWins(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	base, err := Save(path, NewFile(), "")
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			f, h, err := Load(path)
			if err != nil {
				errs[i] = err
				return
			}
			if h != base {
				errs[i] = fmt.Errorf("loaded hash %q after another save", h)
				return
			}
			f.AddAllowAlways("main", fmt.Sprintf("/usr/bin/tool%d", i))
			_, errs[i] = Save(path, f, base)
		})
	}
	wg.Wait()
	wins := 0
	for _, err := range errs {
		switch {
		case err == nil:
			wins++
		case errors.Is(err, ErrConflict):
		case strings.Contains(err.Error(), "after another save"):
			// A goroutine that loaded late saw the winner's file: fine.
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d saves won with the same base hash, want exactly 1", wins)
	}
	f, _, _ := Load(path)
	if len(f.Agents["main"].Allowlist) != 1 {
		t.Errorf("file holds %d entries", len(f.Agents["main"].Allowlist))
	}
}

// Every Save renames a new file into place; a Load racing it must read
// either the old file or the new one, never report the path as unsafe.
func TestLoadDuringSaves(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	hash, err := Save(path, NewFile(), "")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if _, _, err := Load(path); err != nil {
					t.Errorf("load during saves: %v", err)
					return
				}
			}
		})
	}
	f := NewFile()
	for i := range 500 {
		f.AddAllowAlways("main", fmt.Sprintf("/usr/bin/tool%d", i%4))
		if hash, err = Save(path, f, hash); err != nil {
			t.Errorf("save %d: %v", i, err)
			break
		}
	}
	close(done)
	wg.Wait()
}

func TestConcurrentUpdateKeepsAll(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	const n = 4
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, err := Update(path, func(f *File) error {
				_, err := f.AddAllowAlways("main", fmt.Sprintf("/usr/bin/tool%d", i))
				return err
			})
			if err != nil && !errors.Is(err, ErrConflict) {
				t.Errorf("update %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	f, _, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	// Update retries a few times; with 4 writers every one gets in.
	if got := len(f.Agents["main"].Allowlist); got != n {
		t.Errorf("%d entries after %d concurrent updates", got, n)
	}
}

func TestAddAllowAlways(t *testing.T) {
	f := NewFile()
	for _, p := range []string{"/bin/sh", "/usr/bin/bash", "/usr/bin/env", "/usr/bin/zsh", "/usr/bin/sudo",
		"/usr/bin/nice", "/usr/bin/timeout", "/usr/bin/busybox", "/usr/bin/bash5.2",
		"relative/rg", "/usr/bin/../bin/rg", "/usr/bin/r*", "/usr/bin/r?", ""} {
		if _, err := f.AddAllowAlways("main", p); !errors.Is(err, ErrNotAllowable) {
			t.Errorf("AddAllowAlways(%q) = %v, want ErrNotAllowable", p, err)
		}
	}
	e1, err := f.AddAllowAlways("", "/usr/bin/rg")
	if err != nil {
		t.Fatal(err)
	}
	e2, _ := f.AddAllowAlways("main", "/USR/BIN/RG")
	if e1.ID == "" || e1.ID != e2.ID || len(f.Agents["main"].Allowlist) != 1 {
		t.Errorf("duplicate entry: %+v %+v", e1, e2)
	}
	if e1.Source != "allow-always" || e1.Pattern != "/usr/bin/rg" {
		t.Errorf("entry %+v", e1)
	}
}

// TestAllowAlwaysPersistsInnerBinary: approving `env bash -lc 'id'` for
// always must persist id, never bash or env (#23276, CVE-2026-29607).
func TestAllowAlwaysPersistsInnerBinary(t *testing.T) {
	h := newHost(t)
	opts := h.opts(nil)
	for _, cmd := range []string{"env bash -lc id", "zsh -lc id", "nice -n 1 sh -c 'id | wc -l'", "busybox sh -c id", "sudo id", "echo id | sh"} {
		ev := Evaluate(cmd, opts)
		paths := ev.AllowAlwaysPaths()
		for _, p := range paths {
			if unsafeKind(filepath.Base(p)) != "" {
				t.Errorf("%q would persist %s", cmd, p)
			}
		}
		switch cmd {
		case "sudo id", "echo id | sh":
			// Nothing safe to persist for the privileged or stdin-fed part.
			if slices.Contains(paths, filepath.Join(h.evil, "id")) {
				t.Errorf("%q: persisted id through %q", cmd, paths)
			}
		default:
			if !slices.Contains(paths, filepath.Join(h.evil, "id")) {
				t.Errorf("%q: paths %q, want id", cmd, paths)
			}
		}
		f := NewFile()
		for _, p := range paths {
			if _, err := f.AddAllowAlways("main", p); err != nil {
				t.Errorf("%q: %v", cmd, err)
			}
		}
	}
}

func TestRecordUse(t *testing.T) {
	h := newHost(t)
	f := NewFile()
	f.Agents["*"] = &Agent{Allowlist: []Entry{{ID: "star", Pattern: filepath.Join(h.bin, "rg")}}}
	f.Agents["main"] = &Agent{Allowlist: []Entry{{ID: "mine", Pattern: filepath.Join(h.bin, "ls")}}}
	pol := f.Resolve("main", DefaultPolicy(HostGateway))
	ev := Evaluate("ls | rg x | wc -l", h.opts(pol.Allowlist))
	if !ev.Satisfied {
		t.Fatalf("%s %s", ev.Reason, ev.Detail)
	}
	at := time.UnixMilli(1737150000000)
	if n := f.RecordUse("main", ev, "ls | rg x | wc -l", at); n != 2 {
		t.Fatalf("recorded %d entries, want 2 (wc is a safe bin)", n)
	}
	for _, e := range []Entry{f.Agents["*"].Allowlist[0], f.Agents["main"].Allowlist[0]} {
		if e.LastUsedAt != at.UnixMilli() || e.LastUsedCommand != "ls | rg x | wc -l" || !strings.HasPrefix(e.LastResolvedPath, h.bin) {
			t.Errorf("entry %+v", e)
		}
	}
}
