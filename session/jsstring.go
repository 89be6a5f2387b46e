package session

import (
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// OpenClaw measures and cuts text as JavaScript strings: lengths are UTF-16
// code units, \s and trim() know more spaces than Go's unicode.IsSpace, and
// cuts move inward so that a surrogate pair is never split. The helpers in
// this file reproduce exactly that on Go's UTF-8 strings.

// jsSpace reports whether r is matched by JavaScript's \s (and removed by
// String.prototype.trim): WhiteSpace and LineTerminator of ECMA-262.
func jsSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0x00A0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF:
		return true
	}
	return r >= 0x2000 && r <= 0x200A
}

// jsTrim is String.prototype.trim.
func jsTrim(s string) string { return strings.TrimFunc(s, jsSpace) }

// collapseJSSpace replaces every run of JavaScript whitespace with one
// space, as s.replace(/\s+/g, " ") does.
func collapseJSSpace(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	inSpace := false
	for _, r := range s {
		if jsSpace(r) {
			if !inSpace {
				b.WriteByte(' ')
			}
			inSpace = true
			continue
		}
		inSpace = false
		b.WriteRune(r)
	}
	return b.String()
}

// runeUnits is the number of UTF-16 code units that encode r.
func runeUnits(r rune) int {
	if r >= 0x10000 && r <= utf8.MaxRune {
		return 2
	}
	return 1
}

// utf16Len is the JavaScript length of s.
func utf16Len(s string) int {
	n := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			n++
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		n += runeUnits(r)
		i += size
	}
	return n
}

// utf16Head returns the longest prefix of s that is at most n UTF-16 units
// and does not end inside a surrogate pair (truncateUtf16Safe).
func utf16Head(s string, n int) string {
	if n <= 0 {
		return ""
	}
	units := 0
	for i, r := range s {
		w := runeUnits(r)
		if units+w > n {
			return s[:i]
		}
		units += w
	}
	return s
}

// utf16Tail returns the longest suffix of s that is at most n UTF-16 units
// and does not start inside a surrogate pair (OpenClaw's tail()).
func utf16Tail(s string, n int) string {
	if n <= 0 {
		return ""
	}
	units := 0
	i := len(s)
	for i > 0 {
		r, size := utf8.DecodeLastRuneInString(s[:i])
		w := runeUnits(r)
		if units+w > n {
			break
		}
		units += w
		i -= size
	}
	return s[i:]
}

// sliceUTF16 is OpenClaw's sliceUtf16Safe(s, start, end) with JavaScript
// slice semantics for negative indexes; hasEnd false means "to the end".
// It works on short texts (names, labels) only: it converts to UTF-16.
func sliceUTF16(s string, start int, end int, hasEnd bool) string {
	u := utf16.Encode([]rune(s))
	n := len(u)
	from := min(start, n)
	if start < 0 {
		from = max(n+start, 0)
	}
	to := n
	if hasEnd {
		to = min(end, n)
		if end < 0 {
			to = max(n+end, 0)
		}
	}
	if to <= from {
		return ""
	}
	if from > 0 && from < n && isLowSurrogate(u[from]) && isHighSurrogate(u[from-1]) {
		from++
	}
	if to > 0 && to < n && isHighSurrogate(u[to-1]) && isLowSurrogate(u[to]) {
		to--
	}
	if to <= from {
		return ""
	}
	return string(utf16.Decode(u[from:to]))
}

func isHighSurrogate(u uint16) bool { return u >= 0xD800 && u <= 0xDBFF }
func isLowSurrogate(u uint16) bool  { return u >= 0xDC00 && u <= 0xDFFF }
