package protocol

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
	"unsafe"
)

// A gateway's whole process list of ten thousand sessions is about 4 MB
// of entries that its hosts have already encoded. Decoding them into
// Details (a kilobyte each) and encoding them again for the answer was
// most of what a list cost the gateway; a ListEntry keeps each entry's
// JSON as the host wrote it, with the few fields the gateway merges and
// writes the list text from, and ListResult writes the answer from those
// bytes. An entry is kept as written only when it is in the form
// AppendDetails writes (keys in order, no space, strings and numbers as
// AppendDetails writes them), so the answer is byte for byte the one of
// the decoded entries; any other entry is encoded again from its value.

// ListEntry is one entry of a process list as a gateway merges it: the
// JSON of its details and the fields it sorts by and writes the text
// from. Make one with DecodeListEntries or EntryOf.
type ListEntry struct {
	// JSON is the details object, as AppendDetails writes it.
	JSON []byte
	// The fields of the details the list text and order need.
	SessionID, Status, Name, Command, ExitReason string
	StartedAt                                    int64
	RuntimeMs                                    Opt[int64]
	WaitingForInput                              bool

	// nodeAt is where in JSON the keys nodeId and nodeName go (the
	// first key after them, or the closing brace); -1 when JSON has
	// either key already (SetNode then encodes the entry again).
	nodeAt           int
	named            bool // SetNode named the node, written at nodeAt
	nodeID, nodeName string
}

// EntryOf is the list entry of d.
func EntryOf(d *Details) ListEntry {
	e := ListEntry{JSON: AppendDetails(nil, d)}
	e.fill(d)
	e.nodeAt = -1
	if d.NodeID.IsZero() && d.NodeName.IsZero() {
		e.nodeAt = nodeKeyAt(e.JSON)
	}
	return e
}

// fill copies the fields of d that an entry keeps.
func (e *ListEntry) fill(d *Details) {
	e.SessionID, e.Status, e.Name, e.Command, e.ExitReason = d.SessionID.Value(), d.Status.Value(), d.Name.Value(), d.Command.Value(), d.ExitReason.Value()
	e.StartedAt = d.StartedAt.Value()
	e.RuntimeMs = d.RuntimeMs
	e.WaitingForInput = d.WaitingForInput.Value()
}

// nodeKeyAt is where the keys nodeId and nodeName go in a details object
// that has neither, as AppendDetails writes it: before its first key that
// sorts after them, else before the closing brace.
func nodeKeyAt(b []byte) int {
	p := listParser{b: b, s: string(b)}
	at := len(b) - 1
	if !p.byte('{') {
		return at
	}
	for !p.peek('}') {
		start := p.i
		key, ok := p.plainKey()
		if !ok || !p.byte(':') {
			return len(b) - 1
		}
		if key > "nodeName" {
			return start
		}
		if !p.skipValue() || !p.byte(',') && !p.peek('}') {
			return len(b) - 1
		}
	}
	return p.i
}

// skipValue reads past one value of a details object, without keeping
// it.
func (p *listParser) skipValue() bool {
	p.ws()
	if p.i >= len(p.b) {
		return false
	}
	switch c := p.b[p.i]; {
	case c == '"':
		_, ok := p.str()
		return ok
	case c == '{':
		return p.object(func(string) bool { return p.skipValue() })
	case c == '[':
		p.i++
		if p.byte(']') {
			return true
		}
		for p.skipValue() {
			if p.byte(']') {
				return true
			}
			if !p.byte(',') {
				return false
			}
		}
		return false
	case c == 't' || c == 'f':
		_, ok := p.bool()
		return ok
	case c == 'n':
		return p.literal("null")
	default:
		_, ok := p.digits()
		return ok
	}
}

// SetNode names the node that holds the entry's session (details nodeId
// and, when name is not empty, nodeName), as a gateway does for the
// entries a node lists.
func (e *ListEntry) SetNode(id, name string) {
	if e.nodeAt >= 0 {
		e.named, e.nodeID, e.nodeName = true, id, name
		return
	}
	d, err := DecodeDetails(e.JSON)
	if err != nil { // not from EntryOf or DecodeListEntries
		return
	}
	d.NodeID = Some(id)
	if name != "" {
		d.NodeName = Some(name)
	}
	e.JSON = AppendDetails(nil, &d)
	e.fill(&d)
}

