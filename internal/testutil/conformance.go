package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// ConformanceFile returns the path of a fixture in testdata/conformance,
// the directory beside the module root (found by walking up from the test's
// working directory to go.mod).
func ConformanceFile(t testing.TB, name string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "testdata", "conformance", name)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}
