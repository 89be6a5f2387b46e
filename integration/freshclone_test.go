package integration

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestFreshCloneRunsConformance clones the repository into an empty
// directory, with nothing beside it, and runs every conformance test
// there: the fixtures and docs a test needs must be in the repository, not
// in a directory that exists only on the developers' machines. A clone
// tests what is committed (a fixture left out of git fails here); outside
// a git checkout the working tree is copied instead.
func TestFreshCloneRunsConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("builds four packages in a fresh tree")
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "execmesh")
	if isGitCheckout(root) {
		out, err := exec.Command("git", "clone", "--quiet", "--no-hardlinks", root, dst).CombinedOutput()
		if err != nil {
			t.Fatalf("git clone: %v\n%s", err, out)
		}
	} else {
		copyTree(t, root, dst)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dst), "shared")); err == nil {
		t.Fatal("the clone has a shared directory beside it; the test would prove nothing")
	}
	cmd := exec.Command("go", "test", "-count=1", "-run", "Conformance", "./session", "./protocol", "./approvals", "./gateway")
	cmd.Dir = dst
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("conformance tests in a fresh clone failed: %v\n%s", err, out)
	}
	// Each package must have run conformance tests, not matched none.
	for _, pkg := range []string{"session", "protocol", "approvals", "gateway"} {
		if !strings.Contains(string(out), "ok  \tgithub.com/execmesh/execmesh/"+pkg) {
			t.Errorf("package %s did not pass in the clone:\n%s", pkg, out)
		}
	}
	if strings.Contains(string(out), "no tests to run") {
		t.Errorf("a package ran no conformance test:\n%s", out)
	}
	// No committed doc may link outside the repository.
	links, _ := exec.Command("grep", "-rIl", "--exclude-dir=.git", "\\.\\./shared", dst).Output()
	if s := strings.TrimSpace(string(links)); s != "" {
		t.Errorf("files in the clone refer to the shared directory beside the repository, which a clone does not have:\n%s", s)
	}
}

func isGitCheckout(dir string) bool {
	if _, err := exec.LookPath("git"); err != nil {
		return false
	}
	return exec.Command("git", "-C", dir, "rev-parse", "--is-inside-work-tree").Run() == nil
}

// copyTree copies the module tree at src to dst, without build outputs.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() && (rel == "bin" || rel == ".git") {
			return filepath.SkipDir
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
	if err != nil {
		t.Fatalf("copy %s: %v", src, err)
	}
}