// AppendJSON appends the entry's details object.
func (e *ListEntry) AppendJSON(dst []byte) []byte {
	if !e.named {
		return append(dst, e.JSON...)
	}
	at := e.nodeAt
	dst = append(dst, e.JSON[:at]...)
	closing := e.JSON[at] == '}'
	if closing && e.JSON[at-1] != '{' {
		dst = append(dst, ',')
	}
	dst = append(dst, `"nodeId":`...)
	dst = AppendJSONString(dst, e.nodeID)
	if e.nodeName != "" {
		dst = append(dst, `,"nodeName":`...)
		dst = AppendJSONString(dst, e.nodeName)
	}
	if !closing {
		dst = append(dst, ',')
	}
	return append(dst, e.JSON[at:]...)
}

// Details decodes the entry.
func (e *ListEntry) Details() Details {
	d, _ := DecodeDetails(e.JSON) // valid: written by AppendDetails, or checked as its form
	e.setNodeIn(&d)
	return d
}

// setNodeIn sets in d, the entry's JSON decoded, what SetNode named.
func (e *ListEntry) setNodeIn(d *Details) {
	if e.named {
		d.NodeID = Some(e.nodeID)
		if e.nodeName != "" {
			d.NodeName = Some(e.nodeName)
		}
	}
}

// DecodeDetails decodes one details object as json.Unmarshal does.
func DecodeDetails(b []byte) (Details, error) {
	var d Details
	p := listParser{b: b, s: string(b)}
	if p.details(&d) && p.end() {
		return d, nil
	}
	d = Details{}
	err := json.Unmarshal(b, &d)
	return d, err
}

// ListEntries is a ListReply with its entries kept as ListEntry values:
// what a gateway merges (each entry's sessionKey is the one it asked for).
type ListEntries struct {
	Instance string
	Entries  []ListEntry // nil when the reply's sessions are null
	Total    int
	Partial  bool
}

// DecodeListEntries decodes a ListReply as DecodeListReply does, keeping
// its entries as ListEntry values that share b's memory (b must not
// change afterwards): entry i's Details() is DecodeListReply's
// Sessions[i].Details.
func DecodeListEntries(b []byte) (ListEntries, error) {
	var fast ListReply
	// The strings read share b's memory too, as the entries' JSON does:
	// a whole list's reply is megabytes, and b may not change anyway.
	p := listParser{b: b, s: unsafe.String(unsafe.SliceData(b), len(b)), raw: true}
	if p.listReply(&fast) && p.end() {
		return ListEntries{Instance: fast.Instance, Entries: p.raws, Total: fast.Total, Partial: fast.Partial}, nil
	}
	var r ListReply
	if err := json.Unmarshal(b, &r); err != nil {
		return ListEntries{}, err
	}
	out := ListEntries{Instance: r.Instance, Total: r.Total, Partial: r.Partial}
	if r.Sessions != nil {
		out.Entries = make([]ListEntry, len(r.Sessions))
		for i := range r.Sessions {
			out.Entries[i] = EntryOf(&r.Sessions[i].Details)
		}
	}
	return out, nil
}

// rawEntry reads the details of a list entry in raw mode: into the
// parser's scratch Details, keeping the entry's JSON when it is in the
// form AppendDetails writes, else its encoding from the value.
func (p *listParser) rawEntry() bool {
	p.ws()
	var fast ListEntry
	if p.fastEntry(&fast) {
		p.raws = append(p.raws, fast)
		return true
	}
	start := p.i
	p.scratch = Details{}
	p.odd, p.nodeAt = false, -1
	if !p.details(&p.scratch) {
		return false
	}
	d := &p.scratch
	e := ListEntry{JSON: p.b[start:p.i:p.i], nodeAt: p.nodeAt}
	e.fill(d)
	if p.odd || !d.NodeID.IsZero() || !d.NodeName.IsZero() {
		e = EntryOf(d)
	} else if e.nodeAt < 0 {
		e.nodeAt = len(e.JSON) - 1 // no key after nodeName
	} else {
		e.nodeAt -= start
	}
	p.raws = append(p.raws, e)
	return true
}

// checkString notes an entry whose string token tok (quotes included),
// decoded to s, is not what AppendJSONString writes of s.
func (p *listParser) checkString(tok []byte, s string) {
	if !p.raw || p.odd {
		return
	}
	var buf [64]byte
	if !bytes.Equal(AppendJSONString(buf[:0], s), tok) {
		p.odd = true
	}
}

