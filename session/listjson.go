package session

import (
	"bytes"
	"strconv"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// A node's list reply is written straight from its sessions: each entry's
// JSON is kept while nothing it shows changes (see listCache), so that a
// list of ten thousand sessions neither builds ten thousand Details (a
// kilobyte each, copied twice on the way) nor encodes them again; the
// garbage of that was most of what a list cost the node, in collections
// that scan every session's goroutine stacks.

// listCache is the encoded list entry of a session, valid while key
// matches what the session shows now. A running session's entry is kept
// in parts around the three figures that change with the clock alone
// (idleMs, runtimeMs, waitingForInput), which AppendListReply writes
// between them; a finished entry is one part.
type listCache struct {
	key   listKey
	buf   []byte    // the entry's JSON; parts are in it
	parts [4][]byte // running: before idleMs's value, before runtimeMs's, before waitingForInput's, after it; finished: parts[0]
	whole bool      // parts[0] is the whole entry (finished)
}

// listKey is what a list entry shows besides the clock: it changes on
// output (seq, lastOutput), when stdin closes, when the usage figure is
// read again, and at the exit.
type listKey struct {
	valid      bool
	exited     bool
	writable   bool
	seq        uint64
	lastOutput time.Time
	usageVer   uint64
	endedAt    time.Time
}

// The keys of the figures a running entry computes at each list, in the
// order AppendDetails writes them. A key's quote cannot be inside an
// encoded string, where every quote is escaped, so the first match is
// the key itself.
var runningFigureKeys = [3][]byte{[]byte(`"idleMs":`), []byte(`"runtimeMs":`), []byte(`"waitingForInput":`)}

// AppendListReply appends the JSON of the protocol.ListReply of
// scopeKey's sessions that List(scopeKey, limit) describes, answered by
// instance: byte for byte what ListReply.AppendJSON writes of it.
func (m *Manager) AppendListReply(dst []byte, scopeKey string, limit int, instance string) []byte {
	return m.appendListReply(dst, scopeKey, limit, instance, time.Now())
}

func (m *Manager) appendListReply(dst []byte, scopeKey string, limit int, instance string, now time.Time) []byte {
	page := ListPage{}
	if limit > 0 {
		page = ListPage{Paged: true, Limit: limit}
	}
	visible, total := m.listed(scopeKey, page)
	dst = append(dst, `{"instance":`...)
	dst = protocol.AppendJSONString(dst, instance)
	dst = append(dst, `,"sessions":[`...)
	var prefix []byte
	prefix = append(prefix, `{"sessionKey":`...)
	prefix = protocol.AppendJSONString(prefix, scopeKey)
	prefix = append(prefix, `,"details":`...)
	n := 0
	var stale []*session
	round := listRound{m: m}
	for _, s := range visible {
		mark := len(dst)
		if n > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, prefix...)
		var ok, old bool
		dst, ok, old = s.appendListEntry(dst, now, &round)
		if !ok { // swept since it was counted
			dst = dst[:mark]
		} else {
			dst = append(dst, '}')
			n++
		}
		if old {
			stale = append(stale, s)
		}
	}
	m.refreshUsage(stale)
	if limit <= 0 {
		total = n
	}
	dst = append(dst, `],"total":`...)
	dst = strconv.AppendInt(dst, int64(total), 10)
	if total > n {
		dst = append(dst, `,"partial":true`...)
	}
	return append(dst, '}')
}

// appendListEntry appends the JSON of the session's list entry at now,
// from its cache when that is still valid; ok and stale are listEntry's.
func (s *session) appendListEntry(dst []byte, now time.Time, r *listRound) (_ []byte, ok, stale bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.listedLocked() {
		return dst, false, false
	}
	if !s.exited {
		_, stale = s.listUsageLocked(now, r) // reads it itself when too old
	}
	key := listKey{valid: true, exited: s.exited, writable: s.writableLocked(), seq: s.out.seq,
		lastOutput: s.lastOutput, usageVer: s.listUsageVer, endedAt: s.endedAt}
	c := &s.listJSON
	if c.key != key {
		c.key = key
		s.encodeListEntryLocked(now) // clears the key when the entry cannot be kept
	}
	if c.whole {
		return append(dst, c.parts[0]...), true, stale
	}
	f := s.factsLocked(now)
	dst = append(dst, c.parts[0]...)
	dst = strconv.AppendInt(dst, f.idleMs, 10)
	dst = append(dst, c.parts[1]...)
	dst = strconv.AppendInt(dst, now.Sub(s.startedAt).Milliseconds(), 10)
	dst = append(dst, c.parts[2]...)
	dst = strconv.AppendBool(dst, f.waitingForInput)
	return append(dst, c.parts[3]...), true, stale
}

// encodeListEntryLocked fills the session's list cache with its entry at
// now. Caller holds s.mu; the session is listed.
func (s *session) encodeListEntryLocked(now time.Time) {
	d := s.listDetailsLocked(now)
	c := &s.listJSON
	c.buf = protocol.AppendDetails(c.buf[:0], &d)
	c.parts, c.whole = [4][]byte{c.buf}, true
	if s.exited {
		return
	}
	// Cut out the figures that change with the clock: each is a number
	// or a boolean, ending at the next ',' or '}'.
	var parts [4][]byte
	rest := c.buf
	for i, k := range runningFigureKeys {
		at := bytes.Index(rest, k)
		if at < 0 {
			c.key = listKey{} // not the form of a running entry: never kept
			return
		}
		at += len(k)
		parts[i] = rest[:at:at]
		rest = rest[at+bytes.IndexAny(rest[at:], ",}"):]
	}
	parts[3] = rest
	c.parts, c.whole = parts, false
}
