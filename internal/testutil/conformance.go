package testutil

import (
	"bytes"
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

// Deviation is a text execmesh changes on purpose from OpenClaw's recorded
// answers in testdata/conformance.
type Deviation struct {
	Old, New string
	Why      string
}

// Deviations lists the deliberate differences from the recorded texts.
// The conformance tests apply them to a fixture (ApplyDeviations) before
// comparing; anything else must match OpenClaw byte for byte.
func Deviations() []Deviation {
	return []Deviation{{
		Old: "so OpenClaw can register a pollable process session",
		New: "so execmesh can register a pollable process session",
		Why: "the timeout guidance names the product that registers the session",
	}, {
		// DESIGN.md §3.5: exit notices carry the whole session id, so the
		// agent can poll it; OpenClaw cuts its random ids to 8 characters.
		// One entry per id the recorded notify_text.json cut.
		Old: "(nimble-c, ", New: "(nimble-coral, ",
		Why: "exit notices name the whole session id",
	}, {
		Old: "(swift-ha, ", New: "(swift-harbor-otter-2, ",
		Why: "exit notices name the whole session id",
	}, {
		// The live runs' ids are random: <sid> stands for the whole id.
		Old: "(<sid8>, ", New: "(<sid>, ",
		Why: "exit notices name the whole session id",
	}}
}

// ApplyDeviations returns a fixture's bytes with Deviations applied.
func ApplyDeviations(data []byte) []byte {
	for _, d := range Deviations() {
		data = bytes.ReplaceAll(data, []byte(d.Old), []byte(d.New))
	}
	return data
}
