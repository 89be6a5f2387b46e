package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// figure is one row of the table and of results.json. ratio is always a
// cost: value/baseline for times and sizes, baseline/value for rates, so
// 1.0 means "as cheap as the baseline" and larger is worse.
type figure struct {
	Section  string  `json:"section"`
	Figure   string  `json:"figure"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	Baseline float64 `json:"baseline"`
	// BaselineName says what the baseline is.
	BaselineName string  `json:"baselineName"`
	Ratio        float64 `json:"ratio"`
	// Target is the bar, written as "ratio<=1.5", "value<50" (in Unit)
	// or "" when the figure is reported without one.
	Target string `json:"target"`
	// Pass is nil when there is no target, and also when the machine was
	// too busy for a verdict (see results.noVerdict): a figure with a
	// target and a nil Pass is "no-verdict".
	Pass *bool `json:"pass"`
	// AllocsPerOp and BaselineAllocsPerOp are set for Go micro-benchmarks.
	AllocsPerOp         *float64 `json:"allocsPerOp,omitempty"`
	BaselineAllocsPerOp *float64 `json:"baselineAllocsPerOp,omitempty"`
	Note                string   `json:"note,omitempty"`
	// gate marks the load-average figure, judged even in a no-verdict run.
	gate bool
}

// target kinds.
func ratioAtMost(x float64) string { return fmt.Sprintf("ratio<=%g", x) }
func valueBelow(x float64) string  { return fmt.Sprintf("value<%g", x) }
func valueAtMost(x float64) string { return fmt.Sprintf("value<=%g", x) }

// judge fills Ratio (when unset) and Pass from Target.
func (f *figure) judge() {
	var ok bool
	var x float64
	switch {
	case f.Target == "":
		f.Pass = nil
		return
	case sscan(f.Target, "ratio<=%g", &x):
		ok = f.Ratio <= x
	case sscan(f.Target, "value<=%g", &x):
		ok = f.Value <= x
	case sscan(f.Target, "value<%g", &x):
		ok = f.Value < x
	case sscan(f.Target, "value>=%g", &x):
		ok = f.Value >= x
	case sscan(f.Target, "allocs<=%g", &x):
		ok = f.AllocsPerOp != nil && *f.AllocsPerOp <= x
	default:
		panic("unknown target " + f.Target)
	}
	if math.IsNaN(f.Value) || math.IsNaN(f.Ratio) {
		ok = false
	}
	f.Pass = &ok
}

func sscan(s, format string, x *float64) bool {
	n, err := fmt.Sscanf(s, format, x)
	return err == nil && n == 1
}

// costRatio is value/baseline, or NaN without a baseline.
func costRatio(value, baseline float64) float64 {
	if baseline <= 0 || math.IsNaN(baseline) {
		return math.NaN()
	}
	return value / baseline
}

// results collects figures as sections finish.
type results struct {
	figs    []figure
	started time.Time
	// noVerdict is set when the 1-minute load average at the start was
	// above maxLoad: figures are measured and written, but none is called
	// passed or failed (Pass stays nil), since a busy machine says nothing
	// about the bars. Only the load figure itself is judged.
	noVerdict bool
}

// maxLoad is the 1-minute load average above which the run gives no
// verdicts ("refuses to call a figure passed when the load was
// above 1").
const maxLoad = 1.0

func (r *results) add(f figure) figure {
	if f.Ratio == 0 && f.Baseline != 0 {
		f.Ratio = costRatio(f.Value, f.Baseline)
	}
	f.judge()
	if r.noVerdict && f.Pass != nil && !f.gate {
		f.Pass = nil
	}
	r.figs = append(r.figs, f)
	return f
}

// addAt is add, with the figure placed at index i (the machine section's
// figures stay together).
func (r *results) addAt(i int, f figure) {
	r.add(f)
	last := r.figs[len(r.figs)-1]
	i = min(i, len(r.figs)-1)
	copy(r.figs[i+1:], r.figs[i:len(r.figs)-1])
	r.figs[i] = last
}

// verdict is the result column: pass, FAIL, report (no target) or
// no-verdict (a target, but the machine was too busy to judge it).
func (f *figure) verdict() string {
	switch {
	case f.Pass != nil && *f.Pass:
		return "pass"
	case f.Pass != nil:
		return "FAIL"
	case f.Target != "":
		return "no-verdict"
	}
	return "report"
}

// writeJSON writes results.json atomically.
func (r *results) writeJSON(path string) error {
	out := slices.Clone(r.figs)
	for i := range out {
		// JSON has no NaN: a missing number is written as -1 with a note.
		for _, p := range []*float64{&out[i].Value, &out[i].Baseline, &out[i].Ratio} {
			if math.IsNaN(*p) || math.IsInf(*p, 0) {
				*p = -1
			}
		}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // keep "ratio<=1.5" readable
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// printTable writes the table: one line per figure.
func (r *results) printTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tvalue\tbaseline\tratio\ttarget\tresult\t")
	section := ""
	var notes []string
	for _, f := range r.figs {
		if f.Section != section {
			section = f.Section
			fmt.Fprintf(tw, "[%s]\t\t\t\t\t\t\n", section)
		}
		val := formatNum(f.Value) + " " + f.Unit
		base := "—"
		if f.Baseline != 0 {
			base = formatNum(f.Baseline) + " " + f.Unit
			if f.BaselineName != "" {
				base += " (" + f.BaselineName + ")"
			}
		}
		if f.AllocsPerOp != nil {
			val += fmt.Sprintf(", %g allocs", *f.AllocsPerOp)
		}
		if f.BaselineAllocsPerOp != nil && f.Baseline != 0 {
			base = formatNum(f.Baseline) + " " + f.Unit + fmt.Sprintf(", %g allocs", *f.BaselineAllocsPerOp)
			if f.BaselineName != "" {
				base += " (" + f.BaselineName + ")"
			}
		}
		ratio := "—"
		if f.Baseline != 0 && !math.IsNaN(f.Ratio) {
			ratio = fmt.Sprintf("%.2f×", f.Ratio)
		}
		verdict := f.verdict()
		target := strings.NewReplacer("ratio<=", "≤", "value<=", "≤", "value<", "<", "value>=", "≥", "allocs<=", "≤").Replace(f.Target)
		switch {
		case strings.HasPrefix(f.Target, "ratio"):
			target += "×"
		case strings.HasPrefix(f.Target, "allocs"):
			target += " allocs"
		case f.Target != "":
			target += " " + f.Unit
		}
		name := f.Figure
		if f.Note != "" {
			notes = append(notes, f.Note)
			name += fmt.Sprintf(" [%d]", len(notes))
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t\n", name, val, base, ratio, target, verdict)
	}
	tw.Flush()
	if len(notes) > 0 {
		fmt.Fprintln(w)
	}
	for i, n := range notes {
		fmt.Fprintf(w, "[%d] %s\n", i+1, n)
	}
}

func formatNum(x float64) string {
	switch {
	case math.IsNaN(x):
		return "n/a"
	case x == 0:
		return "0"
	case math.Abs(x) >= 1000:
		return fmt.Sprintf("%.0f", x)
	case math.Abs(x) >= 100:
		return fmt.Sprintf("%.1f", x)
	case math.Abs(x) >= 1:
		return fmt.Sprintf("%.2f", x)
	}
	return fmt.Sprintf("%.3g", x)
}

// percentile returns the nearest-rank p-th percentile (0 < p <= 100).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	k := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(k, 0), len(s)-1)]
}

// median of xs (NaN when empty).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
