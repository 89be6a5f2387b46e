package session

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf16"
)

// add appends a string to a buffer the way the readers do.
func (b *outputBuffer) add(stream int, s string) {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			ascii = false
		}
	}
	b.append(stream, []byte(s), utf16Len(s), ascii)
}

// Spec §23.2 (bash-process-registry.test.ts).
func TestOutputBufferCaps(t *testing.T) {
	t.Run("retained cap keeps the newest text", func(t *testing.T) {
		b := newOutputBuffer(10, 10)
		b.add(streamStdout, "0123456789")
		b.add(streamStdout, "abcdef")
		if got := b.aggregated(); got != "6789abcdef" || !b.truncated {
			t.Errorf("aggregated = %q truncated %v", got, b.truncated)
		}
	})
	t.Run("pending cap drops the oldest of one chunk", func(t *testing.T) {
		b := newOutputBuffer(100000, 20000)
		b.add(streamStdout, strings.Repeat("a", 70000)+strings.Repeat("b", 20000))
		out, dropped := b.drain()
		if out != strings.Repeat("b", 20000) || !dropped || !b.truncated {
			t.Errorf("drained %d chars (%q…), dropped %v", len(out), out[:10], dropped)
		}
		if b.pending[0].units != 0 || b.pending[1].units != 0 {
			t.Errorf("pending counters not reset")
		}
	})
	t.Run("pending cap is at most the retained cap", func(t *testing.T) {
		b := newOutputBuffer(5000, 30000)
		b.add(streamStdout, strings.Repeat("x", 10000))
		if out, _ := b.drain(); len(out) != 5000 {
			t.Errorf("drained %d chars, want 5000", len(out))
		}
	})
	t.Run("pending caps are per stream", func(t *testing.T) {
		b := newOutputBuffer(200000, 10)
		b.add(streamStdout, "aaaaaa")
		b.add(streamStdout, "bbbbbb")
		b.add(streamStderr, strings.Repeat("c", 12))
		out, dropped := b.drain()
		if out != "aaaabbbbbb"+"cccccccccc" || !dropped || !b.truncated {
			t.Errorf("drained %q dropped %v", out, dropped)
		}
	})
	t.Run("drain interleaves streams in arrival order", func(t *testing.T) {
		b := newOutputBuffer(1000, 1000)
		b.add(streamStdout, "out1 ")
		b.add(streamStderr, "err1 ")
		b.add(streamStdout, "out2 ")
		b.add(streamStdout, "out3 ")
		b.add(streamStderr, "err2")
		if out, dropped := b.drain(); out != "out1 err1 out2 out3 err2" || dropped {
			t.Errorf("drained %q dropped %v", out, dropped)
		}
		if out, _ := b.drain(); out != "" {
			t.Errorf("second drain %q", out)
		}
	})
	t.Run("cuts never split a surrogate pair", func(t *testing.T) {
		b := newOutputBuffer(1000, 1000)
		b.add(streamStdout, strings.Repeat("😀", 600)) // 1200 units
		got := b.aggregated()
		if utf16Len(got) != 1000 || got != strings.Repeat("😀", 500) {
			t.Errorf("retained %d units", utf16Len(got))
		}
		b = newOutputBuffer(1001, 1001)
		b.add(streamStdout, "a"+strings.Repeat("😀", 600))
		if got := b.aggregated(); got != strings.Repeat("😀", 500) {
			t.Errorf("odd cap: retained %q…", got[:8])
		}
	})
	t.Run("tail is the last 2000 units", func(t *testing.T) {
		b := newOutputBuffer(200000, 30000)
		b.add(streamStdout, strings.Repeat("x", 5000)+strings.Repeat("y", 2000))
		if got := b.tail(); got != strings.Repeat("y", 2000) {
			t.Errorf("tail has %d chars", len(got))
		}
		if b.lostOutput() || b.truncated {
			t.Errorf("nothing was lost at the retention cap")
		}
	})
	t.Run("frozen after exit", func(t *testing.T) {
		b := newOutputBuffer(1000, 1000)
		b.add(streamStdout, "a")
		b.frozen = true
		b.add(streamStdout, "b")
		if out, _ := b.drain(); out != "a" {
			t.Errorf("drained %q", out)
		}
	})
}

// refBuffer is the JavaScript algorithm, on UTF-16, as a reference.
type refBuffer struct {
	max, pendingCap int
	aggregated      []uint16
	pending         []refChunk
	pend            [2]int
	truncated       bool
	dropped         bool
}

type refChunk struct {
	stream int
	text   []uint16
}

