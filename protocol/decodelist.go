package protocol

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// DecodeListReply decodes a ListReply as json.Unmarshal does. A reply in
// the form ListReply.AppendJSON and json.Marshal write (known keys, once
// each, integers of digits) is read by a parser of that form, a few times
// faster than encoding/json, which took more than 100 ms over the reply
// of a node holding ten thousand sessions; anything else, malformed
// input included, goes to json.Unmarshal, with its result and its errors.
func DecodeListReply(b []byte, r *ListReply) error {
	var fast ListReply
	// The strings of the reply are parts of one copy of it, not one
	// allocation each: a list of ten thousand entries has ~100 000.
	p := listParser{b: b, s: string(b)}
	if p.listReply(&fast) && p.end() {
		*r = fast
		return nil
	}
	*r = ListReply{}
	return json.Unmarshal(b, r)
}

// listParser reads the plain form of a ListReply; each method reports
// false at anything outside it.
type listParser struct {
	b []byte
	s string // b as a string: the strings read share its memory
	i int
	// raw: the entries go to raws as ListEntry values
	// (DecodeListEntries), each read into scratch first; odd notes an
	// entry not in the form AppendDetails writes, nodeAt where its keys
	// nodeId and nodeName would go, lastKey its key read last.
	raw     bool
	raws    []ListEntry
	scratch Details
	odd     bool
	nodeAt  int
	lastKey string
	keyAt   int // where the key object handed to field last starts
	// fastEntry's key sequences (detailKeys indices): the entry's and
	// the one before's.
	keySeq, prevSeq []int8
}

func (p *listParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
			p.odd = true // AppendDetails writes none
		default:
			return
		}
	}
}

func (p *listParser) end() bool {
	p.ws()
	return p.i == len(p.b)
}

// byte consumes c, after whitespace.
func (p *listParser) byte(c byte) bool {
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// peek reports whether the next byte, after whitespace, is c.
func (p *listParser) peek(c byte) bool {
	p.ws()
	return p.i < len(p.b) && p.b[p.i] == c
}

// literal consumes the word w (null, true, false).
func (p *listParser) literal(w string) bool {
	p.ws()
	if len(p.b)-p.i >= len(w) && string(p.b[p.i:p.i+len(w)]) == w {
		p.i += len(w)
		return true
	}
	return false
}

// object reads an object, handing each key to field, which reads its
// value.
func (p *listParser) object(field func(key string) bool) bool {
	if !p.byte('{') {
		return false
	}
	if p.byte('}') {
		return true
	}
	for {
		p.ws()
		p.keyAt = p.i
		key, ok := p.plainKey()
		if !ok || !p.byte(':') || !field(key) {
			return false
		}
		if p.byte('}') {
			return true
		}
		if !p.byte(',') {
			return false
		}
	}
}

// plainKey reads a key of printable ASCII without escapes.
func (p *listParser) plainKey() (string, bool) {
	if !p.byte('"') {
		return "", false
	}
	start := p.i
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return p.s[start : p.i-1], true
		case c < 0x20 || c == '\\' || c >= utf8.RuneSelf:
			return "", false
		}
		p.i++
	}
	return "", false
}

// str reads a string value. Escapes and invalid UTF-8 are left to
// encoding/json's rules, applied to that string alone.
func (p *listParser) str() (string, bool) {
	if !p.byte('"') {
		return "", false
	}
	start := p.i - 1
	plain, ascii := true, true
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			tok := p.b[start:p.i]
			if plain && ascii {
				return p.s[start+1 : p.i-1], true
			}
			var s string
			if plain && utf8.Valid(tok) {
				s = p.s[start+1 : p.i-1]
			} else if json.Unmarshal(tok, &s) != nil {
				return "", false
			}
			p.checkString(tok, s)
			return s, true
		case c == '\\':
			plain = false
			p.i++ // the escaped byte cannot end the string
		case c < 0x20:
			return "", false
		case c >= utf8.RuneSelf:
			ascii = false
		}
		p.i++
	}
	return "", false
}

// digits reads an integer as JSON writes it: an optional minus, then
// digits without a leading zero.
func (p *listParser) digits() ([]byte, bool) {
	p.ws()
	start := p.i
	if p.i < len(p.b) && p.b[p.i] == '-' {
		p.i++
	}
	first := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	n := p.i - first
	if n == 0 || n > 1 && p.b[first] == '0' {
		return nil, false
	}
	if n == 1 && first > start && p.b[first] == '0' {
		p.odd = true // -0, written 0
	}
	if p.i < len(p.b) {
		switch p.b[p.i] {
		case '.', 'e', 'E':
			return nil, false // a number encoding/json may refuse for an integer
		}
	}
	return p.b[start:p.i], true
}

