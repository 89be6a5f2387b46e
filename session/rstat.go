package session

import "time"

// The kernel keeps the CPU figures of a cgroup that ran since they were
// last folded in on a per-CPU list of its parent's updated children; a
// read of one session group's cpu.stat folds in that group and unlinks it
// from the list, which it walks to find it. After thousands of sessions
// ran (each one's fork and exec), every such read walked thousands of
// siblings with interrupts off: at 10 000 sessions a poll's usage read
// cost 0.27 ms of the node's CPU, half of what the poll cost it, and a
// list's background refresh of every figure grew with the square of the
// count. One read of the manager group's cpu.stat folds in every session
// group at once, in one pass; flushUsage does that before usage reads,
// at most once per usageFlushEvery (an idle node reads nothing).

// usageFlushEvery is how often at most flushUsage reads the manager
// group's cpu.stat.
const usageFlushEvery = 50 * time.Millisecond

// flushUsage has the kernel fold in the pending CPU figures of every
// session group, unless it did so less than usageFlushEvery ago (or the
// sessions are not in cgroups).
func (m *Manager) flushUsage() {
	if m.cg == nil {
		return
	}
	now := time.Now().UnixNano()
	last := m.usageFlushAt.Load()
	if now >= last && now-last < int64(usageFlushEvery) || !m.usageFlushAt.CompareAndSwap(last, now) {
		return // (a clock set back allows a flush)
	}
	_, _, _ = m.cg.dir.CPUStat() // read for its side effect; the figure is the manager's
}