// jsTail is sliceUtf16Safe(text, len-max).
func jsTail(u []uint16, max int) []uint16 {
	if len(u) <= max {
		return u
	}
	from := len(u) - max
	if from > 0 && isLowSurrogate(u[from]) && isHighSurrogate(u[from-1]) {
		from++
	}
	return u[from:]
}

func (r *refBuffer) add(stream int, s string) {
	chunk := utf16.Encode([]rune(s))
	r.pending = append(r.pending, refChunk{stream, append([]uint16(nil), chunk...)})
	pc := r.pend[stream] + len(chunk)
	if pc > r.pendingCap {
		r.truncated, r.dropped = true, true
		overflow := pc - r.pendingCap
		out := r.pending[:0]
		for _, c := range r.pending {
			if c.stream != stream || overflow <= 0 {
				out = append(out, c)
				continue
			}
			if len(c.text) <= overflow {
				overflow -= len(c.text)
				pc -= len(c.text)
				continue
			}
			from := overflow
			if isLowSurrogate(c.text[from]) && isHighSurrogate(c.text[from-1]) {
				from++
			}
			pc -= from
			c.text = c.text[from:]
			overflow = 0
			out = append(out, c)
		}
		r.pending = out
	}
	r.pend[stream] = pc
	all := append(append([]uint16(nil), r.aggregated...), chunk...)
	r.aggregated = jsTail(all, r.max)
	if len(r.aggregated) < len(all) {
		r.truncated = true
	}
}

func (r *refBuffer) drain() (string, bool) {
	var u []uint16
	for _, c := range r.pending {
		u = append(u, c.text...)
	}
	d := r.dropped
	r.pending, r.pend, r.dropped = nil, [2]int{}, false
	return string(utf16.Decode(u)), d
}

// TestOutputBufferMatchesReference drives the buffer and the reference with
// the same random appends and drains.
func TestOutputBufferMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	alphabet := []string{"a", "b", "é", "日", "😀", "\n"}
	for iter := 0; iter < 100; iter++ {
		maxChars := 1 + r.IntN(300)
		pendingChars := 1 + r.IntN(300)
		b := newOutputBuffer(maxChars, pendingChars)
		ref := &refBuffer{max: maxChars, pendingCap: min(maxChars, pendingChars)}
		for op := 0; op < 120; op++ {
			if r.IntN(8) == 0 {
				got, gd := b.drain()
				want, wd := ref.drain()
				if got != want || gd != wd {
					t.Fatalf("iter %d op %d: drain = %q %v, want %q %v", iter, op, got, gd, want, wd)
				}
				continue
			}
			var sb strings.Builder
			n := r.IntN(1 + r.IntN(600))
			for i := 0; i < n; i++ {
				sb.WriteString(alphabet[r.IntN(len(alphabet))])
			}
			stream := r.IntN(2)
			b.add(stream, sb.String())
			ref.add(stream, sb.String())
			if got, want := b.aggregated(), string(utf16.Decode(ref.aggregated)); got != want {
				t.Fatalf("iter %d op %d: aggregated %q, want %q", iter, op, got, want)
			}
			if b.truncated != ref.truncated {
				t.Fatalf("iter %d op %d: truncated %v, want %v", iter, op, b.truncated, ref.truncated)
			}
			if got, want := b.tail(), string(utf16.Decode(jsTail(ref.aggregated, tailChars))); got != want {
				t.Fatalf("tail differs")
			}
		}
	}
}

// TestOutputBufferBigOutput pushes far more than the caps through the
// buffer in reader-sized pieces: memory stays bounded.
func TestOutputBufferBigOutput(t *testing.T) {
	b := newOutputBuffer(200000, 30000)
	chunk := []byte(strings.Repeat("0123456789abcdef\n", 64<<10/17))
	for i := 0; i < 2000; i++ {
		b.append(streamStdout, chunk, len(chunk), true)
	}
	if b.retained.units != 200000 || cap(b.retained.buf) > 4*200000 {
		t.Errorf("retained %d units in a %d-byte buffer", b.retained.units, cap(b.retained.buf))
	}
	if b.pending[0].units != 30000 || cap(b.pending[0].buf) > 4*64<<10 {
		t.Errorf("pending %d units in a %d-byte buffer", b.pending[0].units, cap(b.pending[0].buf))
	}
	if len(b.retained.segs)-b.retained.head > 64 {
		t.Errorf("%d live segments", len(b.retained.segs)-b.retained.head)
	}
}

func BenchmarkOutputBufferAppend(b *testing.B) {
	buf := newOutputBuffer(200000, 30000)
	chunk := []byte(strings.Repeat("0123456789abcdef\n", 64<<10/17))
	b.SetBytes(int64(len(chunk)))
	b.ReportAllocs()
	for b.Loop() {
		buf.append(streamStdout, chunk, len(chunk), true)
	}
}
