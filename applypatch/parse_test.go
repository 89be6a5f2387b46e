package applypatch

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	ctx := func(s string) HunkLine { return HunkLine{Kind: LineContext, Text: s} }
	del := func(s string) HunkLine { return HunkLine{Kind: LineRemoved, Text: s} }
	ins := func(s string) HunkLine { return HunkLine{Kind: LineAdded, Text: s} }
	tests := []struct {
		name  string
		patch string
		want  []FileOp
	}{
		{
			name:  "every section",
			patch: "*** Begin Patch\n*** Add File: a/new.txt\n+one\n+\n+three\n*** Delete File: old.txt\n*** Update File: src/x.go\n*** Move to: src/y.go\n@@ func f() {\n a\n-b\n+c\n@@\n d\n+e\n*** End of File\n*** End Patch\n",
			want: []FileOp{
				{Action: AddFile, Path: "a/new.txt", Content: "one\n\nthree\n", Line: 2},
				{Action: DeleteFile, Path: "old.txt", Line: 6},
				{Action: UpdateFile, Path: "src/x.go", MoveTo: "src/y.go", Line: 7, Hunks: []Hunk{
					{Hint: "func f() {", Lines: []HunkLine{ctx("a"), del("b"), ins("c")}, Line: 9},
					{Lines: []HunkLine{ctx("d"), ins("e")}, EOF: true, Line: 13},
				}},
			},
		},
		{
			name:  "empty add",
			patch: "*** Begin Patch\n*** Add File: empty\n*** End Patch",
			want:  []FileOp{{Action: AddFile, Path: "empty", Line: 2}},
		},
		{
			name:  "padded markers and CRLF patch",
			patch: "\r\n  *** Begin Patch  \r\n*** Update File:   a.txt  \r\n@@  \r\n-x\r\n+y\r\n *** End Patch \r\n\r\n",
			want: []FileOp{{Action: UpdateFile, Path: "a.txt", Line: 3, Hunks: []Hunk{
				{Lines: []HunkLine{del("x"), ins("y")}, Line: 4},
			}}},
		},
		{
			name:  "first hunk without @@",
			patch: "*** Begin Patch\n*** Update File: a\n import x\n+import y\n*** End Patch",
			want: []FileOp{{Action: UpdateFile, Path: "a", Line: 2, Hunks: []Hunk{
				{Lines: []HunkLine{ctx("import x"), ins("import y")}, Line: 3},
			}}},
		},
		{
			name:  "empty line inside a hunk is context, trailing ones separate",
			patch: "*** Begin Patch\n*** Update File: a\n@@\n x\n\n-y\n\n\n*** Delete File: b\n*** End Patch",
			want: []FileOp{
				{Action: UpdateFile, Path: "a", Line: 2, Hunks: []Hunk{{Lines: []HunkLine{ctx("x"), ctx(""), del("y")}, Line: 3}}},
				{Action: DeleteFile, Path: "b", Line: 9},
			},
		},
		{
			name:  "unified diff range dropped from the hint",
			patch: "*** Begin Patch\n*** Update File: a\n@@ -12,7 +12,8 @@ func main() {\n-x\n@@ -1 +1 @@\n-y\n*** End Patch",
			want: []FileOp{{Action: UpdateFile, Path: "a", Line: 2, Hunks: []Hunk{
				{Hint: "func main() {", Lines: []HunkLine{del("x")}, Line: 3},
				{Lines: []HunkLine{del("y")}, Line: 5},
			}}},
		},
		{
			name:  "pure move",
			patch: "*** Begin Patch\n*** Update File: a\n*** Move to: b\n*** End Patch",
			want:  []FileOp{{Action: UpdateFile, Path: "a", MoveTo: "b", Line: 2}},
		},
		{
			name:  "heredoc wrapper",
			patch: "<<'EOF'\n*** Begin Patch\n*** Delete File: a\n*** End Patch\nEOF\n",
			want:  []FileOp{{Action: DeleteFile, Path: "a", Line: 3}},
		},
		{
			name:  "context lines that look like markers",
			patch: "*** Begin Patch\n*** Update File: a\n@@\n *** Add File: x\n @@ y\n-z\n*** End Patch",
			want: []FileOp{{Action: UpdateFile, Path: "a", Line: 2, Hunks: []Hunk{
				{Lines: []HunkLine{ctx("*** Add File: x"), ctx("@@ y"), del("z")}, Line: 3},
			}}},
		},
		{
			name:  "unicode",
			patch: "*** Begin Patch\n*** Add File: données/été.txt\n+naïve — 日本語\n*** End Patch",
			want:  []FileOp{{Action: AddFile, Path: "données/été.txt", Content: "naïve — 日本語\n", Line: 2}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := Parse(tt.patch)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(p.Files, tt.want) {
				t.Errorf("Parse:\n got %#v\nwant %#v", p.Files, tt.want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		patch string
		line  int
		msg   string // substring of the message
	}{
		{"empty patch", "", 1, `empty patch: expected "*** Begin Patch"`},
		{"blank patch", "\n  \n", 1, "empty patch"},
		{"missing begin", "\n*** Add File: a\n+x\n*** End Patch", 2, `expected "*** Begin Patch", found "*** Add File: a"`},
		{"missing end", "*** Begin Patch\n*** Add File: a\n+x\n", 3, `expected "*** End Patch" as the last line, found "+x"`},
		{"begin only", "*** Begin Patch", 1, `missing "*** End Patch"`},
		{"no sections", "*** Begin Patch\n\n*** End Patch", 3, "no file sections"},
		{"unknown header", "*** Begin Patch\n*** Rename File: a\n*** End Patch", 2, `unknown header "*** Rename File: a"`},
		{"text outside a section", "*** Begin Patch\nhello\n*** End Patch", 2, `expected a file header`},
		{"hunk line without prefix", "*** Begin Patch\n*** Update File: a\n@@\n x\ny\n*** End Patch", 5, `hunk line must start with " " (context), "-" (removed) or "+" (added), found "y"`},
		{"add line without plus", "*** Begin Patch\n*** Add File: a\n+x\ny\n*** End Patch", 4, `expected a line starting with "+"`},
		{"blank line inside add", "*** Begin Patch\n*** Add File: a\n+x\n\n+y\n*** End Patch", 4, "blank line inside"},
		{"update without hunks", "*** Begin Patch\n*** Update File: a\n*** End Patch", 2, `"*** Update File:" a has no hunks`},
		{"update without hunks before next section", "*** Begin Patch\n*** Update File: a\n*** Delete File: b\n*** End Patch", 2, "has no hunks"},
		{"empty hunk", "*** Begin Patch\n*** Update File: a\n@@ f\n@@\n-x\n*** End Patch", 3, "empty hunk"},
		{"missing path", "*** Begin Patch\n*** Delete File:   \n*** End Patch", 2, `missing path after "*** Delete File:"`},
		{"missing move path", "*** Begin Patch\n*** Update File: a\n*** Move to:\n@@\n-x\n*** End Patch", 3, `missing path after "*** Move to:"`},
		{"late move", "*** Begin Patch\n*** Update File: a\n@@\n-x\n*** Move to: b\n*** End Patch", 5, `"*** Move to:" must directly follow`},
		{"end of file outside a hunk", "*** Begin Patch\n*** Update File: a\n*** End of File\n*** End Patch", 3, "outside a hunk"},
		{"end patch in the middle", "*** Begin Patch\n*** Delete File: a\n*** End Patch\n*** Delete File: b\n*** End Patch", 3, "before the end"},
		{"text after delete", "*** Begin Patch\n*** Delete File: a\n-x\n*** End Patch", 3, "expected a file header"},
		{"no @@ after hunk", "*** Begin Patch\n*** Update File: a\n@@\n-x\n*** End of File\n-y\n*** End Patch", 6, `expected "@@" to start a hunk`},
		{"nul in path", "*** Begin Patch\n*** Delete File: a\x00b\n*** End Patch", 2, "NUL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := Parse(tt.patch)
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("Parse = %+v, %v; want a *ParseError", p, err)
			}
			if pe.Line != tt.line || !strings.Contains(pe.Msg, tt.msg) {
				t.Errorf("Parse error = line %d %q; want line %d containing %q", pe.Line, pe.Msg, tt.line, tt.msg)
			}
			if want := "invalid patch: line "; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("Error() = %q; want prefix %q", err, want)
			}
		})
	}
}

func TestParseTooLarge(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("+"+strings.Repeat("x", 1023)+"\n", DefaultMaxPatchBytes/1024+1)
	_, err := Parse("*** Begin Patch\n*** Add File: big\n" + body + "*** End Patch")
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Parse of an oversized patch = %v; want ErrTooLarge", err)
	}
	if !strings.Contains(err.Error(), "10485760-byte limit") {
		t.Errorf("error %q does not state the limit", err)
	}
}
