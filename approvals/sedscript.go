package approvals

import (
	"fmt"
	"strings"
)

// sedScriptRisk reads a sed script as GNU sed does and returns why it is not
// a pure text filter: the e command and the s///e flag run commands, w, W
// and the s///w flag write files. Reading (r, R) is sed's job. Anything the
// reader cannot follow for sure is refused too: an unknown command, an
// unterminated s or y, a bracket expression containing the delimiter (GNU
// sed and other seds split such a command differently), odd labels. ""
// means the script only filters text.
func sedScriptRisk(script string) string {
	r := sedReader{s: script}
	return r.run()
}

type sedReader struct {
	s string
	i int
}

func (r *sedReader) eof() bool { return r.i >= len(r.s) }
func (r *sedReader) peek() byte {
	if r.eof() {
		return 0
	}
	return r.s[r.i]
}

func (r *sedReader) skipSpace() {
	for !r.eof() && (r.s[r.i] == ' ' || r.s[r.i] == '\t') {
		r.i++
	}
}

// restOfLine consumes up to (not including) the next newline.
func (r *sedReader) restOfLine() string {
	j := strings.IndexByte(r.s[r.i:], '\n')
	if j < 0 {
		j = len(r.s) - r.i
	}
	out := r.s[r.i : r.i+j]
	r.i += j
	return out
}

func (r *sedReader) run() string {
	for {
		// Separators between commands.
		for !r.eof() && strings.IndexByte(" \t\n;", r.peek()) >= 0 {
			r.i++
		}
		if r.eof() {
			return ""
		}
		if r.peek() == '#' {
			r.restOfLine()
			continue
		}
		if why := r.address(); why != "" {
			return why
		}
		r.skipSpace()
		if r.peek() == ',' {
			r.i++
			r.skipSpace()
			if why := r.address(); why != "" {
				return why
			}
			r.skipSpace()
		}
		for r.peek() == '!' {
			r.i++
			r.skipSpace()
		}
		if r.eof() {
			return "sed: address without a command"
		}
		if why := r.command(); why != "" {
			return why
		}
	}
}

// address reads an optional address: a line number (with GNU's first~step,
// +N and ~N forms), $, /regex/ or \cregexc, with I and M flags.
func (r *sedReader) address() string {
	switch c := r.peek(); {
	case c >= '0' && c <= '9', c == '+', c == '~':
		r.i++
		for !r.eof() && strings.IndexByte("0123456789~", r.peek()) >= 0 {
			r.i++
		}
	case c == '$':
		r.i++
	case c == '/' || c == '\\':
		delim := byte('/')
		if c == '\\' {
			r.i++
			if r.eof() || r.peek() == '\n' || r.peek() == '\\' {
				return "sed: bad address delimiter"
			}
			delim = r.peek()
		}
		r.i++
		if why := r.regex(delim); why != "" {
			return why
		}
		for !r.eof() && (r.peek() == 'I' || r.peek() == 'M') {
			r.i++
		}
	}
	return ""
}

// regex consumes a regular expression up to the unescaped delimiter, which
// it consumes too.
func (r *sedReader) regex(delim byte) string {
	for !r.eof() {
		c := r.s[r.i]
		switch {
		case c == '\\':
			r.i += 2
			continue
		case c == '\n':
			return "sed: newline in a regular expression"
		case c == delim:
			r.i++
			return ""
		case c == '[':
			if why := r.bracket(delim); why != "" {
				return why
			}
			continue
		}
		r.i++
	}
	return "sed: unterminated regular expression"
}

// bracket consumes a bracket expression. One that contains the delimiter or
// a newline is refused: seds disagree on whether it ends the expression.
func (r *sedReader) bracket(delim byte) string {
	r.i++ // [
	if r.peek() == '^' {
		r.i++
	}
	if r.peek() == ']' {
		r.i++
	}
	for !r.eof() {
		c := r.s[r.i]
		switch {
		case c == delim || c == '\n':
			return fmt.Sprintf("sed: bracket expression containing %q", string(c))
		case c == '[' && r.i+1 < len(r.s) && strings.IndexByte(":.=", r.s[r.i+1]) >= 0:
			end := strings.Index(r.s[r.i+2:], string(r.s[r.i+1])+"]")
			if end < 0 {
				return "sed: unterminated character class"
			}
			inner := r.s[r.i+2 : r.i+2+end]
			if strings.IndexByte(inner, delim) >= 0 || strings.IndexByte(inner, '\n') >= 0 {
				return fmt.Sprintf("sed: bracket expression containing %q", string(delim))
			}
			r.i += 2 + end + 2
			continue
		case c == ']':
			r.i++
			return ""
		}
		r.i++
	}
	return "sed: unterminated bracket expression"
}

