package testutil

import (
	"encoding/json"
	"testing"
)

// JSONMap returns v encoded to JSON and decoded as an object, for tests
// that look at which keys a value's JSON has (tool result details, SSE
// payloads). Numbers come back as float64.
func JSONMap(t testing.TB, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %T: %v", v, err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("unmarshal %s: %v", b, err)
	}
	return m
}
