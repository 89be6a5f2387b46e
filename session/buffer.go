package session

import (
	"encoding/binary"
	"strings"
)

// A session keeps its output twice, as OpenClaw does (spec §10.3):
//
//   - retained: the last MaxOutputChars units of everything, which log,
//     tail and the results' aggregated come from;
//   - pending: per stream, the last min(PendingMaxOutputChars,
//     MaxOutputChars) units not yet returned by poll, drained in arrival
//     order with stdout and stderr interleaved.
//
// Caps drop the oldest text and never block the writer. The buffers store
// UTF-8 and count UTF-16 units alongside, because the caps are defined in
// JavaScript string lengths. Appending is amortised O(len(chunk)): text is
// appended to a byte slice whose dead prefix is reclaimed only once it is
// as large as the live text, and cuts at the front work on segment
// bookkeeping (whole appended pieces) so that pure ASCII output is never
// rescanned.

// segMergeBytes is the size under which a new piece is merged into the
// previous segment, which bounds the bookkeeping for output that arrives in
// tiny writes.
const segMergeBytes = 8 << 10

// seg describes consecutive bytes of a textRing.
type seg struct {
	n     int    // bytes
	units int    // UTF-16 units
	ascii bool   // every byte < 0x80, so units == n
	seq   uint64 // arrival order of its first piece (pending rings)
}

// textRing is a growable window over the newest text of a stream.
type textRing struct {
	buf   []byte // live text is buf[start:]
	start int
	units int
	segs  []seg // live segments are segs[head:]
	head  int
}

func (r *textRing) live() []byte { return r.buf[r.start:] }

func (r *textRing) reset() {
	r.buf, r.start, r.units = r.buf[:0], 0, 0
	r.segs, r.head = r.segs[:0], 0
}

// add appends p (units long); merge allows joining it to the last segment.
func (r *textRing) add(p []byte, units int, ascii bool, seq uint64, merge bool) {
	if len(p) == 0 {
		return
	}
	if r.start > 0 && len(r.buf)+len(p) > cap(r.buf) && r.start >= len(r.buf)-r.start {
		// Reclaim the dead prefix. It is at least as large as what is
		// copied, so every byte is copied O(1) times amortised.
		n := copy(r.buf, r.buf[r.start:])
		r.buf, r.start = r.buf[:n], 0
	}
	r.buf = append(r.buf, p...)
	r.units += units
	if merge && len(r.segs) > r.head {
		if last := &r.segs[len(r.segs)-1]; last.n < segMergeBytes {
			last.n += len(p)
			last.units += units
			last.ascii = last.ascii && ascii
			return
		}
	}
	if r.head > 0 && len(r.segs) == cap(r.segs) && r.head >= len(r.segs)-r.head {
		n := copy(r.segs, r.segs[r.head:])
		r.segs, r.head = r.segs[:n], 0
	}
	r.segs = append(r.segs, seg{n: len(p), units: units, ascii: ascii, seq: seq})
}

// dropFront removes at least excess units from the front; a surrogate pair
// straddling the cut goes entirely (so one unit more may go). It returns
// the units removed.
func (r *textRing) dropFront(excess int) int {
	dropped := 0
	for dropped < excess && r.head < len(r.segs) {
		s := &r.segs[r.head]
		need := excess - dropped
		if s.units <= need {
			r.start += s.n
			r.units -= s.units
			dropped += s.units
			r.head++
			continue
		}
		nb, nu := need, need
		if !s.ascii {
			nb, nu = prefixForUnits(r.buf[r.start:r.start+s.n], need)
		}
		s.n -= nb
		s.units -= nu
		r.start += nb
		r.units -= nu
		dropped += nu
	}
	if r.head == len(r.segs) {
		r.reset()
	}
	return dropped
}

// tail returns the last n units (fewer when a surrogate pair straddles the
// cut), as a new string.
func (r *textRing) tail(n int) string {
	if r.units <= n {
		return string(r.live())
	}
	off := len(r.buf)
	need := n
	for i := len(r.segs) - 1; i >= r.head && need > 0; i-- {
		s := r.segs[i]
		if s.units <= need {
			off -= s.n
			need -= s.units
			continue
		}
		if s.ascii {
			off -= need
			break
		}
		start, _ := suffixForUnits(r.buf[off-s.n:off], need)
		off -= s.n - start
		break
	}
	return string(r.buf[off:])
}

// suffixUnits returns the longest suffix of p that is at most n units and
// does not start inside a surrogate pair, with its unit count.
func suffixUnits(p []byte, units int, ascii bool, n int) ([]byte, int) {
	if units <= n {
		return p, units
	}
	if ascii {
		if len(p) < n {
			// The sanitizer already cut p to the newest output (keep).
			return p, len(p)
		}
		return p[len(p)-n:], n
	}
	start, got := suffixForUnits(p, n)
	return p[start:], got
}

// The text in the buffers is valid UTF-8 (the sanitizer guarantees it), so
// UTF-16 lengths follow from the lead bytes alone: one unit per character,
// two for 4-byte characters. The scans below use that instead of decoding.