// replacement consumes the replacement of s up to the delimiter.
func (r *sedReader) replacement(delim byte) string {
	for !r.eof() {
		c := r.s[r.i]
		switch {
		case c == '\\':
			r.i += 2
			continue
		case c == delim:
			r.i++
			return ""
		case c == '\n':
			return "sed: newline in a replacement"
		}
		r.i++
	}
	return "sed: unterminated s command"
}

// endOfCommand checks that a command is followed by a separator.
func (r *sedReader) endOfCommand(cmd byte) string {
	r.skipSpace()
	switch r.peek() {
	case 0, '\n', ';', '}', '#':
		return ""
	}
	return fmt.Sprintf("sed: unexpected %q after %c", string(r.peek()), cmd)
}

func (r *sedReader) label() string {
	r.skipSpace()
	start := r.i
	for !r.eof() && strings.IndexByte(";\n", r.peek()) < 0 {
		r.i++
	}
	l := strings.TrimRight(r.s[start:r.i], " \t")
	for _, c := range []byte(l) {
		if !(c == '_' || c == '.' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return fmt.Sprintf("sed: label %q", l)
		}
	}
	return ""
}

func (r *sedReader) command() string {
	c := r.s[r.i]
	r.i++
	switch c {
	case '{', '}':
		return ""
	case '=', 'd', 'D', 'g', 'G', 'h', 'H', 'n', 'N', 'p', 'P', 'x', 'z', 'F':
		return r.endOfCommand(c)
	case 'l', 'L', 'q', 'Q':
		r.skipSpace()
		for !r.eof() && r.peek() >= '0' && r.peek() <= '9' {
			r.i++
		}
		return r.endOfCommand(c)
	case ':', 'b', 't', 'T':
		return r.label()
	case 'v':
		return r.label() // an optional version, read like a label
	case 'a', 'i', 'c':
		// GNU: one-line text to the end of the line, or a\ and lines
		// ending in a backslash.
		for {
			line := r.restOfLine()
			if !strings.HasSuffix(line, `\`) || r.eof() {
				return ""
			}
			r.i++ // the newline of a continued line
		}
	case 'r', 'R':
		r.restOfLine() // the file to read: sed's job
		return ""
	case 'w', 'W':
		return fmt.Sprintf("sed %c: writes a file", c)
	case 'e':
		return "sed e: runs a command"
	case 's':
		return r.substitute()
	case 'y':
		if r.eof() || r.peek() == '\n' || r.peek() == '\\' {
			return "sed: bad y delimiter"
		}
		delim := r.s[r.i]
		r.i++
		if why := r.replacement(delim); why != "" {
			return why
		}
		if why := r.replacement(delim); why != "" {
			return why
		}
		return r.endOfCommand(c)
	}
	return fmt.Sprintf("sed: unknown command %q", string(c))
}

func (r *sedReader) substitute() string {
	if r.eof() || r.peek() == '\n' || r.peek() == '\\' {
		return "sed: bad s delimiter"
	}
	delim := r.s[r.i]
	r.i++
	if why := r.regex(delim); why != "" {
		return why
	}
	if why := r.replacement(delim); why != "" {
		return why
	}
	for !r.eof() {
		switch f := r.peek(); {
		case f == 'g' || f == 'p' || f == 'i' || f == 'I' || f == 'm' || f == 'M' || f >= '0' && f <= '9':
			r.i++
		case f == 'e':
			return "sed s///e: runs the pattern space as a command"
		case f == 'w':
			return "sed s///w: writes a file"
		default:
			return r.endOfCommand('s')
		}
	}
	return ""
}