func (p *listParser) int64() (int64, bool) {
	d, ok := p.digits()
	if !ok {
		return 0, false
	}
	if neg := d[0] == '-'; len(d) <= 18 { // no overflow: add the digits up
		var n int64
		for _, c := range d[btoi(neg):] {
			n = n*10 + int64(c-'0')
		}
		if neg {
			n = -n
		}
		return n, true
	}
	n, err := strconv.ParseInt(p.s[p.i-len(d):p.i], 10, 64)
	return n, err == nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (p *listParser) uint64() (uint64, bool) {
	d, ok := p.digits()
	if !ok || d[0] == '-' {
		return 0, false
	}
	n, err := strconv.ParseUint(p.s[p.i-len(d):p.i], 10, 64)
	return n, err == nil
}

func (p *listParser) bool() (bool, bool) {
	switch {
	case p.literal("true"):
		return true, true
	case p.literal("false"):
		return false, true
	}
	return false, false
}

func (p *listParser) listReply(r *ListReply) bool {
	var seen [4]bool
	once := func(i int) bool {
		if seen[i] {
			return false // encoding/json's merging of repeated keys is its own
		}
		seen[i] = true
		return true
	}
	return p.object(func(key string) bool {
		var ok bool
		switch key {
		case "instance":
			if !once(0) {
				return false
			}
			r.Instance, ok = p.str()
		case "sessions":
			if !once(1) {
				return false
			}
			if p.literal("null") {
				return true
			}
			// As many as there are entries in the form AppendJSON
			// writes (a key's quotes cannot be inside a string, where
			// they are escaped): no regrowth of a slice of large
			// elements, and none too large to clear.
			n := bytes.Count(p.b[p.i:], []byte(`{"sessionKey":`))
			if p.raw {
				p.raws = make([]ListEntry, 0, n)
			} else {
				r.Sessions = make([]ListedSession, 0, n)
			}
			if !p.byte('[') {
				return false
			}
			if p.byte(']') {
				return true
			}
			for {
				var ok bool
				if p.raw {
					var key string // the one asked for
					before := len(p.raws)
					ok = p.listedSession(&key, nil)
					if ok && len(p.raws) == before {
						// No details: empty ones, as encoding/json decodes it.
						p.raws = append(p.raws, EntryOf(&Details{}))
					}
				} else {
					r.Sessions = append(r.Sessions, ListedSession{})
					s := &r.Sessions[len(r.Sessions)-1]
					ok = p.listedSession(&s.SessionKey, &s.Details)
				}
				if !ok {
					return false
				}
				if p.byte(']') {
					return true
				}
				if !p.byte(',') {
					return false
				}
			}
		case "total":
			if !once(2) {
				return false
			}
			var n int64
			n, ok = p.int64()
			r.Total = int(n)
			ok = ok && int64(r.Total) == n
		case "partial":
			if !once(3) {
				return false
			}
			r.Partial, ok = p.bool()
		}
		return ok
	})
}

func (p *listParser) listedSession(sessionKey *string, d *Details) bool {
	var seenKey, seenDetails bool
	return p.object(func(key string) bool {
		switch key {
		case "sessionKey":
			if seenKey {
				return false
			}
			seenKey = true
			var ok bool
			*sessionKey, ok = p.str()
			return ok
		case "details":
			if seenDetails {
				return false
			}
			seenDetails = true
			if p.raw {
				return p.rawEntry()
			}
			return p.details(d)
		}
		return false
	})
}

// details reads a list entry's details: the scalar fields and usage (a
// list entry has no lists inside; those take encoding/json's way).
func (p *listParser) details(d *Details) bool {
	p.lastKey = ""
	return p.object(func(key string) bool {
		if p.raw {
			if key <= p.lastKey {
				p.odd = true // out of AppendDetails's order, or twice
			}
			p.lastKey = key
			if p.nodeAt < 0 && key > "nodeName" {
				p.nodeAt = p.keyAt
			}
		}
		switch key {
		case "aggregated":
			return p.optString(&d.Aggregated)
		case "approvalId":
			return p.optString(&d.ApprovalID)
		case "approvalSlug":
			return p.optString(&d.ApprovalSlug)
		case "command":
			return p.optString(&d.Command)
		case "cwd":
			return p.optString(&d.Cwd)
		case "durationMs":
			return p.optInt64(&d.DurationMs)
		case "endedAt":
			return p.optInt64(&d.EndedAt)
		case "error":
			return p.optString(&d.Error)
		case "exitCode":
			return p.optInt(&d.ExitCode)
		case "exitReason":
			return p.optString(&d.ExitReason)
		case "exitSignal":
			return p.optString(&d.ExitSignal)
		case "expiresAtMs":
			return p.optInt64(&d.ExpiresAtMs)
		case "failureKind":
			return p.optString(&d.FailureKind)
		case "followUp":
			return p.optString(&d.FollowUp)
		case "host":
			return p.optString(&d.Host)
		case "idleMs":
			return p.optInt64(&d.IdleMs)
		case "lastOutputAt":
			return p.optInt64(&d.LastOutputAt)
		case "limit":
			return p.optInt(&d.Limit)
		case "lost":
			return p.optBool(&d.Lost)
		case "name":
			return p.optString(&d.Name)
		case "nextOffset":
			return p.optInt(&d.NextOffset)
		case "noOutputTimedOut":
			return p.optBool(&d.NoOutputTimedOut)
		case "nodeId":
			return p.optString(&d.NodeID)
		case "nodeName":
			return p.optString(&d.NodeName)
		case "offset":
			return p.optInt(&d.Offset)
		case "output":
			return p.optString(&d.Output)
		case "pid":
			return p.optInt(&d.PID)
		case "retryInMs":
			return p.optInt(&d.RetryInMs)
		case "runtimeMs":
			return p.optInt64(&d.RuntimeMs)
		case "sessionId":
			return p.optString(&d.SessionID)
		case "startedAt":
			return p.optInt64(&d.StartedAt)
		case "status":
			return p.optString(&d.Status)
		case "stdinWritable":
			return p.optBool(&d.StdinWritable)
		case "tail":
			return p.optString(&d.Tail)
		case "timedOut":
			return p.optBool(&d.TimedOut)
		case "total":
			return p.optInt(&d.Total)
		case "totalChars":
			return p.optInt(&d.TotalChars)
		case "totalLines":
			return p.optInt(&d.TotalLines)
		case "truncated":
			return p.optBool(&d.Truncated)
		case "usage":
			if p.literal("null") {
				d.Usage = Null[Usage]()
				return true
			}
			var u Usage
			p.ws()
			start := p.i
			if !p.usage(&u) {
				return false
			}
			if p.raw && !p.odd {
				var buf [160]byte
				p.odd = !bytes.Equal(appendUsage(buf[:0], &u), p.b[start:p.i])
			}
			d.Usage = Some(u)
			return true
		case "waitingForInput":
			return p.optBool(&d.WaitingForInput)
		}
		return false
	})
}

func (p *listParser) usage(u *Usage) bool {
	return p.object(func(key string) bool {
		var ok bool
		switch key {
		case "cpuUserMs":
			u.CPUUserMs, ok = p.int64()
		case "cpuSystemMs":
			u.CPUSystemMs, ok = p.int64()
		case "memoryPeakBytes", "pidsPeak":
			dst := &u.MemoryPeakBytes
			if key == "pidsPeak" {
				dst = &u.PidsPeak
			}
			if p.literal("null") {
				*dst = nil
				return true
			}
			var v uint64
			if v, ok = p.uint64(); ok {
				*dst = &v
			}
		case "scope":
			u.Scope, ok = p.str()
		}
		return ok
	})
}

func (p *listParser) optString(o *Opt[string]) bool {
	if p.literal("null") {
		*o = Null[string]()
		return true
	}
	s, ok := p.str()
	*o = Some(s)
	return ok
}

func (p *listParser) optInt64(o *Opt[int64]) bool {
	if p.literal("null") {
		*o = Null[int64]()
		return true
	}
	n, ok := p.int64()
	*o = Some(n)
	return ok
}

func (p *listParser) optInt(o *Opt[int]) bool {
	if p.literal("null") {
		*o = Null[int]()
		return true
	}
	n, ok := p.int64()
	*o = Some(int(n))
	return ok && int64(int(n)) == n
}

func (p *listParser) optBool(o *Opt[bool]) bool {
	if p.literal("null") {
		*o = Null[bool]()
		return true
	}
	v, ok := p.bool()
	*o = Some(v)
	return ok
}
