package applypatch

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"unicode"
)

// Matching levels, tried in order; a hunk is placed at the first level
// where its lines match anywhere. Nothing looser than trimmed comparison is
// ever tried: a patch that needs more is refused, not guessed at.
const (
	levelExact = iota // byte for byte
	levelRight        // trailing whitespace ignored
	levelTrim         // leading and trailing whitespace ignored
	numLevels
)

func normalize(level int, s string) string {
	switch level {
	case levelRight:
		return strings.TrimRightFunc(s, unicode.IsSpace)
	case levelTrim:
		return strings.TrimSpace(s)
	}
	return s
}

// maxListed caps the match positions an ambiguity error lists.
const maxListed = 5

const utf8BOM = "\ufeff"

// fileLine is a line of a text file: its text and how it ended.
type fileLine struct {
	text  string
	eol   string // "\n", "\r\n", or "" for a last line without one
	added bool   // inserted by the patch
}

// textFile is a file split into lines, ready for hunks.
type textFile struct {
	bom   bool
	lines []fileLine
	eol   string // the file's usual line ending, for inserted lines
	norm  [numLevels][]string
}

func splitText(data []byte) *textFile {
	s := string(data)
	f := &textFile{}
	if rest, ok := strings.CutPrefix(s, utf8BOM); ok {
		f.bom, s = true, rest
	}
	crlf, lf := 0, 0
	for s != "" {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			f.lines = append(f.lines, fileLine{text: s})
			break
		}
		l := fileLine{text: s[:i], eol: "\n"}
		if strings.HasSuffix(l.text, "\r") {
			l.text, l.eol = l.text[:len(l.text)-1], "\r\n"
			crlf++
		} else {
			lf++
		}
		f.lines = append(f.lines, l)
		s = s[i+1:]
	}
	// New lines take the ending most of the file uses, so a CRLF file
	// stays CRLF; with no evidence, "\n".
	f.eol = "\n"
	if crlf > lf {
		f.eol = "\r\n"
	}
	return f
}

// normalized returns the file's line texts at a matching level, computed
// once.
func (f *textFile) normalized(level int) []string {
	if f.norm[level] == nil {
		n := make([]string, len(f.lines))
		for i, l := range f.lines {
			n[i] = normalize(level, l.text)
		}
		f.norm[level] = n
	}
	return f.norm[level]
}

// placed is a hunk located in the file: its lines replace the file's lines
// from pos on.
type placed struct {
	pos   int
	lines []HunkLine
}

// applyHunks applies the hunks of an Update to data and returns the new
// content. file names the file in errors.
//
// Lines the hunk keeps as context keep the file's own text and line ending,
// even when they matched only after whitespace was ignored; inserted lines
// take the file's usual line ending. A file without a final newline keeps
// that while its last line stays last; a patch that changes or appends to
// the end of the file leaves it ending in a newline, as Codex does.
func applyHunks(ctx context.Context, file string, data []byte, hunks []Hunk) ([]byte, error) {
	if bytes.IndexByte(data, 0) >= 0 {
		return nil, &PatchError{File: file, Msg: "binary file (it contains NUL bytes); only text files can be patched"}
	}
	f := splitText(data)
	var edits []placed
	next := 0 // hunks are searched in order, each after the previous one
	for i, h := range hunks {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		p, err := f.place(ctx, h, next)
		if err != nil {
			if pe, ok := err.(*PatchError); ok {
				pe.File, pe.Hunk = file, i+1
			}
			return nil, err
		}
		edits = append(edits, p)
		next = p.pos + oldCount(p.lines)
	}
	return f.render(edits), nil
}

