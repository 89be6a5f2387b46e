package session

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

// Micro-benchmarks of the session core's hot paths, each with a baseline
// (sub-benchmark "baseline") that does the least the same job needs.
// `make bench` runs them and reports execmesh/baseline ratios; run them
// alone with
//
//	go test -run '^$' -bench 'Benchmark(OutputAppend|Sanitize|LogSlice)' -benchmem ./session

// benchChunk is the size of one read from a busy pipe.
const benchChunk = 32 << 10

func repeatTo(pattern string, n int) []byte {
	return []byte(strings.Repeat(pattern, n/len(pattern)+1)[:n])
}

// BenchmarkOutputAppend: storing one read of output in a session with the
// default caps (200000 retained chars, 30000 unread per stream), oldest
// output dropped as it overflows; against writing the same bytes to a
// bytes.Buffer that is reset at the same cap.
func BenchmarkOutputAppend(b *testing.B) {
	cfg := DefaultConfig()
	for _, tc := range []struct {
		name  string
		chunk []byte
	}{
		{"ascii-32KiB", repeatTo("the quick brown fox jumps over the lazy dog\n", benchChunk)},
		{"utf8-32KiB", repeatTo("größer als 🦊 — ünïcødé text\n", benchChunk)},
		{"ascii-100B", repeatTo("the quick brown fox jumps over the lazy dog\n", 100)},
	} {
		ascii := utf8.RuneCount(tc.chunk) == len(tc.chunk)
		units := utf16Len(string(tc.chunk))
		b.Run(tc.name+"/execmesh", func(b *testing.B) {
			buf := newOutputBuffer(cfg.MaxOutputChars, cfg.PendingMaxOutputChars)
			b.SetBytes(int64(len(tc.chunk)))
			b.ReportAllocs()
			for b.Loop() {
				buf.append(streamStdout, tc.chunk, units, ascii)
			}
		})
		b.Run(tc.name+"/baseline", func(b *testing.B) {
			var buf bytes.Buffer
			b.SetBytes(int64(len(tc.chunk)))
			b.ReportAllocs()
			for b.Loop() {
				if buf.Len()+len(tc.chunk) > cfg.MaxOutputChars {
					buf.Reset()
				}
				buf.Write(tc.chunk)
			}
		})
	}
}

// BenchmarkSanitize: the streaming ANSI/control-character sanitizer on one
// read, the way streamWriter.consume calls it (pass-through check, then
// the state machine), against copying the same bytes.
func BenchmarkSanitize(b *testing.B) {
	ansi := repeatTo("\x1b[1;32mok\x1b[0m   \x1b[34msrc/session/buffer.go\x1b[0m  12.3 kB\r\n", benchChunk)
	for _, tc := range []struct {
		name string
		src  []byte
	}{
		{"plain", repeatTo("the quick brown fox jumps over the lazy dog\n", benchChunk)},
		{"ansi-colors", ansi},
		{"utf8", repeatTo("größer als 🦊 — ünïcødé text\n", benchChunk)},
		{"nul-bytes", make([]byte, benchChunk)},
	} {
		b.Run(tc.name+"/execmesh", func(b *testing.B) {
			var z sanitizer
			var dst []byte
			b.SetBytes(int64(len(tc.src)))
			b.ReportAllocs()
			for b.Loop() {
				if !z.passThrough(tc.src) {
					dst = z.write(dst[:0], tc.src)
				}
			}
		})
		b.Run(tc.name+"/baseline", func(b *testing.B) {
			var dst []byte
			b.SetBytes(int64(len(tc.src)))
			b.ReportAllocs()
			for b.Loop() {
				dst = append(dst[:0], tc.src...)
			}
		})
	}
}

// BenchmarkLogSlice: `process log` with the default window (last 200
// lines) over a full 200000-char log, against a direct scan that counts
// the lines and cuts the last 200 without splitting the text.
func BenchmarkLogSlice(b *testing.B) {
	text := string(repeatTo("2026-11-30T04:00:00Z INFO build step 17 of 230: compiling package foo/bar\n", 200000))
	limit := numOf(defaultLogTailLines)
	b.Run("tail200/execmesh", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s, total, _ := sliceLogLines(text, optNum{}, limit)
			if total == 0 || s == "" {
				b.Fatal("empty slice")
			}
		}
	})
	b.Run("tail200/baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s, total := tailLinesDirect(text, defaultLogTailLines)
			if total == 0 || s == "" {
				b.Fatal("empty slice")
			}
		}
	})
}

// tailLinesDirect is the reference for BenchmarkLogSlice: the last n lines
// of text and the line count, found by scanning, with one copy.
func tailLinesDirect(text string, n int) (string, int) {
	t := strings.TrimSuffix(text, "\n")
	total := strings.Count(t, "\n") + 1
	i := len(t)
	for k := 0; k < n && i > 0; k++ {
		i = strings.LastIndexByte(t[:i], '\n')
		if i < 0 {
			i = 0
			break
		}
	}
	if i > 0 {
		i++
	}
	_ = utf8.RuneCountInString(text) // the char count the result reports
	return strings.Clone(t[i:]), total
}
