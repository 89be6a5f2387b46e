// Package ratelog logs a condition that repeats (events dropped from a
// full queue, exit events retried) at a bounded rate: the first
// occurrence of a message for a key is logged at once, later ones within
// the interval are only counted, and the count goes out in one line when
// the interval ends. A condition that lasts is then one line per interval
// per key, however many times it happens, and none of it is hidden: every
// line says how many occurrences it stands for.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Limiter rate-limits log lines per (message, key). Build it with New;
// its methods are safe for concurrent use. The state it keeps is one
// entry (and one timer) per key whose message was logged within the last
// interval: a key that goes quiet is forgotten one interval after its last
// line.
type Limiter struct {
	log   *slog.Logger
	every time.Duration

	mu      sync.Mutex
	entries map[entryKey]*entry
	stopped bool
}

type entryKey struct{ msg, key string }

// entry is a (message, key) logged within the current interval.
type entry struct {
	level    slog.Level
	countKey string
	args     []any // of the latest occurrence
	n        int   // occurrences since the last line
	timer    *time.Timer
}

// New returns a Limiter that logs to log at most once per every per
// message and key (every <= 0 means 10 s).
func New(log *slog.Logger, every time.Duration) *Limiter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if every <= 0 {
		every = 10 * time.Second
	}
	return &Limiter{log: log, every: every, entries: map[entryKey]*entry{}}
}

// Warn logs msg for key at level WARN, or counts it when a line for the
// same msg and key went out less than the interval ago. Each line carries
// countKey=<occurrences it stands for> (1 for the first) and, after the
// first, the attributes of the latest occurrence it counts.
func (l *Limiter) Warn(key, msg, countKey string, args ...any) {
	l.Log(slog.LevelWarn, key, msg, countKey, args...)
}

// Log is Warn at level.
func (l *Limiter) Log(level slog.Level, key, msg, countKey string, args ...any) {
	k := entryKey{msg, key}
	l.mu.Lock()
	if e := l.entries[k]; e != nil {
		e.n++
		e.args = args
		l.mu.Unlock()
		return
	}
	if l.stopped {
		l.mu.Unlock()
		l.emit(level, msg, countKey, 1, args)
		return
	}
	e := &entry{level: level, countKey: countKey}
	e.timer = time.AfterFunc(l.every, func() { l.flush(k) })
	l.entries[k] = e
	l.mu.Unlock()
	l.emit(level, msg, countKey, 1, args)
}

// flush ends an interval of k: what it counted goes out in one line and
// a new interval starts, or k is forgotten when nothing happened.
func (l *Limiter) flush(k entryKey) {
	l.mu.Lock()
	e := l.entries[k]
	if e == nil {
		l.mu.Unlock()
		return
	}
	n, args := e.n, e.args
	if n == 0 || l.stopped {
		delete(l.entries, k)
	} else {
		e.n, e.args = 0, nil
		e.timer.Reset(l.every)
	}
	l.mu.Unlock()
	if n > 0 {
		l.emit(e.level, k.msg, e.countKey, n, args)
	}
}

// Stop logs what was counted and not logged yet and stops the timers;
// later occurrences are logged one line each.
func (l *Limiter) Stop() {
	l.mu.Lock()
	l.stopped = true
	entries := l.entries
	l.entries = map[entryKey]*entry{}
	l.mu.Unlock()
	for k, e := range entries {
		e.timer.Stop()
		if e.n > 0 {
			l.emit(e.level, k.msg, e.countKey, e.n, e.args)
		}
	}
}

func (l *Limiter) emit(level slog.Level, msg, countKey string, n int, args []any) {
	all := make([]any, 0, len(args)+2)
	all = append(append(all, args...), countKey, n)
	l.log.Log(context.Background(), level, msg, all...)
}