// ListResult is the result of a process list with its entries kept as
// ListEntry values: Result() is the Result, and AppendJSON writes its
// JSON from the entries' bytes.
type ListResult struct {
	// Text is the result's one text content.
	Text string
	// Details are the result's details but for sessions, which Entries
	// are.
	Details Details
	Entries []ListEntry
}

// Result is the list's Result, every entry decoded (their strings from
// one copy of all of them, not one each).
func (r *ListResult) Result() Result {
	n := 0
	for i := range r.Entries {
		n += len(r.Entries[i].JSON)
	}
	all := make([]byte, 0, n)
	for i := range r.Entries {
		all = append(all, r.Entries[i].JSON...)
	}
	p := listParser{b: all, s: string(all)}
	sessions := make([]Details, len(r.Entries))
	for i := range r.Entries {
		e := &r.Entries[i]
		start := p.i
		if d := &sessions[i]; !p.details(d) || p.i != start+len(e.JSON) {
			*d = e.Details()
			p.i = start + len(e.JSON)
			continue
		}
		e.setNodeIn(&sessions[i])
	}
	d := r.Details
	d.Sessions = Some(sessions)
	return TextResult(r.Text, d)
}

// AppendJSON appends what Result().AppendJSON would.
func (r *ListResult) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"content":[{"type":"text","text":`...)
	dst = AppendJSONString(dst, r.Text)
	dst = append(dst, `}],"details":`...)
	// The details with no sessions, and the entries where their empty
	// list is: a key's quotes are escaped inside a string, so the first
	// match is the key.
	d := r.Details
	d.Sessions = Some([]Details{})
	mark := len(dst)
	dst = AppendDetails(dst, &d)
	at := mark + bytes.Index(dst[mark:], []byte(`"sessions":[]`)) + len(`"sessions":[`)
	tail := append([]byte(nil), dst[at:]...)
	dst = dst[:at]
	for i := range r.Entries {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = r.Entries[i].AppendJSON(dst)
	}
	dst = append(dst, tail...)
	return append(dst, '}')
}

// JSONSize is about the length of the list's JSON, for sizing a buffer.
func (r *ListResult) JSONSize() int {
	n := 256 + 2*len(r.Text)
	for i := range r.Entries {
		n += len(r.Entries[i].JSON) + 64
	}
	return n
}

// The kinds of value a details key of a list entry has, for fastEntry.
const (
	kindNone   = iota // not a key fastEntry reads: the slow path decides
	kindString        // a string or null
	kindInt           // an integer or null
	kindBool          // true, false or null
	kindUsage         // a Usage or null
)

// detailKeys are the keys of Details in the order AppendDetails writes
// them (TestDetailKeys checks them against the type), with the kind of
// value fastEntry reads; the lists, and nodeId and nodeName (SetNode
// needs them absent), are left to the slow path.
var detailKeys = [...]struct {
	key  string
	kind int
}{
	{"added", kindNone}, {"aggregated", kindString}, {"approvalId", kindString}, {"approvalSlug", kindString},
	{"command", kindString}, {"cwd", kindString}, {"deleted", kindNone}, {"durationMs", kindInt},
	{"endedAt", kindInt}, {"error", kindString}, {"exitCode", kindInt}, {"exitReason", kindString},
	{"exitSignal", kindString}, {"expiresAtMs", kindInt}, {"failureKind", kindString}, {"followUp", kindString},
	{"host", kindString}, {"idleMs", kindInt}, {"lastOutputAt", kindInt}, {"limit", kindInt},
	{"lost", kindBool}, {"modified", kindNone}, {"moved", kindNone}, {"name", kindString},
	{"nextOffset", kindInt}, {"noOutputTimedOut", kindBool}, {"nodeId", kindNone}, {"nodeName", kindNone},
	{"offset", kindInt}, {"output", kindString}, {"pid", kindInt}, {"retryInMs", kindInt},
	{"runtimeMs", kindInt}, {"sessionId", kindString}, {"sessions", kindNone}, {"startedAt", kindInt},
	{"status", kindString}, {"stdinWritable", kindBool}, {"tail", kindString}, {"timedOut", kindBool},
	{"total", kindInt}, {"totalChars", kindInt}, {"totalLines", kindInt}, {"truncated", kindBool},
	{"usage", kindUsage}, {"waitingForInput", kindBool},
}

// The indices in detailKeys of the keys a ListEntry keeps, and of the
// last key before where SetNode's keys go.
const (
	keyCommand         = 4
	keyExitReason      = 11
	keyName            = 23
	keyNodeName        = 27
	keyRuntimeMs       = 32
	keySessionID       = 33
	keyStartedAt       = 35
	keyStatus          = 36
	keyWaitingForInput = 45
)

// detailKey is the index of k in detailKeys, or -1. Entries of one host
// have their keys in the same sequence: the key at the same place in
// the entry before (seq) is tried first.
func detailKey(k string, j int, seq []int8) int {
	if j < len(seq) && detailKeys[seq[j]].key == k {
		return int(seq[j])
	}
	lo, hi := 0, len(detailKeys)
	for lo < hi {
		m := (lo + hi) / 2
		switch {
		case detailKeys[m].key == k:
			return m
		case detailKeys[m].key < k:
			lo = m + 1
		default:
			hi = m
		}
	}
	return -1
}

// fastEntry reads, from p.i, a details object in the form AppendDetails
// writes as a list entry has it, keeping what e needs; at anything else
// it reports false with p.i unchanged, and rawEntry takes the general
// way. A tight scan of each byte, it is most of what reading a list of
// ten thousand entries costs.
func (p *listParser) fastEntry(e *ListEntry) bool {
	b, i := p.b, p.i
	start := i
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i++
	e.nodeAt = -1
	if i < len(b) && b[i] == '}' {
		i++
		e.JSON, e.nodeAt = b[start:i:i], i-1-start
		p.i = i
		return true
	}
	last := -1
	p.keySeq = p.keySeq[:0]
	for j := 0; ; j++ {
		// A key: plain ASCII, after the one before it.
		if i >= len(b) || b[i] != '"' {
			return false
		}
		ks := i + 1
		i = ks
		for i < len(b) && b[i] != '"' {
			if b[i] < 0x20 || b[i] == '\\' || b[i] >= utf8.RuneSelf {
				return false
			}
			i++
		}
		if i+1 >= len(b) || b[i+1] != ':' {
			return false
		}
		k := detailKey(p.s[ks:i], j, p.prevSeq)
		if k <= last { // unknown, out of order or twice
			return false
		}
		last = k
		p.keySeq = append(p.keySeq, int8(k))
		if e.nodeAt < 0 && k > keyNodeName {
			e.nodeAt = ks - 1 - start
		}
		i += 2
		var ok bool
		switch detailKeys[k].kind {
		case kindString:
			var vs, ve int
			if vs, ve, ok = p.fastString(i); ok {
				var dst *string
				switch k {
				case keySessionID:
					dst = &e.SessionID
				case keyStatus:
					dst = &e.Status
				case keyName:
					dst = &e.Name
				case keyCommand:
					dst = &e.Command
				case keyExitReason:
					dst = &e.ExitReason
				}
				if dst != nil {
					if *dst, ok = p.fastStringValue(vs, ve); !ok {
						return false
					}
				}
				i = ve
			}
		case kindInt:
			if nullAt(b, i) {
				i += 4
				ok = true
				if k == keyRuntimeMs {
					e.RuntimeMs = Null[int64]()
				}
				break
			}
			var n int64
			if n, i, ok = fastInt(b, i); ok {
				switch k {
				case keyStartedAt:
					e.StartedAt = n
				case keyRuntimeMs:
					e.RuntimeMs = Some(n)
				}
			}
		case kindBool:
			switch {
			case bytes.HasPrefix(b[i:], []byte("true")):
				i, ok = i+4, true
				if k == keyWaitingForInput {
					e.WaitingForInput = true
				}
			case bytes.HasPrefix(b[i:], []byte("false")):
				i, ok = i+5, true
			case nullAt(b, i):
				i, ok = i+4, true
			}
		case kindUsage:
			if nullAt(b, i) {
				i, ok = i+4, true
				break
			}
			i, ok = p.fastUsage(i)
		}
		if !ok || i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i++
			continue
		case '}':
			i++
			if e.nodeAt < 0 {
				e.nodeAt = i - 1 - start
			}
			e.JSON = b[start:i:i]
			p.i = i
			p.prevSeq, p.keySeq = p.keySeq, p.prevSeq
			return true
		}
		return false
	}
}

// plainByte tells the bytes a JSON string holds as they are: printable
// ASCII but for the quote and the backslash.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func nullAt(b []byte, i int) bool { return len(b)-i >= 4 && string(b[i:i+4]) == "null" }

// fastInt reads at i an integer as AppendDetails writes one that fits
// any integer field (at most 18 digits, no leading zero, no -0), and
// returns it and where it ends.
func fastInt(b []byte, i int) (n int64, end int, ok bool) {
	neg := i < len(b) && b[i] == '-'
	if neg {
		i++
	}
	first := i
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		n = n*10 + int64(b[i]-'0')
		i++
	}
	digits := i - first
	if digits == 0 || digits > 18 || b[first] == '0' && (digits > 1 || neg) {
		return 0, 0, false
	}
	if neg {
		n = -n
	}
	return n, i, true
}

// fastString checks at i a string or null as AppendJSONString writes
// it, and returns the span of its token (quotes included; empty for
// null): printable ASCII, the escapes it writes, valid UTF-8 other than
// U+2028 and U+2029.
func (p *listParser) fastString(i int) (start, end int, ok bool) {
	b := p.b
	if nullAt(b, i) {
		return i, i + 4, true
	}
	if i >= len(b) || b[i] != '"' {
		return 0, 0, false
	}
	start = i
	i++
	for i < len(b) {
		for i < len(b) && plainByte[b[i]] {
			i++
		}
		if i >= len(b) {
			break
		}
		c := b[i]
		switch {
		case c == '"':
			return start, i + 1, true
		case c == '\\':
			if i+1 >= len(b) {
				return 0, 0, false
			}
			switch b[i+1] {
			case '"', '\\', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if len(b)-i < 6 || !canonicalEscape(string(b[i+2:i+6])) {
					return 0, 0, false
				}
				i += 6
			default:
				return 0, 0, false
			}
		case c < 0x20:
			return 0, 0, false
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
				return 0, 0, false
			}
			i += size
		default:
			i++
		}
	}
	return 0, 0, false
}

// canonicalEscape reports whether \u followed by hex is how
// AppendJSONString writes a character: a control character without a
// short escape, U+2028 or U+2029, in lower case.
func canonicalEscape(hex string) bool {
	if hex == "2028" || hex == "2029" {
		return true
	}
	if hex[0] != '0' || hex[1] != '0' || (hex[2] != '0' && hex[2] != '1') {
		return false
	}
	c := hex[3]
	var v byte
	switch {
	case c >= '0' && c <= '9':
		v = c - '0'
	case c >= 'a' && c <= 'f':
		v = c - 'a' + 10
	default:
		return false
	}
	v += (hex[2] - '0') << 4
	switch v {
	case '\b', '\f', '\n', '\r', '\t':
		return false
	}
	return true
}

// fastStringValue is the value of the token fastString found at
// [start, end): "" for null.
func (p *listParser) fastStringValue(start, end int) (string, bool) {
	tok := p.b[start:end]
	if tok[0] == 'n' {
		return "", true
	}
	if bytes.IndexByte(tok, '\\') < 0 {
		return p.s[start+1 : end-1], true
	}
	var s string
	err := json.Unmarshal(tok, &s)
	return s, err == nil
}

// fastUsage reads at i a usage object as appendUsage writes it and
// returns where it ends.
func (p *listParser) fastUsage(i int) (int, bool) {
	b := p.b
	field := func(i int, key string) (int, bool) {
		if !bytes.HasPrefix(b[i:], []byte(key)) {
			return 0, false
		}
		_, end, ok := fastInt(b, i+len(key))
		return end, ok
	}
	var ok bool
	if i, ok = field(i, `{"cpuUserMs":`); !ok {
		return 0, false
	}
	if i, ok = field(i, `,"cpuSystemMs":`); !ok {
		return 0, false
	}
	for _, k := range []string{`,"memoryPeakBytes":`, `,"pidsPeak":`} {
		if bytes.HasPrefix(b[i:], []byte(k)) {
			if len(b) > i+len(k) && b[i+len(k)] == '-' {
				return 0, false
			}
			if i, ok = field(i, k); !ok {
				return 0, false
			}
		}
	}
	if !bytes.HasPrefix(b[i:], []byte(`,"scope":"`)) {
		return 0, false
	}
	_, end, ok := p.fastString(i + len(`,"scope":`))
	if !ok || end >= len(b) || b[end] != '}' {
		return 0, false
	}
	return end + 1, true
}
