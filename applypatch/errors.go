package applypatch

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors that classify why Apply refused a patch. Test for them
// with errors.Is; the error itself is a *PatchError or *ParseError that
// says more. A missing file matches fs.ErrNotExist and an existing one that
// a patch would overwrite matches fs.ErrExist.
var (
	// ErrOutsideRoot: a path escapes the root directory, by "..", as an
	// absolute path elsewhere, or through a symbolic link, or it lies
	// inside a .git directory, which counts as outside: apply_patch never
	// writes there.
	ErrOutsideRoot = errors.New("path outside the root directory")
	// ErrTooLarge: the patch, or a file it reads or writes, is over the limit.
	ErrTooLarge = errors.New("too large")
	// ErrNoMatch: a hunk's lines (or its @@ line) are not in the file.
	ErrNoMatch = errors.New("hunk does not match")
	// ErrAmbiguous: a hunk's lines match at more than one place.
	ErrAmbiguous = errors.New("hunk matches more than one place")
)

// PatchError is the error Apply returns when a patch cannot be applied to
// the files: a hunk that does not match, a path outside the root, a missing
// or existing file, a failed write. When Apply returns a PatchError no file
// was changed (or, after a failed write, every file was put back; see Apply).
type PatchError struct {
	// File is the path the error is about, relative to the root and with
	// forward slashes; "" when it is about the patch as a whole.
	File string
	// Hunk is the 1-based number of the failing hunk within its
	// "*** Update File" section, or 0 when no hunk is at fault.
	Hunk int
	// Context holds the lines that were looked for in the file and not
	// found, or found in more than one place, joined by "\n".
	Context string
	// Msg says what went wrong, in words meant for the author of the patch.
	Msg string
	// Err is the underlying cause (an *fs.PathError from a failed write, a
	// rollback failure), or nil.
	Err error

	// kind is the sentinel (ErrNoMatch, fs.ErrNotExist, …) the error
	// matches with errors.Is without printing it: Msg already says it
	// better.
	kind error
}

// Error renders "file: hunk N: msg: cause", followed by the context lines,
// indented, one per line.
func (e *PatchError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(": ")
	}
	if e.Hunk > 0 {
		fmt.Fprintf(&b, "hunk %d: ", e.Hunk)
	}
	b.WriteString(e.Msg)
	if e.Err != nil {
		if e.Msg != "" {
			b.WriteString(": ")
		}
		b.WriteString(e.Err.Error())
	}
	if e.Context != "" {
		b.WriteString(":")
		for line := range strings.SplitSeq(e.Context, "\n") {
			b.WriteString("\n    ")
			b.WriteString(line)
		}
	}
	return b.String()
}

// Unwrap returns the underlying cause.
func (e *PatchError) Unwrap() error { return e.Err }

// Is reports whether target is the sentinel that classifies e.
func (e *PatchError) Is(target error) bool { return e.kind != nil && target == e.kind }

// ParseError is the error Parse (and Apply) return for a patch that is not
// a well-formed patch envelope.
type ParseError struct {
	// Line is the 1-based line of the patch text at fault.
	Line int
	// Msg says what was expected there.
	Msg string
}

// Error renders "invalid patch: line N: msg".
func (e *ParseError) Error() string {
	return fmt.Sprintf("invalid patch: line %d: %s", e.Line, e.Msg)
}
