package protocol

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/execmesh/execmesh/internal/testutil"
)

// loadFixture decodes a conformance fixture into v.
func loadFixture(t testing.TB, name string, v any) {
	t.Helper()
	data, err := os.ReadFile(testutil.ConformanceFile(t, name))
	if err != nil {
		t.Fatalf("conformance fixtures missing (testdata/conformance at the module root): %v", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}
