package session

import (
	"sync"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

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

// A running session's list entry shows a usage figure read at most
// listUsageAge before; older ones are read again, in the background or
// by the list itself, which at ten thousand sessions is ten thousand
// cpu.stat reads (~10 µs each) a second while lists go on. Most
// background sessions are idle, though, and the manager group's cpu.stat
// sums every session group's: while it does not move, no session runs,
// and a figure exact at one read of it is exact at the next. A usage
// round is one such read of the sum, made at most once per
// usageFlushEvery by whoever lists; a session's figure carries the last
// round it is known exact at or after (listUsageRound), and is exact at
// the current round without a read when the sum has not moved since.

// cpuTotal is a cgroup's CPU figures (cpu.stat, µs).
type cpuTotal struct{ user, sys uint64 }

// usageRounds are the Manager's usage rounds.
type usageRounds struct {
	mu    sync.Mutex
	last  usageRound
	total cpuTotal // the manager group's CPU figures at last.round
}

// usageRound is what a list knows of the usage rounds: a figure read
// after it started is exact after round round (read at at), and one
// exact at or after round since is exact at round too: the sum did not
// move from since to round. The zero value knows nothing.
type usageRound struct {
	round, since uint64
	at           time.Time // taken before the round's read
}

// usageNow returns the current usage round, starting a new one (a read
// of the manager group's cpu.stat, which also folds in every session
// group's figures as flushUsage does) when the last is usageFlushEvery
// old. Only CPU times are carried over rounds: a memory peak can rise
// while its group does not run (socket buffers are charged from
// interrupts).
func (m *Manager) usageNow() usageRound {
	if m.cg == nil {
		return usageRound{}
	}
	u := &m.usage
	u.mu.Lock()
	defer u.mu.Unlock()
	before := time.Now()
	if age := before.Sub(u.last.at); u.last.round != 0 && age >= 0 && age < usageFlushEvery {
		return u.last
	}
	user, sys, err := m.cg.dir.CPUStat()
	m.usageFlushAt.Store(before.UnixNano())
	if err != nil {
		return u.last // figures read now are still exact after the last round
	}
	t := cpuTotal{user, sys}
	next := usageRound{round: u.last.round + 1, since: u.last.since, at: before}
	if u.last.round == 0 || t != u.total || !m.cg.cpuOnly() {
		next.since = next.round
	}
	u.last, u.total = next, t
	return next
}

// keepListUsageLocked carries the session's list usage figure on to
// round r without reading it, when no session ran since it was read; it
// reports whether the figure is exact at r. Caller holds s.mu.
func (s *session) keepListUsageLocked(r usageRound) bool {
	if r.round == 0 || s.listUsageAt.IsZero() || s.listUsageRound < r.since {
		return false
	}
	if s.listUsageRound != r.round {
		s.listUsageRound = r.round
		if r.at.After(s.listUsageAt) {
			s.listUsageAt = r.at
		}
	}
	return true
}

// readListUsageLocked reads the session's usage for its list entry at
// now, during round r (whose read came before). Caller holds s.mu; the
// session has not exited.
func (s *session) readListUsageLocked(now time.Time, r usageRound) {
	u := s.tree.usage(nil)
	if !sameUsage(u, s.listUsage) {
		s.listUsageVer++
	}
	s.listUsage, s.listUsageAt, s.listUsageRound = u, now, r.round
}

// sameUsage reports whether a and b show the same figures.
func sameUsage(a, b protocol.Usage) bool {
	eq := func(x, y *uint64) bool { return x == y || x != nil && y != nil && *x == *y }
	return a.CPUUserMs == b.CPUUserMs && a.CPUSystemMs == b.CPUSystemMs && a.Scope == b.Scope &&
		eq(a.MemoryPeakBytes, b.MemoryPeakBytes) && eq(a.PidsPeak, b.PidsPeak)
}