// place finds where h applies, searching from line start.
func (f *textFile) place(ctx context.Context, h Hunk, start int) (placed, error) {
	hinted := h.Hint != ""
	if hinted {
		at, _, err := f.seek(ctx, []string{h.Hint}, start, false, true)
		if err != nil {
			return placed{}, err
		}
		if at < 0 {
			return placed{}, &PatchError{Msg: "could not find the @@ line", Context: h.Hint, kind: ErrNoMatch}
		}
		// The hunk's lines are searched from the hint line itself, not
		// after it: models often repeat the @@ line as the first context
		// line.
		start = at
		if oldCount(h.Lines) == 0 && !h.EOF {
			// Nothing to find: insert right after the hint line.
			return placed{pos: at + 1, lines: h.Lines}, nil
		}
	}
	old := oldLines(h.Lines)
	if len(old) == 0 {
		// Only added lines and no hint: they go at the end of the file.
		return placed{pos: len(f.lines), lines: h.Lines}, nil
	}
	lines := h.Lines
	at, matches, err := f.seek(ctx, old, start, h.EOF, hinted)
	if err == nil && at < 0 && len(matches) == 0 && len(old) > 1 && old[len(old)-1] == "" && lines[len(lines)-1].Kind == LineContext {
		// Like Codex: a trailing empty context line often stands for the
		// file's final newline rather than for a line; retry without it.
		lines = lines[:len(lines)-1]
		at, matches, err = f.seek(ctx, old[:len(old)-1], start, h.EOF, hinted)
		if len(matches) > 1 {
			// The shorter search is the guess; report the hunk as written.
			matches = nil
		}
	}
	switch {
	case err != nil:
		return placed{}, err
	case at >= 0:
		return placed{pos: at, lines: lines}, nil
	case len(matches) > 1:
		return placed{}, &PatchError{
			Msg:     ambiguousMsg(matches),
			Context: strings.Join(old, "\n"),
			kind:    ErrAmbiguous,
		}
	case h.EOF:
		return placed{}, &PatchError{
			Msg:     fmt.Sprintf("could not find the expected lines at the end of the file (the hunk ends with %q)", eofMarker),
			Context: strings.Join(old, "\n"),
			kind:    ErrNoMatch,
		}
	}
	return placed{}, &PatchError{Msg: "could not find the expected lines", Context: strings.Join(old, "\n"), kind: ErrNoMatch}
}

func ambiguousMsg(matches []int) string {
	var where []string
	for _, m := range matches[:min(len(matches), maxListed)] {
		where = append(where, fmt.Sprint(m+1))
	}
	more := ""
	if len(matches) > maxListed {
		more = ", …"
	}
	return fmt.Sprintf("the expected lines match at %d places (lines %s%s); add context lines or an @@ line naming the enclosing function or block so they match at one place",
		len(matches), strings.Join(where, ", "), more)
}

// seek looks for pattern in the file's lines from start on, at each
// matching level in turn. At the first level with any match it returns the
// position of the match, or -1 and every position when there are several
// and first is false. With eof the pattern must end at the last line. It
// returns -1 and no positions when nothing matches at any level.
func (f *textFile) seek(ctx context.Context, pattern []string, start int, eof, first bool) (int, []int, error) {
	n, m := len(f.lines), len(pattern)
	if m > n-start || start > n {
		return -1, nil, nil
	}
	from, to := start, n-m
	if eof {
		from = n - m
	}
	want := make([]string, m)
	for level := range numLevels {
		lines := f.normalized(level)
		for j, p := range pattern {
			want[j] = normalize(level, p)
		}
		var found []int
		for i := from; i <= to; i++ {
			// Pathological files (a million identical lines) make this
			// slow; let the caller give up.
			if (i-from)&0xfff == 0xfff {
				if err := ctx.Err(); err != nil {
					return -1, nil, err
				}
			}
			if equalAt(lines, i, want) {
				found = append(found, i)
				if first {
					break
				}
			}
		}
		switch {
		case len(found) == 1:
			return found[0], found, nil
		case len(found) > 1:
			return -1, found, nil
		}
	}
	return -1, nil, nil
}

func equalAt(lines []string, i int, want []string) bool {
	for j, w := range want {
		if lines[i+j] != w {
			return false
		}
	}
	return true
}

// oldLines returns the lines a hunk expects in the file: its context and
// removed lines.
func oldLines(lines []HunkLine) []string {
	var old []string
	for _, l := range lines {
		if l.Kind != LineAdded {
			old = append(old, l.Text)
		}
	}
	return old
}

func oldCount(lines []HunkLine) int {
	n := 0
	for _, l := range lines {
		if l.Kind != LineAdded {
			n++
		}
	}
	return n
}

// render applies the placed hunks, in order, and joins the lines.
func (f *textFile) render(edits []placed) []byte {
	out := make([]fileLine, 0, len(f.lines))
	cur := 0
	for _, e := range edits {
		out = append(out, f.lines[cur:e.pos]...)
		cur = e.pos
		for _, l := range e.lines {
			switch l.Kind {
			case LineContext:
				out = append(out, f.lines[cur])
				cur++
			case LineRemoved:
				cur++
			case LineAdded:
				out = append(out, fileLine{text: l.Text, eol: f.eol, added: true})
			}
		}
	}
	out = append(out, f.lines[cur:]...)

	var b strings.Builder
	if f.bom {
		b.WriteString(utf8BOM)
	}
	for i, l := range out {
		eol := l.eol
		if eol == "" && i < len(out)-1 {
			// The old last line, no longer last.
			eol = f.eol
		}
		b.WriteString(l.text)
		b.WriteString(eol)
	}
	return []byte(b.String())
}
