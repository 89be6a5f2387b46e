package session

import "time"

// Counts returns how many sessions are running (foreground ones included)
// and how many finished sessions are retained, for metrics.
func (m *Manager) Counts() (running, finished int) {
	m.mu.Lock()
	list := make([]*session, 0, len(m.sessions))
	for _, s := range m.sessions {
		list = append(list, s)
	}
	m.mu.Unlock()
	// Session locks are taken after the manager lock is released, as
	// everywhere else in the package.
	for _, s := range list {
		s.mu.Lock()
		if s.exited {
			finished++
		} else {
			running++
		}
		s.mu.Unlock()
	}
	return running, finished
}

// Len returns how many sessions the Manager holds: running ones
// (foreground too) and retained finished ones, the sum of Counts without
// a look at each (a node's heartbeat reports it several times a second).
func (m *Manager) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.sessions)
}

// Retention returns how long finished background sessions are kept and
// how many of them at most (Config.JobTTL and Config.MaxFinished, with
// their defaults applied).
func (m *Manager) Retention() (ttl time.Duration, maxFinished int) {
	return m.cfg.JobTTL, m.cfg.MaxFinished
}
