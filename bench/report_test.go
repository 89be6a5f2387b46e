package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// TestVerdicts: a figure is judged against its target, and a run whose
// load average was above maxLoad gives no verdict except on the load
// figure itself; results.json keeps a target with "pass": null for those.
func TestVerdicts(t *testing.T) {
	tests := []struct {
		name      string
		f         figure
		noVerdict bool
		want      string
	}{
		{"ratio passes", figure{Value: 1.2, Baseline: 1, Target: ratioAtMost(1.3)}, false, "pass"},
		{"ratio fails", figure{Value: 1.4, Baseline: 1, Target: ratioAtMost(1.3)}, false, "FAIL"},
		{"rate as cost ratio", figure{Value: 700, Baseline: 1000, Ratio: costRatio(1000, 700), Target: ratioAtMost(faninTarget)}, false, "pass"},
		{"rate below 0.7", figure{Value: 690, Baseline: 1000, Ratio: costRatio(1000, 690), Target: ratioAtMost(faninTarget)}, false, "FAIL"},
		{"value at most", figure{Value: 50, Target: valueAtMost(50)}, false, "pass"},
		{"value below", figure{Value: 1, Target: valueBelow(1)}, false, "FAIL"},
		{"value at least", figure{Value: 1999, Target: valueAtLeast(2000)}, false, "FAIL"},
		{"no target", figure{Value: 3}, false, "report"},
		{"NaN fails", figure{Value: math.NaN(), Target: valueAtMost(1)}, false, "FAIL"},
		{"busy: pass withheld", figure{Value: 1.2, Baseline: 1, Target: ratioAtMost(1.3)}, true, "no-verdict"},
		{"busy: fail withheld", figure{Value: 9, Baseline: 1, Target: ratioAtMost(1.3)}, true, "no-verdict"},
		{"busy: no target", figure{Value: 3}, true, "report"},
		{"busy: the load gate is judged", figure{Value: 3.2, Target: valueAtMost(maxLoad), gate: true}, true, "FAIL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &results{noVerdict: tt.noVerdict}
			got := r.add(tt.f)
			if v := got.verdict(); v != tt.want {
				t.Fatalf("verdict %q, want %q (ratio %v, pass %v)", v, tt.want, got.Ratio, got.Pass)
			}
		})
	}
}

func TestResultsJSONNoVerdict(t *testing.T) {
	r := &results{noVerdict: true}
	r.add(figure{Section: "s", Figure: "f", Value: 1, Baseline: 1, Target: ratioAtMost(1.3)})
	r.addAt(0, figure{Section: "machine", Figure: "load", Value: 2, Target: valueAtMost(maxLoad), gate: true})
	path := filepath.Join(t.TempDir(), "results.json")
	if err := r.writeJSON(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out[0]["figure"] != "load" || out[0]["pass"] != false {
		t.Fatalf("load figure first and judged, got %s", b)
	}
	if out[1]["target"] != "ratio<=1.3" || out[1]["pass"] != nil {
		t.Fatalf("want a target and pass null, got %s", b)
	}
}
