package main

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestSettleLoad: the wait ends at the first reading at or below
// settledLoad, at max with the last reading, at a read error, or when
// the context ends.
func TestSettleLoad(t *testing.T) {
	quiet := func(string, ...any) {}
	errRead := errors.New("no loadavg")
	for _, tc := range []struct {
		name     string
		readings []float64 // the last repeats
		fail     bool
		max      time.Duration
		want     float64
		reads    int // at least
		err      error
	}{
		{name: "falls", readings: []float64{3.1, 1.4, 0.7, settledLoad, 0.2}, max: time.Minute, want: settledLoad, reads: 4},
		{name: "quiet already", readings: []float64{0.1}, max: time.Minute, want: 0.1, reads: 1},
		{name: "stays busy", readings: []float64{2.5}, max: 30 * time.Millisecond, want: 2.5, reads: 3},
		{name: "no wait", readings: []float64{2.5, 0.1}, max: 0, want: 2.5, reads: 1},
		{name: "read error", readings: []float64{2.5}, fail: true, max: time.Minute, reads: 1, err: errRead},
	} {
		n := 0
		load := func() (float64, error) {
			l := tc.readings[min(n, len(tc.readings)-1)]
			n++
			if tc.fail {
				return 0, errRead
			}
			return l, nil
		}
		got, err := settleLoad(t.Context(), load, tc.max, time.Millisecond, quiet)
		if !errors.Is(err, tc.err) || (err == nil && got != tc.want) || n < tc.reads {
			t.Errorf("%s: %.2f %v after %d reads, want %.2f %v after at least %d", tc.name, got, err, n, tc.want, tc.err, tc.reads)
		}
		if tc.name == "falls" && n != tc.reads {
			t.Errorf("%s: %d reads, want %d (it must stop at the first settled one)", tc.name, n, tc.reads)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := settleLoad(ctx, func() (float64, error) { return 4, nil }, time.Hour, time.Millisecond, quiet); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}
