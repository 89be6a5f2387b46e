package applypatch

import (
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// Without -fuzz these run their seeds as ordinary tests; with
// `go test -fuzz=FuzzParse ./applypatch/` they explore further.

var fuzzSeeds = []string{
	"",
	"*** Begin Patch",
	"*** Begin Patch\n*** End Patch",
	patchOf("*** Add File: a/b.txt", "+x", "+", "+y"),
	patchOf("*** Delete File: a.txt"),
	patchOf("*** Update File: a.txt", "*** Move to: b.txt", "@@ f()", " a", "-b", "+c", "@@", " d", "+e", "*** End of File"),
	patchOf("*** Update File: a.txt", " import x", "+import y", "", "", "@@ -1,2 +1,3 @@ g", "-z"),
	patchOf("*** Update File: a.txt", "@@ -1 +1 @@ -2 +2 @@ x", "-z"),
	"<<'EOF'\n" + patchOf("*** Delete File: a") + "EOF",
	"\r\n *** Begin Patch \r\n*** Add File:  é.txt \r\n+日本\r\n*** End Patch\r\n",
	patchOf("*** Update File: a", "@@", "x"),
	patchOf("*** Copy File: a"),
	patchOf("*** Update File: ../a", "@@", "-secret", "+owned"),
	patchOf("*** Update File: link/secret.txt", "@@", "-secret", "+owned"),
	patchOf("*** Add File: a.txt", "+a", "*** Update File: a.txt", "@@", "-a", "+b"),
}

func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, patch string) {
		p, err := Parse(patch)
		if err != nil {
			var pe *ParseError
			if errors.As(err, &pe) {
				if pe.Line < 1 || pe.Line > strings.Count(patch, "\n")+1 || pe.Msg == "" {
					t.Fatalf("parse error %q has a bad line or message", err)
				}
				return
			}
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("Parse error %q (%T) is not a *ParseError", err, err)
			}
			return
		}
		checkParsed(t, p)
		// Formatting the patch and parsing it again gives the same patch.
		again, err := Parse(format(p))
		if err != nil {
			t.Fatalf("re-parsing %q: %v", format(p), err)
		}
		if a, b := withoutLines(p), withoutLines(again); !reflect.DeepEqual(a, b) {
			t.Fatalf("round trip changed the patch:\n got %#v\nwant %#v", b, a)
		}
	})
}

// checkParsed checks what callers of Parse rely on.
func checkParsed(t *testing.T, p *Patch) {
	t.Helper()
	if len(p.Files) == 0 {
		t.Fatal("accepted a patch without file sections")
	}
	for _, f := range p.Files {
		if f.Path == "" || strings.ContainsAny(f.Path, "\n\x00") || f.Line < 2 {
			t.Fatalf("bad file section %+v", f)
		}
		switch f.Action {
		case AddFile:
			if f.Content != "" && !strings.HasSuffix(f.Content, "\n") {
				t.Fatalf("added content %q does not end in a newline", f.Content)
			}
		case DeleteFile:
		case UpdateFile:
			if len(f.Hunks) == 0 && f.MoveTo == "" {
				t.Fatalf("update without hunks or move: %+v", f)
			}
			for _, h := range f.Hunks {
				if len(h.Lines) == 0 || h.Line < 2 || strings.Contains(h.Hint, "\n") {
					t.Fatalf("bad hunk %+v", h)
				}
				for _, l := range h.Lines {
					if strings.Contains(l.Text, "\n") || (l.Kind != LineContext && l.Kind != LineRemoved && l.Kind != LineAdded) {
						t.Fatalf("bad hunk line %+v", l)
					}
				}
			}
		default:
			t.Fatalf("unknown action %v", f.Action)
		}
	}
}

// format renders a parsed patch in the canonical envelope.
func format(p *Patch) string {
	var b strings.Builder
	b.WriteString(beginMarker + "\n")
	for _, f := range p.Files {
		switch f.Action {
		case AddFile:
			b.WriteString(addMarker + " " + f.Path + "\n")
			for l := range strings.SplitSeq(strings.TrimSuffix(f.Content, "\n"), "\n") {
				if f.Content != "" {
					b.WriteString("+" + l + "\n")
				}
			}
		case DeleteFile:
			b.WriteString(deleteMarker + " " + f.Path + "\n")
		case UpdateFile:
			b.WriteString(updateMarker + " " + f.Path + "\n")
			if f.MoveTo != "" {
				b.WriteString(moveMarker + " " + f.MoveTo + "\n")
			}
			for _, h := range f.Hunks {
				b.WriteString(hunkMarker)
				if h.Hint != "" {
					b.WriteString(" ")
					if _, ok := cutDiffRange(h.Hint); ok {
						// Parse drops one leading range: give it one to drop.
						b.WriteString("-0 +0 @@ ")
					}
					b.WriteString(h.Hint)
				}
				b.WriteString("\n")
				for _, l := range h.Lines {
					b.WriteString(string(rune(l.Kind)) + l.Text + "\n")
				}
				if h.EOF {
					b.WriteString(eofMarker + "\n")
				}
			}
		}
	}
	b.WriteString(endMarker + "\n")
	return b.String()
}

// withoutLines returns the file sections with their line numbers zeroed.
func withoutLines(p *Patch) []FileOp {
	var out []FileOp
	for _, f := range p.Files {
		f.Line = 0
		hunks := make([]Hunk, len(f.Hunks))
		for i, h := range f.Hunks {
			h.Line = 0
			hunks[i] = h
		}
		if f.Hunks != nil {
			f.Hunks = hunks
		}
		out = append(out, f)
	}
	return out
}

// FuzzApply applies arbitrary patches to a small tree next to a directory
// they must never reach: a patch either applies, or fails and leaves the
// tree exactly as it was; the outside directory never changes.
func FuzzApply(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, patch string) {
		root, outside := testDirs(t)
		writeFiles(t, root, map[string]string{"a.txt": "a\nb\nc\n", "d/e.txt": "e\r\nf\r\n", "g.txt": "g"})
		symlink(t, outside, filepath.Join(root, "link"))
		symlink(t, "a.txt", filepath.Join(root, "inner"))
		rootBefore, outsideBefore := snapshot(t, root), snapshot(t, outside)
		_, err := Apply(t.Context(), root, patch, Options{MaxFileBytes: 1 << 20})
		if d := diffSnapshots(outsideBefore, snapshot(t, outside)); d != "" {
			t.Fatalf("the outside directory changed:%s", d)
		}
		if err != nil {
			if d := diffSnapshots(rootBefore, snapshot(t, root)); d != "" {
				t.Fatalf("failed Apply (%v) changed the root:%s", err, d)
			}
			return
		}
		for p := range snapshot(t, root) {
			if strings.Contains(p, ".applypatch-") {
				t.Fatalf("temporary file left behind: %s", p)
			}
		}
	})
}
