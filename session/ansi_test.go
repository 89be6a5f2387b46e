package session

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// sanitizeAll runs the sanitizer over src in one write plus the final flush.
func sanitizeAll(src string) (out string, units, dsr int, mode cursorMode) {
	var z sanitizer
	b := z.write(nil, []byte(src))
	units, dsr, mode = z.units, z.dsr, z.mode
	b = z.flush(b)
	return string(b), units + z.units, dsr, mode
}

func TestSanitizer(t *testing.T) {
	tests := []struct {
		name, in, want string
		dsr            int
		mode           cursorMode
	}{
		{name: "plain", in: "hello\tworld\r\n", want: "hello\tworld\r\n"},
		{name: "SGR colours", in: "\x1b[31mred\x1b[0m \x1b[1;38;5;208mbold\x1b[m", want: "red bold"},
		{name: "cursor movement", in: "a\x1b[2K\x1b[1G\x1b[10;20Hb", want: "ab"},
		{name: "private CSI", in: "\x1b[?25lx\x1b[?25h", want: "x"},
		{name: "CSI with intermediates", in: "a\x1b[0 qb", want: "ab"},
		{name: "8-bit CSI", in: "a\u009b31mb", want: "ab"},
		{name: "OSC with BEL", in: "\x1b]0;title\x07text", want: "text"},
		{name: "OSC with ST", in: "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", want: "link"},
		{name: "8-bit OSC and ST", in: "a\u009d2;t\u009cb", want: "ab"},
		{name: "DCS", in: "a\x1bP1$r0m\x1b\\b", want: "ab"},
		{name: "SOS PM APC", in: "a\x1bXsos\x1b\\b\x1b^pm\x1b\\c\x1b_Gkitty=1\x1b\\d", want: "abcd"},
		{name: "DCS keeps BEL inside", in: "a\x1bPq\x07still\x1b\\b", want: "ab"},
		{name: "two-byte escapes", in: "a\x1b7b\x1b8c\x1b=d\x1b>e\x1bMf\x1bcg", want: "abcdefg"},
		{name: "charset selects", in: "a\x1b(Bb\x1b)0c\x1b#8d\x1b%Ge", want: "abcde"},
		{name: "C0 controls", in: "a\x00b\x07c\x08d\x7fe", want: `a\x00b\x07c\x08d\x7fe`},
		{name: "C1 controls", in: "a\u0085b\u0090dcs\x1b\\c\u008ed", want: `a\x85bc\x8ed`},
		{name: "stray ST", in: "a\u009cb", want: `a\x9cb`},
		{name: "CAN aborts a sequence", in: "a\x1b[31\x18b", want: "ab"},
		{name: "ESC restarts inside CSI", in: "a\x1b[3\x1b[32mb", want: "ab"},
		{name: "C0 inside CSI is executed", in: "a\x1b[3\n1mb", want: "a\nb"},
		{name: "ESC inside OSC starts a new sequence", in: "\x1b]0;t\x1b[31mx", want: "x"},
		{name: "unterminated OSC hides the rest", in: "a\x1b]0;title without end", want: "a"},
		{name: "non-ASCII after ESC is text", in: "a\x1bé", want: "aé"},
		{name: "UTF-8 kept", in: "héllo wörld 日本 😀", want: "héllo wörld 日本 😀"},
		{name: "invalid UTF-8", in: "a\xffb\xc3", want: "a\uFFFDb\uFFFD"},
		{name: "truncated sequence inside", in: "a\xe2\x82b", want: "a\uFFFD\uFFFDb"},
		{name: "format characters dropped", in: "a\u200bb\u200dc\ufeffd\u00ade", want: "abcde"},
		{name: "DSR removed and counted", in: "hi\x1b[6n there\x1b[?6n", want: "hi there", dsr: 2},
		{name: "other DSR ignored", in: "\x1b[5n\x1b[16n", want: ""},
		{name: "application cursor keys", in: "\x1b[?1hvim", want: "vim", mode: cursorApplication},
		{name: "normal cursor keys", in: "\x1b[?1h\x1b[?1l", want: "", mode: cursorNormal},
		{name: "DECSET with several modes", in: "\x1b[?1049;1h", want: "", mode: cursorApplication},
		{name: "mode 1 not private", in: "\x1b[1h", want: ""},
		{name: "mode 12 is not 1", in: "\x1b[?12h", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, units, dsr, mode := sanitizeAll(tt.in)
			if got != tt.want || dsr != tt.dsr || mode != tt.mode {
				t.Errorf("= %q dsr %d mode %v, want %q dsr %d mode %v", got, dsr, mode, tt.want, tt.dsr, tt.mode)
			}
			if units != utf16Len(got) {
				t.Errorf("units = %d, want %d", units, utf16Len(got))
			}
		})
	}
}

