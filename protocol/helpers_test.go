package protocol

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// conformanceFile returns the path of a fixture in ../shared/conformance,
// relative to the module root.
func conformanceFile(t testing.TB, name string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "..", "shared", "conformance", name)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// loadFixture decodes a conformance fixture into v.
func loadFixture(t testing.TB, name string, v any) {
	t.Helper()
	data, err := os.ReadFile(conformanceFile(t, name))
	if err != nil {
		t.Fatalf("conformance fixtures missing (they live in ../shared/conformance): %v", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}
