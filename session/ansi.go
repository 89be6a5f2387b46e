package session

import (
	"bytes"
	"encoding/binary"
	"slices"
	"unicode"
	"unicode/utf8"
)

// The output sanitizer turns raw process output into the text agents see.
// It is a streaming state machine, one per output stream, so escape
// sequences and UTF-8 characters may be split across reads in any way and
// the result is the same as for the whole stream at once:
//
//   - ANSI/VT control sequences are removed: CSI (ESC [ or 0x9B) with its
//     parameters, intermediates and final byte; OSC (ESC ] or 0x9D) up to BEL
//     or ST; DCS, SOS, PM and APC strings (ESC P/X/^/_ or 0x90/0x98/0x9E/0x9F)
//     up to ST; two-byte escapes (ESC 7, ESC =, ESC M, …) and escapes with
//     intermediates such as the charset selects ESC ( B and ESC # 8. As in a
//     VT500 parser, CAN and SUB cancel a sequence, ESC inside a sequence
//     starts a new one, and C0 controls inside a sequence are still emitted.
//   - Other C0 and C1 control characters, DEL included, become the text
//     \xNN (two lower-case hex digits); TAB, LF and CR are kept.
//   - Unicode format characters (category Cf) are dropped, as OpenClaw does.
//   - Invalid UTF-8 becomes U+FFFD, one per byte that cannot start a valid
//     sequence (Go's decoding rule); an incomplete sequence at the end of a
//     read is held back until the next read completes or invalidates it.
//
// The sanitizer also reports, per write, the cursor-position requests
// (ESC[6n, ESC[?6n) it removed and the last cursor-key mode switch
// (ESC[?1h application, ESC[?1l normal) it saw.

// Parser states.
const (
	stGround    uint8 = iota
	stEscape          // after ESC
	stEscInter        // ESC and intermediate bytes, waiting for the final byte
	stCSI             // control sequence
	stOSC             // operating system command: ends with BEL or ST
	stString          // DCS, SOS, PM or APC: ends with ST
	stOSCEsc          // ESC inside an OSC
	stStringEsc       // ESC inside a DCS/SOS/PM/APC string
)

// cursorMode is a PTY session's cursor-key mode (DECCKM), which decides the
// bytes send-keys uses for arrows, Home and End.
type cursorMode uint8

const (
	cursorUnknown cursorMode = iota // PTY session before any DECCKM switch
	cursorNormal
	cursorApplication
)

func (m cursorMode) String() string {
	switch m {
	case cursorNormal:
		return "normal"
	case cursorApplication:
		return "application"
	}
	return "unknown"
}

// maxCSIParams bounds the parameter bytes kept for DSR/DECCKM detection;
// longer parameter strings are skipped without being interpreted.
const maxCSIParams = 16

// sanitizer is the per-stream state. Its zero value is ready to use.
type sanitizer struct {
	state uint8

	carry  [utf8.UTFMax]byte // incomplete UTF-8 sequence at the end of the last write
	ncarry int

	params    [maxCSIParams]byte
	nparams   int
	paramsBad bool // overflowed, or intermediates seen: not a sequence we act on

	// keep, when positive, is the most output units of one write that can
	// matter: the retention cap, which keeps only the newest output. A run
	// of \xNN escapes longer than that is written from its last keep
	// units only, with everything before it in the write (it would be cut
	// by the cap anyway); units still counts all of it.
	keep int

	// Results of the last write.
	units    int        // UTF-16 units of output, including any cut by keep
	nonASCII bool       // dst got a byte >= 0x80
	dsr      int        // cursor-position requests removed
	mode     cursorMode // last cursor-key mode switch, cursorUnknown if none
}

