package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Between sections the benchmark waits for the CPUs to fall quiet, so
// that what a section leaves running (the agents finishing its sessions,
// a garbage collection of its garbage) does not land on the next
// section's first figures, often its baseline.
const (
	// quietBusy is the busy share of all CPUs, over one quietWindow, at
	// or below which the machine counts as quiet (an idle cluster uses
	// well under 1 %).
	quietBusy   = 0.10
	quietWindow = 250 * time.Millisecond
	// quietMax bounds the wait; a machine still busy then is measured
	// anyway, and the progress says so.
	quietMax = 20 * time.Second
)

// cpuTimes is the first line of /proc/stat: jiffies of all CPUs.
type cpuTimes struct{ total, idle uint64 }

// parseCPUTimes reads the aggregate "cpu" line of /proc/stat. Idle time
// is idle plus iowait; guest time is left out of the total, since the
// kernel counts it in user time already.
func parseCPUTimes(b []byte) (cpuTimes, error) {
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return cpuTimes{}, fmt.Errorf("/proc/stat: unexpected first line %.80q", line)
	}
	var t cpuTimes
	for i, s := range f[1:min(len(f), 9)] { // user … steal
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return cpuTimes{}, fmt.Errorf("/proc/stat: field %d: %w", i+1, err)
		}
		t.total += v
		if i == 3 || i == 4 { // idle, iowait
			t.idle += v
		}
	}
	return t, nil
}

// readCPUTimes reads /proc/stat.
func readCPUTimes() (cpuTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, err
	}
	return parseCPUTimes(b)
}

// busyShare is the share of all CPUs busy from a to b (0 when no time
// passed in the kernel's clock).
func busyShare(a, b cpuTimes) float64 {
	if b.total <= a.total {
		return 0
	}
	total, idle := b.total-a.total, b.idle-min(b.idle, a.idle)
	return 1 - float64(min(idle, total))/float64(total)
}

// quiesce waits until one window of the CPUs' time, read with read, is
// at most quietBusy busy, or limit has passed. It returns how long it
// waited and the busy share of the last window.
func quiesce(ctx context.Context, read func() (cpuTimes, error), window, limit time.Duration) (time.Duration, float64, error) {
	t0 := time.Now()
	prev, err := read()
	if err != nil {
		return 0, 0, err
	}
	for {
		select {
		case <-ctx.Done():
			return time.Since(t0), 0, ctx.Err()
		case <-time.After(window):
		}
		cur, err := read()
		if err != nil {
			return time.Since(t0), 0, err
		}
		busy := busyShare(prev, cur)
		if busy <= quietBusy || time.Since(t0) >= limit {
			return time.Since(t0), busy, nil
		}
		prev = cur
	}
}