// prefixForUnits returns the shortest prefix of b (valid UTF-8) that holds
// at least need UTF-16 units, and its units. A 4-byte character that
// straddles need is taken whole, so units may be need+1.
func prefixForUnits(b []byte, need int) (n, units int) {
	for n < len(b) && units < need {
		if n+8 <= len(b) && units+8 <= need && binary.LittleEndian.Uint64(b[n:])&highs == 0 {
			n += 8
			units += 8
			continue
		}
		switch c := b[n]; {
		case c < 0x80:
			n, units = n+1, units+1
		case c < 0xE0:
			n, units = n+2, units+1
		case c < 0xF0:
			n, units = n+3, units+1
		default:
			n, units = n+4, units+2
		}
	}
	return min(n, len(b)), units
}

// suffixForUnits returns where the longest suffix of b (valid UTF-8) with
// at most n UTF-16 units starts, and its units; a 4-byte character that
// would exceed n is left out.
func suffixForUnits(b []byte, n int) (start, units int) {
	start = len(b)
	for start > 0 && units < n {
		if start >= 8 && units+8 <= n && binary.LittleEndian.Uint64(b[start-8:])&highs == 0 {
			start -= 8
			units += 8
			continue
		}
		j := start - 1
		for j > 0 && b[j]&0xC0 == 0x80 {
			j--
		}
		w := 1
		if b[j] >= 0xF0 {
			w = 2
		}
		if units+w > n {
			break
		}
		units += w
		start = j
	}
	return start, units
}

// Output streams.
const (
	streamStdout = 0
	streamStderr = 1
)

// outputBuffer is a session's output state. It is not safe for concurrent
// use; the session's mutex guards it.
type outputBuffer struct {
	maxChars   int // retained cap
	pendingCap int // per-stream pending cap: min(pending, retained)

	retained   textRing
	pending    [2]textRing
	lastStream int // stream of the newest pending piece, -1 after a drain
	seq        uint64

	total     int64 // units ever appended (totalOutputChars)
	truncated bool  // something was dropped by a cap
	dropped   bool  // pending output was dropped since the last drain
	frozen    bool  // the process exited: nothing more is appended
}

func newOutputBuffer(maxChars, pendingChars int) outputBuffer {
	return outputBuffer{maxChars: maxChars, pendingCap: min(pendingChars, maxChars), lastStream: -1}
}

// append adds one sanitized piece of output (units UTF-16 units long).
func (b *outputBuffer) append(stream int, p []byte, units int, ascii bool) {
	if b.frozen || len(p) == 0 {
		return
	}
	b.seq++
	b.total += int64(units)

	pr := &b.pending[stream]
	if units > b.pendingCap {
		// The piece alone overflows: older text of this stream goes
		// entirely and only the piece's own tail stays.
		pr.reset()
		q, qu := suffixUnits(p, units, ascii, b.pendingCap)
		pr.add(q, qu, ascii, b.seq, false)
		b.truncated, b.dropped = true, true
	} else {
		pr.add(p, units, ascii, b.seq, b.lastStream == stream)
		if pr.units > b.pendingCap {
			pr.dropFront(pr.units - b.pendingCap)
			b.truncated, b.dropped = true, true
		}
	}
	b.lastStream = stream

	if units >= b.maxChars {
		cut := units > b.maxChars || b.retained.units > 0
		b.retained.reset()
		q, qu := suffixUnits(p, units, ascii, b.maxChars)
		b.retained.add(q, qu, ascii, 0, false)
		b.truncated = b.truncated || cut || qu < units
		return
	}
	b.retained.add(p, units, ascii, 0, true)
	if b.retained.units > b.maxChars {
		b.retained.dropFront(b.retained.units - b.maxChars)
		b.truncated = true
	}
}

// hasPending reports whether a poll would return new output.
func (b *outputBuffer) hasPending() bool {
	return b.pending[0].units > 0 || b.pending[1].units > 0 || b.dropped
}

// drain returns the unread output in arrival order and whether some of it
// was dropped since the last drain, and empties the pending buffers.
func (b *outputBuffer) drain() (string, bool) {
	out, err := &b.pending[streamStdout], &b.pending[streamStderr]
	var sb strings.Builder
	sb.Grow(len(out.live()) + len(err.live()))
	oi, ei := out.head, err.head
	ooff, eoff := out.start, err.start
	for oi < len(out.segs) || ei < len(err.segs) {
		if ei >= len(err.segs) || (oi < len(out.segs) && out.segs[oi].seq < err.segs[ei].seq) {
			n := out.segs[oi].n
			sb.Write(out.buf[ooff : ooff+n])
			ooff += n
			oi++
			continue
		}
		n := err.segs[ei].n
		sb.Write(err.buf[eoff : eoff+n])
		eoff += n
		ei++
	}
	dropped := b.dropped
	out.reset()
	err.reset()
	b.dropped = false
	b.lastStream = -1
	return sb.String(), dropped
}

// aggregated returns the retained output.
func (b *outputBuffer) aggregated() string { return string(b.retained.live()) }

// tail returns the last 2000 units of the retained output.
func (b *outputBuffer) tail() string { return b.retained.tail(tailChars) }

// retainedUnits is the JavaScript length of the retained output.
func (b *outputBuffer) retainedUnits() int { return b.retained.units }

// lostOutput reports whether output was discarded at the retention cap and
// cannot be recovered with log (totalOutputChars > aggregated.length).
func (b *outputBuffer) lostOutput() bool { return b.total > int64(b.retained.units) }