// write appends the sanitized form of src to dst and returns it. It
// allocates nothing beyond growing dst.
func (z *sanitizer) write(dst, src []byte) []byte {
	base := len(dst)
	z.units, z.nonASCII, z.dsr, z.mode = 0, false, 0, cursorUnknown
	if z.ncarry > 0 {
		// Finish the held-back character with the first bytes of src. A
		// small buffer suffices: a rune is at most 4 bytes.
		var small [2 * utf8.UTFMax]byte
		n := copy(small[:], z.carry[:z.ncarry])
		k := copy(small[n:], src)
		joined := small[:n+k]
		carried := z.ncarry
		z.ncarry = 0
		i := 0
		for i < carried {
			if !utf8.FullRune(joined[i:]) {
				// Still incomplete: all of src is part of this character.
				z.ncarry = copy(z.carry[:], joined[i:])
				return dst
			}
			r, size := utf8.DecodeRune(joined[i:])
			dst = z.step(dst, r, joined[i:i+size])
			i += size
		}
		src = src[i-carried:]
	}
	for i := 0; i < len(src); {
		if z.state == stGround {
			// Fast path: a run of text that passes unchanged is copied at
			// once: printable ASCII, TAB, LF, CR, and valid non-ASCII
			// characters other than C1 controls and format characters.
			if j, units, nonASCII := plainRun(src[i:]); j > 0 {
				dst = append(dst, src[i:i+j]...)
				z.units += units
				z.nonASCII = z.nonASCII || nonASCII
				i += j
				continue
			}
			// Fast path: a run of other C0 controls and DEL (NUL padding,
			// binary output) becomes \xNN each, as ground and control
			// would write them one by one. ESC starts a sequence.
			if j := i + hexPrefix(src[i:]); j > i {
				run := src[i:j]
				if z.keep > 0 && 4*len(run) > z.keep {
					dst = dst[:base]
					run = run[len(run)-(z.keep+3)/4:]
				}
				dst = appendHexEscapes(dst, run)
				z.units += 4 * (j - i)
				i = j
				continue
			}
		}
		c := src[i]
		if c < utf8.RuneSelf {
			dst = z.step(dst, rune(c), src[i:i+1])
			i++
			continue
		}
		if !utf8.FullRune(src[i:]) {
			z.ncarry = copy(z.carry[:], src[i:])
			break
		}
		r, size := utf8.DecodeRune(src[i:])
		dst = z.step(dst, r, src[i:i+size])
		i += size
	}
	return dst
}

// flush ends the stream: a held-back incomplete character is invalid.
func (z *sanitizer) flush(dst []byte) []byte {
	z.units, z.nonASCII, z.dsr, z.mode = 0, false, 0, cursorUnknown
	carry := z.carry
	n := z.ncarry
	z.ncarry = 0
	for i := 0; i < n; i++ {
		dst = z.step(dst, utf8.RuneError, carry[i:i+1])
	}
	return dst
}

// plainBytes marks the bytes that pass unchanged in the ground state:
// printable ASCII, TAB, LF and CR.
var plainBytes = func() (t [256]bool) {
	for c := 0x20; c < 0x7f; c++ {
		t[c] = true
	}
	t['\t'], t['\n'], t['\r'] = true, true, true
	return t
}()

// Word-at-a-time constants: every byte 0x01, every byte 0x80.
const (
	lows  = ^uint64(0) / 255
	highs = lows * 0x80
)

// plainPrefix returns how many leading bytes of b pass unchanged. It checks
// 8 bytes at a time: a word with no byte above 0x7e and none below 0x20 is
// plain; one with low bytes (usually a newline) is checked byte by byte.
func plainPrefix(b []byte) int {
	j := 0
	for j+8 <= len(b) {
		x := binary.LittleEndian.Uint64(b[j:])
		if ((x+lows*(127-0x7e))|x)&highs != 0 {
			break // a byte above 0x7e
		}
		if (x-lows*0x20) & ^x & highs != 0 {
			w := b[j : j+8]
			if !(plainBytes[w[0]] && plainBytes[w[1]] && plainBytes[w[2]] && plainBytes[w[3]] &&
				plainBytes[w[4]] && plainBytes[w[5]] && plainBytes[w[6]] && plainBytes[w[7]]) {
				break
			}
		}
		j += 8
	}
	for j < len(b) && plainBytes[b[j]] {
		j++
	}
	return j
}

// plainRun measures the longest prefix of b that passes unchanged in the
// ground state: plain ASCII (see plainPrefix) and complete, valid non-ASCII
// characters that are neither C1 controls nor format characters. It
// returns the length in bytes, in UTF-16 units, and whether it has
// non-ASCII characters.
func plainRun(b []byte) (n, units int, nonASCII bool) {
	for n < len(b) {
		if k := plainPrefix(b[n:]); k > 0 {
			n += k
			units += k
			continue
		}
		c := b[n]
		if c < utf8.RuneSelf {
			break
		}
		var r rune
		size := 2
		if c >= 0xC2 && c <= 0xDF && n+1 < len(b) && b[n+1]&0xC0 == 0x80 {
			r = rune(c&0x1F)<<6 | rune(b[n+1]&0x3F) // two bytes, decoded inline
		} else {
			if !utf8.FullRune(b[n:]) {
				break
			}
			if r, size = utf8.DecodeRune(b[n:]); r == utf8.RuneError && size == 1 {
				break
			}
		}
		if r <= 0x9F || isFormat(r) {
			break
		}
		n += size
		units += runeUnits(r)
		nonASCII = true
	}
	return n, units, nonASCII
}

