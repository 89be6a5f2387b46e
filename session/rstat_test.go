package session

import (
	"testing"
	"time"
)

// TestFlushUsageRateLimited: flushUsage reads the manager group's
// cpu.stat once per usageFlushEvery at most, whoever asks, and again once
// that passed (or the clock was set back).
func TestFlushUsageRateLimited(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	if m.cg == nil {
		t.Skip("sessions are not in cgroups here")
	}
	m.flushUsage()
	first := m.usageFlushAt.Load()
	if first == 0 {
		t.Fatal("flushUsage did not flush")
	}
	for range 10 {
		m.flushUsage()
	}
	if got := m.usageFlushAt.Load(); got != first && time.Duration(got-first) < usageFlushEvery {
		t.Fatalf("flushed again %v after the first", time.Duration(got-first))
	}
	m.usageFlushAt.Store(time.Now().Add(-usageFlushEvery - time.Millisecond).UnixNano())
	m.flushUsage()
	if got := m.usageFlushAt.Load(); time.Since(time.Unix(0, got)) > time.Second {
		t.Fatal("no flush once usageFlushEvery passed")
	}
	m.usageFlushAt.Store(time.Now().Add(time.Hour).UnixNano()) // a clock set back since
	m.flushUsage()
	if got := m.usageFlushAt.Load(); time.Until(time.Unix(0, got)) > time.Minute {
		t.Fatal("no flush after the clock was set back")
	}
}
