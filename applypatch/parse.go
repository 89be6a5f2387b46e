package applypatch

import (
	"fmt"
	"strings"
	"unicode"
)

// Default limits; Options can change them.
const (
	// DefaultMaxPatchBytes is the largest patch text accepted.
	DefaultMaxPatchBytes = 10 << 20
	// DefaultMaxFileBytes is the largest file a patch may read or write.
	DefaultMaxFileBytes = 50 << 20
)

// Markers of the patch envelope.
const (
	beginMarker  = "*** Begin Patch"
	endMarker    = "*** End Patch"
	addMarker    = "*** Add File:"
	deleteMarker = "*** Delete File:"
	updateMarker = "*** Update File:"
	moveMarker   = "*** Move to:"
	eofMarker    = "*** End of File"
	hunkMarker   = "@@"
)

// Action is what a FileOp does to its file.
type Action int

// Actions, one per kind of file section.
const (
	// AddFile creates a file ("*** Add File: path").
	AddFile Action = iota + 1
	// DeleteFile removes a file ("*** Delete File: path").
	DeleteFile
	// UpdateFile edits a file with hunks, and may move it
	// ("*** Update File: path", optionally "*** Move to: path").
	UpdateFile
)

// String returns "add", "delete" or "update".
func (a Action) String() string {
	switch a {
	case AddFile:
		return "add"
	case DeleteFile:
		return "delete"
	case UpdateFile:
		return "update"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Patch is a parsed patch: its file sections in the order they appear.
type Patch struct {
	Files []FileOp
}

// FileOp is one file section of a patch.
type FileOp struct {
	Action Action
	// Path is the file, as written in the patch (surrounding spaces removed).
	Path string
	// MoveTo is the "*** Move to:" path of an Update, or "".
	MoveTo string
	// Content is the whole content of an added file: its "+" lines, each
	// ending in "\n". It is "" for an Add without lines.
	Content string
	// Hunks are the edits of an Update, in file order.
	Hunks []Hunk
	// Line is the 1-based line of the section's header in the patch text.
	Line int
}

// Hunk is one "@@" section of an Update: lines to find in the file and
// what to replace them with.
type Hunk struct {
	// Hint is the text after "@@" ("@@ func main()"), or "". The hunk's
	// lines are searched from the first line matching the hint onwards.
	// A unified-diff range ("@@ -12,7 +12,8 @@ func main()") is dropped, so
	// only what follows it is kept.
	Hint string
	// Lines are the hunk's context, removed and added lines, in order.
	Lines []HunkLine
	// EOF reports a "*** End of File" marker: the hunk must match at the
	// end of the file.
	EOF bool
	// Line is the 1-based line in the patch text where the hunk starts.
	Line int
}

// LineKind says what a hunk line does.
type LineKind byte

// Kinds of hunk lines; the value is the line's prefix in the patch.
const (
	LineContext LineKind = ' ' // kept as it is
	LineRemoved LineKind = '-' // removed
	LineAdded   LineKind = '+' // inserted
)

// HunkLine is one line of a hunk, without its prefix.
type HunkLine struct {
	Kind LineKind
	Text string
}

// Parse parses a patch in the envelope Codex-style models write:
//
//	*** Begin Patch
//	*** Add File: path
//	+line
//	*** Delete File: path
//	*** Update File: path
//	*** Move to: new/path
//	@@ optional line to search for first
//	 context line
//	-removed line
//	+added line
//	*** End of File
//	*** End Patch
//
// "***" markers may carry surrounding spaces ("@@" only trailing ones: " @@"
// is a context line), lines may end in "\r\n", blank lines
// around the envelope and between sections are ignored, and an envelope
// wrapped in a shell heredoc (<<'EOF' … EOF) is accepted, as Codex does.
// Inside a hunk an empty line stands for an empty context line, except at
// the end of the hunk, where it only separates sections. The first hunk of
// an Update may omit its "@@" line.
//
// Errors are *ParseError values naming the line at fault. Patches over
// DefaultMaxPatchBytes are refused with a *PatchError matching ErrTooLarge.
func Parse(patch string) (*Patch, error) {
	return parse(patch, DefaultMaxPatchBytes)
}

func parse(patch string, limit int64) (*Patch, error) {
	if int64(len(patch)) > limit {
		return nil, &PatchError{Msg: fmt.Sprintf("the patch is %d bytes, over the %d-byte limit", len(patch), limit), kind: ErrTooLarge}
	}
	lines := strings.Split(patch, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSuffix(l, "\r")
	}
	p := &parser{lines: lines}
	return p.parse()
}

type parser struct {
	lines []string // the patch text, split into lines without their ends
	i     int      // index of the next line to read
	end   int      // index of the "*** End Patch" line
}

// errorf returns a *ParseError for the line with index i.
func (p *parser) errorf(i int, format string, args ...any) error {
	return &ParseError{Line: i + 1, Msg: fmt.Sprintf(format, args...)}
}

func (p *parser) parse() (*Patch, error) {
	first, last := 0, len(p.lines)-1
	for first <= last && isBlank(p.lines[first]) {
		first++
	}
	for last >= first && isBlank(p.lines[last]) {
		last--
	}
	if first > last {
		return nil, p.errorf(0, "empty patch: expected %q", beginMarker)
	}
	// Codex accepts the patch still wrapped in the heredoc a model meant
	// for a shell (apply_patch <<'EOF' … EOF).
	if last-first >= 3 && isHeredocStart(p.lines[first]) && strings.HasSuffix(strings.TrimSpace(p.lines[last]), "EOF") {
		first, last = first+1, last-1
		for first <= last && isBlank(p.lines[first]) {
			first++
		}
		for last >= first && isBlank(p.lines[last]) {
			last--
		}
	}
	if strings.TrimSpace(p.lines[first]) != beginMarker {
		return nil, p.errorf(first, "expected %q, found %s", beginMarker, quote(p.lines[first]))
	}
	if last == first {
		return nil, p.errorf(first, "missing %q after %q", endMarker, beginMarker)
	}
	if strings.TrimSpace(p.lines[last]) != endMarker {
		return nil, p.errorf(last, "expected %q as the last line, found %s", endMarker, quote(p.lines[last]))
	}
	p.i, p.end = first+1, last

	patch := &Patch{}
	for p.skipBlank() < p.end {
		op, err := p.section()
		if err != nil {
			return nil, err
		}
		patch.Files = append(patch.Files, op)
	}
	if len(patch.Files) == 0 {
		return nil, p.errorf(p.end, "no file sections between %q and %q", beginMarker, endMarker)
	}
	return patch, nil
}

// skipBlank moves past blank lines and returns the index of the next line.
func (p *parser) skipBlank() int {
	for p.i < p.end && isBlank(p.lines[p.i]) {
		p.i++
	}
	return p.i
}

// section parses one file section; p.i is at its header.
func (p *parser) section() (FileOp, error) {
	at := p.i
	t := strings.TrimSpace(p.lines[at])
	var op FileOp
	switch {
	case strings.HasPrefix(t, addMarker):
		op = FileOp{Action: AddFile, Path: strings.TrimSpace(t[len(addMarker):]), Line: at + 1}
	case strings.HasPrefix(t, deleteMarker):
		op = FileOp{Action: DeleteFile, Path: strings.TrimSpace(t[len(deleteMarker):]), Line: at + 1}
	case strings.HasPrefix(t, updateMarker):
		op = FileOp{Action: UpdateFile, Path: strings.TrimSpace(t[len(updateMarker):]), Line: at + 1}
	case t == endMarker:
		return op, p.errorf(at, "%q before the end of the patch", endMarker)
	case strings.HasPrefix(t, "***"):
		return op, p.errorf(at, "unknown header %s: expected %q, %q or %q", quote(t), addMarker, deleteMarker, updateMarker)
	default:
		return op, p.errorf(at, "expected a file header (%q, %q or %q), found %s", addMarker, deleteMarker, updateMarker, quote(p.lines[at]))
	}
	header := t[:strings.IndexByte(t, ':')+1]
	if err := p.checkPath(at, header, op.Path); err != nil {
		return op, err
	}
	p.i++
	switch op.Action {
	case AddFile:
		content, err := p.addLines(header, op.Path)
		if err != nil {
			return op, err
		}
		op.Content = content
	case UpdateFile:
		if err := p.update(&op); err != nil {
			return op, err
		}
	}
	return op, nil
}

func (p *parser) checkPath(at int, header, path string) error {
	if path == "" {
		return p.errorf(at, "missing path after %q", header)
	}
	if strings.ContainsRune(path, 0) {
		return p.errorf(at, "path contains a NUL byte")
	}
	return nil
}

// addLines reads the "+" lines of an Add section.
func (p *parser) addLines(header, path string) (string, error) {
	var b strings.Builder
	for p.i < p.end {
		l := p.lines[p.i]
		if text, ok := strings.CutPrefix(l, "+"); ok {
			b.WriteString(text)
			b.WriteByte('\n')
			p.i++
			continue
		}
		if isBlank(l) {
			// Blank lines may separate sections; inside the content they
			// are a mistake, since an empty line of the new file is "+".
			j := p.i
			for j < p.end && isBlank(p.lines[j]) {
				j++
			}
			if j == p.end || isHeader(p.lines[j]) {
				p.i = j
				break
			}
			return "", p.errorf(p.i, "blank line inside %q %s: every line of a new file starts with \"+\" (a lone \"+\" for an empty line)", header, path)
		}
		if isHeader(l) {
			break
		}
		return "", p.errorf(p.i, "expected a line starting with \"+\" in %q %s, found %s", header, path, quote(l))
	}
	return b.String(), nil
}

// update reads the optional "*** Move to:" line and the hunks of an Update
// section.
func (p *parser) update(op *FileOp) error {
	if p.skipBlank() < p.end {
		if t := strings.TrimSpace(p.lines[p.i]); strings.HasPrefix(t, moveMarker) {
			op.MoveTo = strings.TrimSpace(t[len(moveMarker):])
			if err := p.checkPath(p.i, moveMarker, op.MoveTo); err != nil {
				return err
			}
			p.i++
		}
	}
	for p.skipBlank() < p.end {
		l := p.lines[p.i]
		t := strings.TrimSpace(l)
		switch {
		case isHunkHeader(l):
			h := Hunk{Hint: hunkHint(l), Line: p.i + 1}
			p.i++
			if err := p.hunkLines(&h); err != nil {
				return err
			}
			op.Hunks = append(op.Hunks, h)
		case len(op.Hunks) == 0 && isHunkLine(l):
			// Codex lets the first hunk start without its "@@" line.
			h := Hunk{Line: p.i + 1}
			if err := p.hunkLines(&h); err != nil {
				return err
			}
			op.Hunks = append(op.Hunks, h)
		case t == eofMarker:
			return p.errorf(p.i, "%q outside a hunk", eofMarker)
		case strings.HasPrefix(t, moveMarker):
			return p.errorf(p.i, "%q must directly follow %q", moveMarker, updateMarker)
		case strings.HasPrefix(t, "***"):
			if len(op.Hunks) == 0 && op.MoveTo == "" {
				return p.errorf(op.Line-1, "%q %s has no hunks", updateMarker, op.Path)
			}
			return nil
		default:
			return p.errorf(p.i, "expected %q to start a hunk, found %s", hunkMarker, quote(l))
		}
	}
	if len(op.Hunks) == 0 && op.MoveTo == "" {
		return p.errorf(op.Line-1, "%q %s has no hunks", updateMarker, op.Path)
	}
	return nil
}

// hunkLines reads the lines of one hunk, up to the next "@@", section
// header, "*** End of File" or the end of the patch.
func (p *parser) hunkLines(h *Hunk) error {
	bare := 0 // trailing empty lines without a prefix
	for p.i < p.end {
		l := p.lines[p.i]
		if isHunkLine(l) {
			h.Lines = append(h.Lines, HunkLine{Kind: LineKind(l[0]), Text: l[1:]})
			bare = 0
			p.i++
			continue
		}
		t := strings.TrimSpace(l)
		if t == "" {
			// An empty line in a hunk is an empty context line whose
			// leading space got lost, unless nothing follows it in the
			// hunk; then it only separates sections (dropped below).
			h.Lines = append(h.Lines, HunkLine{Kind: LineContext})
			bare++
			p.i++
			continue
		}
		if t == eofMarker {
			h.EOF = true
			p.i++
			break
		}
		if isHunkHeader(l) || strings.HasPrefix(t, "***") {
			break
		}
		return p.errorf(p.i, "hunk line must start with \" \" (context), \"-\" (removed) or \"+\" (added), found %s", quote(l))
	}
	h.Lines = h.Lines[:len(h.Lines)-bare]
	if len(h.Lines) == 0 {
		return p.errorf(h.Line-1, "empty hunk: a hunk needs at least one context, removed or added line")
	}
	return nil
}

// isHunkLine reports whether l starts with a hunk line prefix.
func isHunkLine(l string) bool {
	return l != "" && (l[0] == ' ' || l[0] == '-' || l[0] == '+')
}

// isHunkHeader reports whether l is "@@" or "@@ hint". Only trailing
// spaces are allowed: " @@" is a context line.
func isHunkHeader(l string) bool {
	t := strings.TrimRightFunc(l, unicode.IsSpace)
	return t == hunkMarker || strings.HasPrefix(t, hunkMarker+" ")
}

// isHeader reports whether l is a "***" marker line.
func isHeader(l string) bool {
	return strings.HasPrefix(strings.TrimSpace(l), "***")
}

func isBlank(l string) bool { return strings.TrimSpace(l) == "" }

func isHeredocStart(l string) bool {
	switch strings.TrimSpace(l) {
	case "<<EOF", "<<'EOF'", `<<"EOF"`:
		return true
	}
	return false
}

// hunkHint returns the hint of the hunk header l. Models trained on
// unified diffs sometimes write "@@ -12,7 +12,8 @@ func main()": line
// numbers mean nothing here, so the range is dropped and the text after it
// kept.
func hunkHint(l string) string {
	hint := strings.TrimSpace(l[len(hunkMarker):])
	if rest, ok := cutDiffRange(hint); ok {
		return rest
	}
	return hint
}

// cutDiffRange cuts a leading "-a[,b] +c[,d] @@" from s.
func cutDiffRange(s string) (rest string, ok bool) {
	s, ok = cutRange(s, '-')
	if !ok || !strings.HasPrefix(s, " ") {
		return "", false
	}
	s, ok = cutRange(s[1:], '+')
	if !ok {
		return "", false
	}
	s, ok = strings.CutPrefix(s, " "+hunkMarker)
	if !ok || (s != "" && s[0] != ' ') {
		return "", false
	}
	return strings.TrimSpace(s), true
}

// cutRange cuts "<sign>digits[,digits]" from the start of s.
func cutRange(s string, sign byte) (string, bool) {
	if s == "" || s[0] != sign {
		return "", false
	}
	s = s[1:]
	n := digits(s)
	if n == 0 {
		return "", false
	}
	s = s[n:]
	if strings.HasPrefix(s, ",") {
		n = digits(s[1:])
		if n == 0 {
			return "", false
		}
		s = s[1+n:]
	}
	return s, true
}

func digits(s string) int {
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	return n
}

// quote quotes a line of the patch for an error message, shortened so a
// long line does not drown the message.
func quote(l string) string {
	const maxRunes = 80
	n := 0
	for i := range l {
		if n == maxRunes {
			return fmt.Sprintf("%q…", l[:i])
		}
		n++
	}
	return fmt.Sprintf("%q", l)
}