// isFormat reports whether r is a Unicode format character (Cf), which
// the sanitizer drops. Most text never reaches the table lookup: Cf
// characters live only in the ranges tested first.
func isFormat(r rune) bool {
	switch {
	case r < 0xAD, r > 0xAD && r < 0x600, r > 0x206F && r < 0xFEFF:
		return false
	case r >= 0x2010 && r <= 0x2029, r >= 0x202F && r <= 0x205F:
		return false // general punctuation: dashes, quotes, bullets
	}
	return unicode.Is(unicode.Cf, r)
}

// hexPrefix returns how many leading bytes of b are shown as \xNN in the
// ground state: C0 controls other than ESC, TAB, LF and CR, and DEL.
func hexPrefix(b []byte) int {
	j := zeroPrefix(b)
	for j < len(b) {
		// Runs of NUL (padding, /dev/zero) eight at a time.
		if j+8 <= len(b) && binary.LittleEndian.Uint64(b[j:]) == 0 {
			j += 8
			continue
		}
		if c := b[j]; c < 0x20 && c != 0x1b && !plainBytes[c] || c == 0x7f {
			j++
			continue
		}
		break
	}
	return j
}

// hexEscapes holds `\xNN` (lower-case hex) of every byte as one
// little-endian word, so that an escape is a single store.
var hexEscapes = func() (t [256]uint32) {
	const hex = "0123456789abcdef"
	for c := range t {
		t[c] = binary.LittleEndian.Uint32([]byte{'\\', 'x', hex[c>>4], hex[c&0xF]})
	}
	return t
}()

// zeroBlock is compared against to find NUL runs with the runtime's
// vectorized memequal; it is never written.
var zeroBlock [512]byte

// zeroPrefix returns how many leading bytes of b are NUL, to the nearest
// block of zeroBlock below (the callers finish the count byte by byte).
func zeroPrefix(b []byte) int {
	j := 0
	for j+len(zeroBlock) <= len(b) && bytes.Equal(b[j:j+len(zeroBlock)], zeroBlock[:]) {
		j += len(zeroBlock)
	}
	return j
}

// allZero reports whether every byte of b is NUL. zeroPrefix stops at
// the first block with a byte that is not, which may leave more than a
// block to compare.
func allZero(b []byte) bool {
	j := zeroPrefix(b)
	if len(b)-j >= len(zeroBlock) {
		return false
	}
	return bytes.Equal(b[j:], zeroBlock[:len(b)-j])
}

// appendHexEscapes appends \xNN (lower-case hex) for every byte of src.
// A run of NULs (padding, /dev/zero) is written by doubling copies.
func appendHexEscapes(dst, src []byte) []byte {
	n := len(dst)
	dst = slices.Grow(dst, 4*len(src))[:n+4*len(src)]
	out := dst[n:]
	if len(src) >= 2*len(zeroBlock) && allZero(src) {
		binary.LittleEndian.PutUint32(out, hexEscapes[0])
		for k := 4; k < len(out); k *= 2 {
			copy(out[k:], out[:k])
		}
		return dst
	}
	for i, c := range src {
		binary.LittleEndian.PutUint32(out[4*i:], hexEscapes[c])
	}
	return dst
}

// passThrough reports whether src would come out unchanged (ground state,
// nothing held back, only plain bytes) and, if so, records the results of
// a write as write would. The caller then uses src itself: no copy.
func (z *sanitizer) passThrough(src []byte) bool {
	if z.state != stGround || z.ncarry != 0 || plainPrefix(src) != len(src) {
		return false
	}
	z.units, z.nonASCII, z.dsr, z.mode = len(src), false, 0, cursorUnknown
	return true
}

