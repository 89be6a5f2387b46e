package applypatch

import (
	"strings"

	"github.com/execmesh/execmesh/protocol"
)

// Summary lists the files a patch changed, as paths relative to the root
// with forward slashes, each list in patch order.
type Summary struct {
	Added    []string
	Modified []string
	Deleted  []string
	// Moved lists the files an Update moved, with or without edits.
	Moved []Move
}

// Move is a file an Update moved.
type Move = protocol.Move

// summaryHeader is the first line of Codex's apply_patch output, which
// models know.
const summaryHeader = "Success. Updated the following files:"

// Text renders the summary the way Codex's apply_patch reports success:
//
//	Success. Updated the following files:
//	A added/file
//	M modified/file
//	M new/place (moved from old/place)
//	D deleted/file
//
// Every line ends in "\n". A moved file is an "M" line for its new path,
// which is where the model will find it, with the old path in parentheses.
func (s Summary) Text() string {
	var b strings.Builder
	b.WriteString(summaryHeader + "\n")
	for _, f := range s.Added {
		b.WriteString("A " + f + "\n")
	}
	for _, f := range s.Modified {
		b.WriteString("M " + f + "\n")
	}
	for _, m := range s.Moved {
		b.WriteString("M " + m.To + " (moved from " + m.From + ")\n")
	}
	for _, f := range s.Deleted {
		b.WriteString("D " + f + "\n")
	}
	return b.String()
}

// Details returns the summary as a tool result's details:
// {status:"completed", added:[…], modified:[…], deleted:[…], moved:[{from,to}]}.
// Empty lists are empty, never null.
func (s Summary) Details() protocol.Details {
	return protocol.Details{
		Status:   protocol.Some(protocol.StatusCompleted),
		Added:    protocol.Some(nonNil(s.Added)),
		Modified: protocol.Some(nonNil(s.Modified)),
		Deleted:  protocol.Some(nonNil(s.Deleted)),
		Moved:    protocol.Some(nonNil(s.Moved)),
	}
}

// Result returns the tool result of a successful Apply: Text as its text
// block and Details as its details.
func (s Summary) Result() protocol.Result {
	return protocol.TextResult(s.Text(), s.Details())
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
