package protocol

import (
	"bytes"
	"encoding/json"
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
	nodeID, nodeName string // set by SetNode, written at nodeAt
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
		e.nodeID, e.nodeName = id, name
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
	if e.nodeID == "" && e.nodeName == "" {
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
	if e.nodeID != "" || e.nodeName != "" {
		d.NodeID = Some(e.nodeID)
		if e.nodeName != "" {
			d.NodeName = Some(e.nodeName)
		}
	}
	return d
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
	p := listParser{b: b, s: string(b), raw: true}
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

// Result is the list's Result, every entry decoded.
func (r *ListResult) Result() Result {
	d := r.Details
	s := make([]Details, len(r.Entries))
	for i := range r.Entries {
		s[i] = r.Entries[i].Details()
	}
	d.Sessions = Some(s)
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
