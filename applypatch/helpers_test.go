package applypatch

import (
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// patchOf wraps file sections in the envelope.
func patchOf(body ...string) string {
	return "*** Begin Patch\n" + strings.Join(body, "\n") + "\n*** End Patch\n"
}

// writeFiles creates files (slash paths relative to dir) with their
// contents, mode 0644.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// snapshot records everything under dir: each path (slash, relative) with
// its type, mode and content or link target.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	snap := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			snap[key] = "link -> " + target
		case fi.IsDir():
			snap[key] = fmt.Sprintf("dir %v", fi.Mode())
		default:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			snap[key] = fmt.Sprintf("file %v %q", fi.Mode(), data)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// regularFiles returns the contents of the regular files under dir, and
// fails the test if a temporary file was left behind.
func regularFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	for _, p := range slices.Sorted(maps.Keys(snapshot(t, dir))) {
		if strings.Contains(p, ".applypatch-") {
			t.Errorf("temporary file left behind: %s", p)
		}
		full := filepath.Join(dir, filepath.FromSlash(p))
		fi, err := os.Lstat(full)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(full)
			if err != nil {
				t.Fatal(err)
			}
			files[p] = string(data)
		}
	}
	return files
}

// diffSnapshots describes how two snapshots differ.
func diffSnapshots(before, after map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(before)) {
		if a, ok := after[k]; !ok {
			fmt.Fprintf(&b, "\n  removed %s (%s)", k, before[k])
		} else if a != before[k] {
			fmt.Fprintf(&b, "\n  changed %s: %s -> %s", k, before[k], a)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if _, ok := before[k]; !ok {
			fmt.Fprintf(&b, "\n  added %s (%s)", k, after[k])
		}
	}
	return b.String()
}
