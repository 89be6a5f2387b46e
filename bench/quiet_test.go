package main

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"
)

func TestParseCPUTimes(t *testing.T) {
	for _, tc := range []struct {
		name, in    string
		total, idle uint64
		fails       bool
	}{
		// user nice system idle iowait irq softirq steal guest guest_nice
		{"linux", "cpu  100 2 30 800 50 3 5 10 7 0\ncpu0 50 1 15 400 25 1 2 5 3 0\n", 1000, 850, false},
		{"old kernel, 7 fields", "cpu  100 0 50 800 50 0 0\n", 1000, 850, false},
		{"per-CPU line first", "cpu0 100 0 50 800 50 0 0 0\n", 0, 0, true},
		{"not a number", "cpu  100 x 50 800 50 0 0 0\n", 0, 0, true},
		{"empty", "", 0, 0, true},
	} {
		got, err := parseCPUTimes([]byte(tc.in))
		if (err != nil) != tc.fails || (!tc.fails && (got.total != tc.total || got.idle != tc.idle)) {
			t.Errorf("%s: %+v %v, want total %d idle %d (error: %v)", tc.name, got, err, tc.total, tc.idle, tc.fails)
		}
	}
	if _, err := readCPUTimes(); err != nil {
		t.Errorf("this machine's /proc/stat: %v", err)
	}
}

func TestBusyShare(t *testing.T) {
	for _, tc := range []struct {
		a, b cpuTimes
		want float64
	}{
		{cpuTimes{1000, 800}, cpuTimes{1200, 900}, 0.5},
		{cpuTimes{1000, 800}, cpuTimes{1100, 900}, 0},
		{cpuTimes{1000, 800}, cpuTimes{1100, 800}, 1},
		{cpuTimes{1000, 800}, cpuTimes{1000, 800}, 0}, // no time passed
		{cpuTimes{1000, 800}, cpuTimes{900, 700}, 0},  // counters went back
	} {
		if got := busyShare(tc.a, tc.b); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("busyShare(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestQuiesce: the wait ends at the first quiet window, at max with the
// last busy share, at a read error, or when the context ends.
func TestQuiesce(t *testing.T) {
	// busy returns a reader whose successive windows have the given busy
	// shares (the last repeats), 100 jiffies each.
	busy := func(shares ...float64) (func() (cpuTimes, error), *int) {
		var cur cpuTimes
		n := 0
		return func() (cpuTimes, error) {
			if n > 0 {
				s := shares[min(n-1, len(shares)-1)]
				cur.total += 100
				cur.idle += uint64(math.Round(100 * (1 - s)))
			}
			n++
			return cur, nil
		}, &n
	}
	read, n := busy(0.9, 0.5, 0.05, 0.9)
	if _, share, err := quiesce(t.Context(), read, time.Millisecond, time.Minute); err != nil || math.Abs(share-0.05) > 1e-9 || *n != 4 {
		t.Errorf("falls: share %v after %d reads, %v; want 0.05 after 4", share, *n, err)
	}
	read, _ = busy(0.8)
	waited, share, err := quiesce(t.Context(), read, time.Millisecond, 20*time.Millisecond)
	if err != nil || math.Abs(share-0.8) > 1e-9 || waited < 20*time.Millisecond {
		t.Errorf("stays busy: share %v after %v, %v; want 0.8 after at least 20ms", share, waited, err)
	}
	errRead := errors.New("no /proc")
	if _, _, err := quiesce(t.Context(), func() (cpuTimes, error) { return cpuTimes{}, errRead }, time.Millisecond, time.Minute); !errors.Is(err, errRead) {
		t.Errorf("read error: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	read, _ = busy(1)
	if _, _, err := quiesce(ctx, read, time.Millisecond, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}
