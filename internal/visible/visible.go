package visible

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// String returns s with every character an operator could not see for
// what it is replaced by an escape:
//
//   - \a \b \t \n \v \f \r for those controls, \xNN for the other C0
//     controls and DEL;
//   - \xNN for each byte that is not valid UTF-8;
//   - \uNNNN (\UNNNNNNNN above U+FFFF) for every other character that
//     unicode.IsPrint rejects, which takes in C1 controls, format
//     characters (zero-width U+200B–U+200D, bidi controls U+202A–U+202E and
//     U+2066–U+2069, U+FEFF), line and paragraph separators, spaces other
//     than U+0020, private-use, surrogate and unassigned code points; and
//     for default-ignorable characters that render as nothing although
//     Unicode files them as letters or marks (Hangul fillers such as
//     U+3164, variation selectors).
//
// Everything else, backslashes included, is left as it is: commands are
// full of backslashes, and doubling each one would make every command
// harder to read only to tell a typed "\x1b" from an escaped one, which
// hides nothing. Text with nothing to escape is returned unchanged.
func String(s string) string {
	i := firstHidden(s)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x`)
			b.WriteString(hex2(s[i]))
		case hidden(r):
			writeEscape(&b, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// firstHidden is the index of the first byte String escapes, -1 for none.
func firstHidden(s string) int {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return i
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && n == 1) || hidden(r) {
			return i
		}
		i += n
	}
	return -1
}

// hidden reports whether String escapes the valid character r.
func hidden(r rune) bool {
	if r < utf8.RuneSelf {
		return r < 0x20 || r == 0x7f
	}
	return !unicode.IsPrint(r) || unicode.In(r, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector)
}

func writeEscape(b *strings.Builder, r rune) {
	switch r {
	case '\a':
		b.WriteString(`\a`)
	case '\b':
		b.WriteString(`\b`)
	case '\t':
		b.WriteString(`\t`)
	case '\n':
		b.WriteString(`\n`)
	case '\v':
		b.WriteString(`\v`)
	case '\f':
		b.WriteString(`\f`)
	case '\r':
		b.WriteString(`\r`)
	default:
		switch {
		case r < utf8.RuneSelf:
			b.WriteString(`\x`)
			b.WriteString(hex2(byte(r)))
		case r <= 0xffff:
			b.WriteString(`\u`)
			b.WriteString(pad(strconv.FormatInt(int64(r), 16), 4))
		default:
			b.WriteString(`\U`)
			b.WriteString(pad(strconv.FormatInt(int64(r), 16), 8))
		}
	}
}

func hex2(c byte) string { return pad(strconv.FormatInt(int64(c), 16), 2) }

func pad(s string, n int) string { return strings.Repeat("0", max(0, n-len(s))) + s }