// randomTerminalOutput builds output from the pieces real programs emit,
// plus garbage: every parser state is reached.
func randomTerminalOutput(r *rand.Rand) []byte {
	pieces := []string{
		"plain text ", "line\n", "\r\n", "\t", "é", "日本", "😀", "\u200b", "\u0085",
		"\x1b[31m", "\x1b[0m", "\x1b[38;2;1;2;3m", "\x1b[?1h", "\x1b[?1l", "\x1b[6n", "\x1b[?6n",
		"\x1b]0;title\x07", "\x1b]8;;url\x1b\\", "\x1bP1$r\x1b\\", "\x1b_apc\x1b\\", "\x1b(B", "\x1b#8",
		"\x1b7", "\x1b=", "\x1b[", "\x1b", "\x1b]", "\x18", "\x00", "\x7f", "\u009b1m", "\u009d0;x\u009c",
		"\xff", "\xc3", "\xe2\x82", "\xf0\x9f", "\x80",
	}
	var b []byte
	for n := r.IntN(60); n > 0; n-- {
		if r.IntN(10) == 0 {
			b = append(b, byte(r.IntN(256)))
			continue
		}
		b = append(b, pieces[r.IntN(len(pieces))]...)
	}
	return b
}

// TestSanitizerChunkInvariance is the streaming property: however the
// input is split into writes, the output, its length in UTF-16 units, the
// cursor-position requests and the last cursor-mode switch are the same.
func TestSanitizerChunkInvariance(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 3000; iter++ {
		in := randomTerminalOutput(r)
		want, wantUnits, wantDSR, wantMode := sanitizeAll(string(in))
		if !utf8.ValidString(want) {
			t.Fatalf("output of %q is not valid UTF-8: %q", in, want)
		}
		for split := 0; split < 5; split++ {
			var z sanitizer
			var out []byte
			units, dsr := 0, 0
			mode := cursorUnknown
			for rest := in; len(rest) > 0; {
				n := 1 + r.IntN(min(len(rest), 7))
				if r.IntN(4) == 0 {
					n = len(rest)
				}
				out = z.write(out, rest[:n])
				units += z.units
				dsr += z.dsr
				if z.mode != cursorUnknown {
					mode = z.mode
				}
				rest = rest[n:]
			}
			out = z.flush(out)
			units += z.units
			if string(out) != want || units != wantUnits || dsr != wantDSR || mode != wantMode {
				t.Fatalf("input %q split differently:\n got %q units %d dsr %d mode %v\nwant %q units %d dsr %d mode %v",
					in, out, units, dsr, mode, want, wantUnits, wantDSR, wantMode)
			}
		}
	}
}

// TestSanitizerNoControlLeaks checks that no escape or control character
// other than TAB, LF and CR survives, whatever the input.
func TestSanitizerNoControlLeaks(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for iter := 0; iter < 2000; iter++ {
		out, _, _, _ := sanitizeAll(string(randomTerminalOutput(r)))
		for _, c := range out {
			if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || (c >= 0x7f && c <= 0x9f) {
				t.Fatalf("control %U leaked in %q", c, out)
			}
		}
	}
}

func BenchmarkSanitizerASCII(b *testing.B) {
	src := []byte(strings.Repeat("the quick brown fox jumps over the lazy dog\n", 1500))
	var z sanitizer
	dst := make([]byte, 0, len(src))
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		dst = z.write(dst[:0], src)
	}
}

func TestPlainPrefix(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	check := func(b []byte) {
		want := len(b)
		for i, c := range b {
			if !((c >= 0x20 && c < 0x7f) || c == '\t' || c == '\n' || c == '\r') {
				want = i
				break
			}
		}
		if got := plainPrefix(b); got != want {
			t.Fatalf("plainPrefix(% x) = %d, want %d", b, got, want)
		}
	}
	for c := 0; c < 256; c++ {
		for pos := 0; pos < 19; pos++ {
			b := []byte("aaaaaaaaaaaaaaaaaaa")
			b[pos] = byte(c)
			check(b)
		}
	}
	for i := 0; i < 100000; i++ {
		b := make([]byte, r.IntN(40))
		for j := range b {
			if r.IntN(20) == 0 {
				b[j] = byte(r.IntN(256))
			} else {
				b[j] = byte(0x1e + r.IntN(0x62))
			}
		}
		check(b)
	}
}

func BenchmarkSanitizerPassThrough(b *testing.B) {
	src := []byte(strings.Repeat("the quick brown fox jumps over the lazy dog\n", 1500))
	var z sanitizer
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		if !z.passThrough(src) {
			b.Fatal("not plain")
		}
	}
}

// TestIsFormat: the pre-filtered check agrees with the Unicode table for
// every code point.
func TestIsFormat(t *testing.T) {
	check := func(r rune) {
		if isFormat(r) != unicode.Is(unicode.Cf, r) {
			t.Fatalf("isFormat(%U) = %v", r, isFormat(r))
		}
	}
	// Every Cf character is in the first two planes or in plane 14.
	for r := rune(0); r < 0x20000; r++ {
		check(r)
	}
	for r := rune(0xE0000); r < 0xE1000; r++ {
		check(r)
	}
	for r := rune(0x20000); r <= unicode.MaxRune; r += 97 {
		check(r)
	}
}