// step feeds one character (raw is its encoding) to the state machine.
func (z *sanitizer) step(dst []byte, r rune, raw []byte) []byte {
	for {
		switch z.state {
		case stGround:
			return z.ground(dst, r, raw)

		case stEscape:
			switch {
			case r == '[':
				z.startCSI()
			case r == ']':
				z.state = stOSC
			case r == 'P' || r == 'X' || r == '^' || r == '_':
				z.state = stString
			case r >= 0x20 && r <= 0x2F:
				z.state = stEscInter
			case r >= 0x30 && r <= 0x7E:
				z.state = stGround // two-byte escape sequence: done
			case r == 0x1B, r == 0x7F:
				// ESC ESC restarts the escape; DEL is ignored.
			case r == 0x18 || r == 0x1A:
				z.state = stGround
			case r < 0x20:
				return z.control(dst, r)
			default:
				// Not an escape sequence after all: the character is text.
				z.state = stGround
				continue
			}
			return dst

		case stEscInter:
			switch {
			case r >= 0x20 && r <= 0x2F, r == 0x7F:
			case r >= 0x30 && r <= 0x7E:
				z.state = stGround
			case r == 0x1B:
				z.state = stEscape
			case r == 0x18 || r == 0x1A:
				z.state = stGround
			case r < 0x20:
				return z.control(dst, r)
			default:
				z.state = stGround
				continue
			}
			return dst

		case stCSI:
			switch {
			case r >= 0x30 && r <= 0x3F:
				if z.nparams < len(z.params) {
					z.params[z.nparams] = byte(r)
					z.nparams++
				} else {
					z.paramsBad = true
				}
			case r >= 0x20 && r <= 0x2F:
				z.paramsBad = true // intermediates: not DSR or DECCKM
			case r >= 0x40 && r <= 0x7E:
				z.finishCSI(byte(r))
				z.state = stGround
			case r == 0x1B:
				z.state = stEscape
			case r == 0x18 || r == 0x1A:
				z.state = stGround
			case r == 0x7F:
			case r < 0x20:
				return z.control(dst, r)
			default:
				z.state = stGround
				continue
			}
			return dst

		case stOSC, stString:
			switch {
			case r == 0x07 && z.state == stOSC, r == 0x9C, r == 0x18, r == 0x1A:
				z.state = stGround
			case r == 0x1B:
				if z.state == stOSC {
					z.state = stOSCEsc
				} else {
					z.state = stStringEsc
				}
			}
			return dst

		case stOSCEsc, stStringEsc:
			if r == '\\' {
				z.state = stGround // ESC \ is the string terminator
				return dst
			}
			// The ESC ended the string and begins a new escape sequence.
			z.state = stEscape
		}
	}
}

func (z *sanitizer) ground(dst []byte, r rune, raw []byte) []byte {
	switch {
	case r == 0x1B:
		z.state = stEscape
		return dst
	case r == 0x9B:
		z.startCSI()
		return dst
	case r == 0x9D:
		z.state = stOSC
		return dst
	case r == 0x90 || r == 0x98 || r == 0x9E || r == 0x9F:
		z.state = stString
		return dst
	case r < 0x20 || (r >= 0x7F && r <= 0x9F):
		return z.control(dst, r)
	case r == utf8.RuneError && len(raw) == 1:
		z.units++
		z.nonASCII = true
		return append(dst, "\uFFFD"...)
	case r >= utf8.RuneSelf && isFormat(r):
		return dst // format characters are dropped
	}
	z.units += runeUnits(r)
	if r >= utf8.RuneSelf {
		z.nonASCII = true
	}
	return append(dst, raw...)
}

// control emits a control character: TAB, LF and CR as they are, anything
// else as \xNN.
func (z *sanitizer) control(dst []byte, r rune) []byte {
	if r == '\t' || r == '\n' || r == '\r' {
		z.units++
		return append(dst, byte(r))
	}
	const hex = "0123456789abcdef"
	z.units += 4
	return append(dst, '\\', 'x', hex[(r>>4)&0xF], hex[r&0xF])
}

func (z *sanitizer) startCSI() {
	z.state = stCSI
	z.nparams = 0
	z.paramsBad = false
}

// finishCSI interprets the two kinds of control sequence the session core
// acts on: cursor-position requests (answered on PTYs) and DECCKM.
func (z *sanitizer) finishCSI(final byte) {
	if z.paramsBad || (final != 'n' && final != 'h' && final != 'l') {
		return
	}
	p := z.params[:z.nparams]
	if final == 'n' {
		if string(p) == "6" || string(p) == "?6" {
			z.dsr++
		}
		return
	}
	if len(p) < 2 || p[0] != '?' {
		return
	}
	// DECSET/DECRST may carry several modes: ESC[?1;1049h.
	for _, field := range bytes.Split(p[1:], []byte{';'}) {
		if string(field) == "1" {
			if final == 'h' {
				z.mode = cursorApplication
			} else {
				z.mode = cursorNormal
			}
		}
	}
}