// TestSanitizerKeepCutsOnlyWhatTheCapDrops: with keep set to the
// retention cap, a long run of \xNN escapes is written from its newest
// part only, and an output buffer fed the cut writes ends exactly as one
// fed the whole output: same retained text, same pending text, same
// totals and truncation.
func TestSanitizerKeepCutsOnlyWhatTheCapDrops(t *testing.T) {
	const maxChars, pendingChars = 1000, 300
	r := rand.New(rand.NewPCG(3, 4))
	for iter := 0; iter < 2000; iter++ {
		var in []byte
		for n := 1 + r.IntN(4); n > 0; n-- {
			in = append(in, randomTerminalOutput(r)...)
			if r.IntN(2) == 0 {
				in = append(in, make([]byte, r.IntN(3*maxChars/4))...) // NULs: 4 units each
			}
		}
		full, cut := sanitizer{}, sanitizer{keep: maxChars}
		fb := newOutputBuffer(maxChars, pendingChars)
		cb := newOutputBuffer(maxChars, pendingChars)
		var fout, cout []byte
		for rest := in; len(rest) > 0; {
			n := 1 + r.IntN(min(len(rest), 2*maxChars))
			fout = full.write(fout[:0], rest[:n])
			cout = cut.write(cout[:0], rest[:n])
			if full.units != cut.units || !bytes.HasSuffix(fout, cout) {
				t.Fatalf("write %q: units %d vs %d; cut output is not the end of the whole:\n%q\n%q", rest[:n], full.units, cut.units, cout, fout)
			}
			fb.append(streamStdout, fout, full.units, !full.nonASCII)
			cb.append(streamStdout, cout, cut.units, !cut.nonASCII)
			rest = rest[n:]
		}
		fd, fdrop := fb.drain()
		cd, cdrop := cb.drain()
		if fb.aggregated() != cb.aggregated() || fd != cd || fdrop != cdrop || fb.total != cb.total || fb.truncated != cb.truncated {
			t.Fatalf("input %q: buffers differ:\nretained %q\n      vs %q\npending %q\n     vs %q\ntotal %d vs %d, truncated %v vs %v",
				in, fb.aggregated(), cb.aggregated(), fd, cd, fb.total, cb.total, fb.truncated, cb.truncated)
		}
	}
}

// TestHexEscapesOfNULRuns: the block-wise NUL paths of hexPrefix and
// appendHexEscapes agree with the byte-by-byte definition for runs of
// every length around the block size, with and without a different byte
// at the end.
func TestHexEscapesOfNULRuns(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 511, 512, 513, 1023, 1024, 1025, 4096, 100_003} {
		for _, tail := range []byte{0, 1, 'a', 0x1b, 0x7f} {
			b := append(make([]byte, n), tail)
			want := n
			if tail == 0 || tail == 1 || tail == 0x7f {
				want = n + 1
			}
			if got := hexPrefix(b); got != want {
				t.Fatalf("hexPrefix(%d NULs + %#x) = %d, want %d", n, tail, got, want)
			}
			var ref []byte
			for _, c := range b {
				ref = fmt.Appendf(ref, `\x%02x`, c)
			}
			if got := appendHexEscapes([]byte("pre"), b); string(got) != "pre"+string(ref) {
				t.Fatalf("appendHexEscapes(%d NULs + %#x): %d bytes, want %d", n, tail, len(got), 3+len(ref))
			}
		}
	}
}

// TestHexEscapesOfMostlyZeroBlocks: a run of binary output whose first
// block is all NUL and whose rest is not (an ELF file's header padding)
// is escaped byte for byte; it once indexed past the zero block and
// panicked, taking the daemon down.
func TestHexEscapesOfMostlyZeroBlocks(t *testing.T) {
	for _, tc := range []struct{ zeros, tail int }{
		{len(zeroBlock), 2 * len(zeroBlock)},
		{2 * len(zeroBlock), len(zeroBlock) + 7},
		{3*len(zeroBlock) + 1, 1},
		{0, 3 * len(zeroBlock)},
	} {
		src := make([]byte, tc.zeros+tc.tail)
		for i := tc.zeros; i < len(src); i++ {
			src[i] = byte(i%255 + 1)
		}
		got := appendHexEscapes(nil, src)
		var want []byte
		for _, c := range src {
			want = append(want, fmt.Sprintf(`\x%02x`, c)...)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%d NULs then %d bytes: escapes differ", tc.zeros, tc.tail)
		}
		if allZero(src) {
			t.Errorf("%d NULs then %d bytes: allZero", tc.zeros, tc.tail)
		}
	}
}
