package applypatch

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testDirs makes a root directory and a sibling "outside" directory that
// patches must never reach, and returns both.
func testDirs(t *testing.T) (root, outside string) {
	t.Helper()
	base := t.TempDir()
	root, outside = filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFiles(t, outside, map[string]string{"secret.txt": "secret\n"})
	return root, outside
}

// expand replaces {root} and {outside} in a patch.
func expand(patch, root, outside string) string {
	return strings.NewReplacer("{root}", root, "{outside}", outside).Replace(patch)
}

func TestApply(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		files map[string]string
		setup func(t *testing.T, root, outside string)
		patch string
		want  map[string]string // every regular file under the root afterwards
		text  string            // Summary.Text without its header line
	}{
		{
			name:  "add",
			patch: patchOf("*** Add File: dir/sub/new.txt", "+hello", "+", "+world"),
			want:  map[string]string{"dir/sub/new.txt": "hello\n\nworld\n"},
			text:  "A dir/sub/new.txt\n",
		},
		{
			name:  "add empty file",
			patch: patchOf("*** Add File: empty"),
			want:  map[string]string{"empty": ""},
			text:  "A empty\n",
		},
		{
			name:  "add identical existing file",
			files: map[string]string{"a.txt": "same\n"},
			patch: patchOf("*** Add File: a.txt", "+same"),
			want:  map[string]string{"a.txt": "same\n"},
			text:  "A a.txt\n",
		},
		{
			name:  "update with several hunks",
			files: map[string]string{"a.txt": "1\n2\n3\n4\n5\n6\n7\n8\n9\n"},
			patch: patchOf("*** Update File: a.txt", "@@", " 1", "-2", "+two", " 3", "@@", " 6", "-7", "-8", "+seven-eight", " 9"),
			want:  map[string]string{"a.txt": "1\ntwo\n3\n4\n5\n6\nseven-eight\n9\n"},
			text:  "M a.txt\n",
		},
		{
			name:  "move without content change",
			files: map[string]string{"old/name.txt": "body\n", "old/other.txt": "x\n"},
			patch: patchOf("*** Update File: old/name.txt", "*** Move to: renamed/dir/name.txt"),
			want:  map[string]string{"renamed/dir/name.txt": "body\n", "old/other.txt": "x\n"},
			text:  "M renamed/dir/name.txt (moved from old/name.txt)\n",
		},
		{
			name:  "move with content change",
			files: map[string]string{"a.txt": "one\ntwo\n"},
			patch: patchOf("*** Update File: a.txt", "*** Move to: b.txt", "@@", " one", "-two", "+2"),
			want:  map[string]string{"b.txt": "one\n2\n"},
			text:  "M b.txt (moved from a.txt)\n",
		},
		{
			name:  "delete",
			files: map[string]string{"gone.txt": "x\n", "keep.txt": "y\n"},
			patch: patchOf("*** Delete File: gone.txt"),
			want:  map[string]string{"keep.txt": "y\n"},
			text:  "D gone.txt\n",
		},
		{
			name:  "every action in one patch",
			files: map[string]string{"m.txt": "a\n", "d.txt": "d\n", "mv.txt": "v\n"},
			patch: patchOf("*** Delete File: d.txt", "*** Add File: n.txt", "+n", "*** Update File: mv.txt", "*** Move to: moved.txt",
				"*** Update File: m.txt", "@@", "-a", "+b"),
			want: map[string]string{"m.txt": "b\n", "n.txt": "n\n", "moved.txt": "v\n"},
			text: "A n.txt\nM m.txt\nM moved.txt (moved from mv.txt)\nD d.txt\n",
		},
		{
			name: "end of file anchors the hunk",
			// Without the marker " x" would match twice and be refused.
			files: map[string]string{"a.txt": "x\ny\nx\n"},
			patch: patchOf("*** Update File: a.txt", "@@", " x", "+z", "*** End of File"),
			want:  map[string]string{"a.txt": "x\ny\nx\nz\n"},
			text:  "M a.txt\n",
		},
		{
			name:  "CRLF file stays CRLF",
			files: map[string]string{"win.txt": "a\r\nb\r\nc\r\n"},
			patch: patchOf("*** Update File: win.txt", "@@", " a", "-b", "+B", "+new", " c", "+end"),
			want:  map[string]string{"win.txt": "a\r\nB\r\nnew\r\nc\r\nend\r\n"},
			text:  "M win.txt\n",
		},
		{
			name:  "CRLF patch on an LF file",
			files: map[string]string{"a.txt": "a\nb\n"},
			patch: strings.ReplaceAll(patchOf("*** Update File: a.txt", "@@", " a", "-b", "+c"), "\n", "\r\n"),
			want:  map[string]string{"a.txt": "a\nc\n"},
			text:  "M a.txt\n",
		},
		{
			name:  "no final newline kept when the end is untouched",
			files: map[string]string{"a.txt": "a\nb\nc"},
			patch: patchOf("*** Update File: a.txt", "@@", "-a", "+A", " b"),
			want:  map[string]string{"a.txt": "A\nb\nc"},
			text:  "M a.txt\n",
		},
		{
			name:  "no final newline: appending ends with one",
			files: map[string]string{"a.txt": "a\nb"},
			patch: patchOf("*** Update File: a.txt", "@@", " b", "+c"),
			want:  map[string]string{"a.txt": "a\nb\nc\n"},
			text:  "M a.txt\n",
		},
		{
			name:  "no final newline: replacing the last line ends with one",
			files: map[string]string{"a.txt": "a\nb"},
			patch: patchOf("*** Update File: a.txt", "@@", " a", "-b", "+B"),
			want:  map[string]string{"a.txt": "a\nB\n"},
			text:  "M a.txt\n",
		},
		{
			name:  "no final newline on a CRLF file",
			files: map[string]string{"a.txt": "a\r\nb\r\nc"},
			patch: patchOf("*** Update File: a.txt", "@@", " c", "+d"),
			want:  map[string]string{"a.txt": "a\r\nb\r\nc\r\nd\r\n"},
			text:  "M a.txt\n",
		},
		{
			name:  "unicode content and paths",
			files: map[string]string{"données/été.txt": "naïve café\n日本語\nfin\n"},
			patch: patchOf("*** Update File: données/été.txt", "@@ naïve café", "-日本語", "+中文 🎉", "*** Add File: 文件/新.txt", "+привет"),
			want:  map[string]string{"données/été.txt": "naïve café\n中文 🎉\nfin\n", "文件/新.txt": "привет\n"},
			text:  "A 文件/新.txt\nM données/été.txt\n",
		},
		{
			name:  "byte order mark kept",
			files: map[string]string{"bom.txt": "\ufefffirst\nsecond\n"},
			patch: patchOf("*** Update File: bom.txt", "@@", "-first", "+1st"),
			want:  map[string]string{"bom.txt": "\ufeff1st\nsecond\n"},
			text:  "M bom.txt\n",
		},
		{
			// "foo" matches line 3 exactly; ignoring trailing whitespace it
			// would match lines 2 and 3 and be refused as ambiguous.
			name:  "exact match wins",
			files: map[string]string{"a.txt": "x\nfoo  \nfoo\n"},
			patch: patchOf("*** Update File: a.txt", "@@", "-foo", "+bar"),
			want:  map[string]string{"a.txt": "x\nfoo  \nbar\n"},
			text:  "M a.txt\n",
		},
		{
			// No exact match; ignoring trailing whitespace matches line 2
			// only; trimming would also match line 1 and be ambiguous.
			name:  "trailing whitespace ignored",
			files: map[string]string{"a.txt": "  foo\nfoo \t\n"},
			patch: patchOf("*** Update File: a.txt", "@@", "-foo", "+bar"),
			want:  map[string]string{"a.txt": "  foo\nbar\n"},
			text:  "M a.txt\n",
		},
		{
			// Only trimmed comparison matches; the context line keeps the
			// file's indentation, not the patch's.
			name:  "surrounding whitespace ignored",
			files: map[string]string{"a.go": "func f() {\n\tx := 1\n\treturn x\n}\n"},
			patch: patchOf("*** Update File: a.go", "@@", " x := 1", "-return x", "+\treturn x + 1"),
			want:  map[string]string{"a.go": "func f() {\n\tx := 1\n\treturn x + 1\n}\n"},
			text:  "M a.go\n",
		},
		{
			name:  "@@ hint disambiguates",
			files: map[string]string{"a.go": "func a() {\n\treturn 1\n}\n\nfunc b() {\n\treturn 1\n}\n"},
			patch: patchOf("*** Update File: a.go", "@@ func b() {", "-\treturn 1", "+\treturn 2"),
			want:  map[string]string{"a.go": "func a() {\n\treturn 1\n}\n\nfunc b() {\n\treturn 2\n}\n"},
			text:  "M a.go\n",
		},
		{
			name:  "@@ hint repeated as the first context line",
			files: map[string]string{"a.py": "def f():\n    pass\ndef g():\n    pass\n"},
			patch: patchOf("*** Update File: a.py", "@@ def g():", " def g():", "-    pass", "+    return 1"),
			want:  map[string]string{"a.py": "def f():\n    pass\ndef g():\n    return 1\n"},
			text:  "M a.py\n",
		},
		{
			name:  "hunks in order, each after the previous",
			files: map[string]string{"a.txt": "x\nx\n"},
			patch: patchOf("*** Update File: a.txt", "@@ x", "-x", "+1", "@@ x", "-x", "+2"),
			want:  map[string]string{"a.txt": "1\n2\n"},
			text:  "M a.txt\n",
		},
		{
			name:  "added lines after the hint line",
			files: map[string]string{"a.txt": "[a]\nk=1\n[b]\nk=2\n"},
			patch: patchOf("*** Update File: a.txt", "@@ [b]", "+new=3"),
			want:  map[string]string{"a.txt": "[a]\nk=1\n[b]\nnew=3\nk=2\n"},
			text:  "M a.txt\n",
		},
		{
			name:  "added lines without context go at the end",
			files: map[string]string{"a.txt": "a\n"},
			patch: patchOf("*** Update File: a.txt", "@@", "+b"),
			want:  map[string]string{"a.txt": "a\nb\n"},
			text:  "M a.txt\n",
		},
		{
			name:  "trailing empty context line standing for the final newline",
			files: map[string]string{"a.txt": "a\nb\n"},
			patch: patchOf("*** Update File: a.txt", "@@", "-b", "+c", " "),
			want:  map[string]string{"a.txt": "a\nc\n"},
			text:  "M a.txt\n",
		},
		{
			name:  "unified diff ranges",
			files: map[string]string{"a.txt": "a\nb\n"},
			patch: patchOf("*** Update File: a.txt", "@@ -1,2 +1,2 @@", " a", "-b", "+c"),
			want:  map[string]string{"a.txt": "a\nc\n"},
			text:  "M a.txt\n",
		},
		{
			name:  "first hunk without @@",
			files: map[string]string{"a.txt": "import x\n"},
			patch: patchOf("*** Update File: a.txt", " import x", "+import y"),
			want:  map[string]string{"a.txt": "import x\nimport y\n"},
			text:  "M a.txt\n",
		},
		{
			name:  "add then update the same file",
			patch: patchOf("*** Add File: a.txt", "+a", "*** Update File: a.txt", "@@", "-a", "+b"),
			want:  map[string]string{"a.txt": "b\n"},
			text:  "A a.txt\nM a.txt\n",
		},
		{
			name:  "delete then add a file where it was",
			files: map[string]string{"a": "file\n"},
			patch: patchOf("*** Delete File: a", "*** Add File: a/b", "+nested"),
			want:  map[string]string{"a/b": "nested\n"},
			text:  "A a/b\nD a\n",
		},
		{
			name:  "absolute path inside the root",
			files: map[string]string{"a.txt": "a\n"},
			patch: patchOf("*** Update File: {root}/a.txt", "@@", "-a", "+b", "*** Add File: {root}/sub/../c.txt", "+c"),
			want:  map[string]string{"a.txt": "b\n", "c.txt": "c\n"},
			text:  "A c.txt\nM a.txt\n",
		},
		{
			name:  "dot-dot that stays inside",
			files: map[string]string{"a/b.txt": "b\n"},
			patch: patchOf("*** Update File: a/../a/./b.txt", "@@", "-b", "+c"),
			want:  map[string]string{"a/b.txt": "c\n"},
			text:  "M a/b.txt\n",
		},
		{
			name:  "symbolic links inside the root are followed",
			files: map[string]string{"real/a.txt": "a\n", "target.txt": "t\n"},
			setup: func(t *testing.T, root, _ string) {
				symlink(t, "real", filepath.Join(root, "dirlink"))
				symlink(t, filepath.Join(root, "target.txt"), filepath.Join(root, "sub", "abslink"))
			},
			patch: patchOf("*** Update File: dirlink/a.txt", "@@", "-a", "+b", "*** Update File: sub/abslink", "@@", "-t", "+u",
				"*** Add File: dirlink/new.txt", "+n"),
			want: map[string]string{"real/a.txt": "b\n", "target.txt": "u\n", "real/new.txt": "n\n"},
			text: "A dirlink/new.txt\nM dirlink/a.txt\nM sub/abslink\n",
		},
		{
			name:  "deleting a symbolic link removes the link",
			files: map[string]string{"target.txt": "t\n"},
			setup: func(t *testing.T, root, _ string) {
				symlink(t, "target.txt", filepath.Join(root, "link"))
			},
			patch: patchOf("*** Delete File: link"),
			want:  map[string]string{"target.txt": "t\n"},
			text:  "D link\n",
		},
		{
			name:  "heredoc-wrapped patch",
			files: map[string]string{"a.txt": "a\n"},
			patch: "<<'EOF'\n" + patchOf("*** Delete File: a.txt") + "EOF\n",
			want:  map[string]string{},
			text:  "D a.txt\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			root, outside := testDirs(t)
			writeFiles(t, root, tt.files)
			if tt.setup != nil {
				tt.setup(t, root, outside)
			}
			outsideBefore := snapshot(t, outside)
			sum, err := Apply(t.Context(), root, expand(tt.patch, root, outside), Options{})
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if got := regularFiles(t, root); !maps.Equal(got, tt.want) {
				t.Errorf("files after Apply:\n got %q\nwant %q", got, tt.want)
			}
			if want := summaryHeader + "\n" + tt.text; sum.Text() != want {
				t.Errorf("Summary.Text() =\n%s\nwant\n%s", sum.Text(), want)
			}
			if d := diffSnapshots(outsideBefore, snapshot(t, outside)); d != "" {
				t.Errorf("the outside directory changed:%s", d)
			}
		})
	}
}

func TestApplyRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		files map[string]string
		setup func(t *testing.T, root, outside string)
		patch string
		opts  Options
		is    error    // errors.Is target, or nil
		msg   []string // substrings of the error text
	}{
		{
			name:  "dot-dot escape",
			patch: patchOf("*** Add File: ../evil.txt", "+x"),
			is:    ErrOutsideRoot,
			msg:   []string{"../evil.txt: ", `through ".."`},
		},
		{
			name:  "dot-dot escape after a directory",
			files: map[string]string{"a/b.txt": "b\n"},
			patch: patchOf("*** Update File: a/../../outside/secret.txt", "@@", "-secret", "+owned"),
			is:    ErrOutsideRoot,
		},
		{
			name:  "absolute path outside the root",
			patch: patchOf("*** Update File: {outside}/secret.txt", "@@", "-secret", "+owned"),
			is:    ErrOutsideRoot,
			msg:   []string{"absolute path outside the root directory"},
		},
		{
			name:  "absolute path outside the root, to create",
			patch: patchOf("*** Add File: {outside}/new.txt", "+x"),
			is:    ErrOutsideRoot,
		},
		{
			name: "symlink to outside as the file",
			setup: func(t *testing.T, root, outside string) {
				symlink(t, filepath.Join(outside, "secret.txt"), filepath.Join(root, "link.txt"))
			},
			patch: patchOf("*** Update File: link.txt", "@@", "-secret", "+owned"),
			is:    ErrOutsideRoot,
			msg:   []string{"link.txt: symbolic link link.txt points outside the root directory"},
		},
		{
			name: "relative symlink to outside as the file",
			setup: func(t *testing.T, root, _ string) {
				symlink(t, "../../outside/secret.txt", filepath.Join(root, "sub", "link.txt"))
			},
			patch: patchOf("*** Update File: sub/link.txt", "@@", "-secret", "+owned"),
			is:    ErrOutsideRoot,
		},
		{
			name: "symlink to outside as the file, to delete",
			setup: func(t *testing.T, root, outside string) {
				symlink(t, filepath.Join(outside, "secret.txt"), filepath.Join(root, "link.txt"))
			},
			patch: patchOf("*** Delete File: link.txt"),
			is:    ErrOutsideRoot,
		},
		{
			name: "symlink to outside as the file, to add over",
			setup: func(t *testing.T, root, outside string) {
				symlink(t, filepath.Join(outside, "new.txt"), filepath.Join(root, "link.txt"))
			},
			patch: patchOf("*** Add File: link.txt", "+x"),
			is:    ErrOutsideRoot,
		},
		{
			name: "symlink to outside as a parent directory",
			setup: func(t *testing.T, root, outside string) {
				symlink(t, outside, filepath.Join(root, "dir"))
			},
			patch: patchOf("*** Add File: dir/new.txt", "+x"),
			is:    ErrOutsideRoot,
			msg:   []string{"dir/new.txt: symbolic link dir points outside the root directory"},
		},
		{
			name: "relative symlink to outside as a parent directory",
			setup: func(t *testing.T, root, _ string) {
				symlink(t, "../outside", filepath.Join(root, "dir"))
			},
			patch: patchOf("*** Update File: dir/secret.txt", "@@", "-secret", "+owned"),
			is:    ErrOutsideRoot,
		},
		{
			name:  "symlink to outside as the move target's directory",
			files: map[string]string{"a.txt": "a\n"},
			setup: func(t *testing.T, root, outside string) {
				symlink(t, outside, filepath.Join(root, "dir"))
			},
			patch: patchOf("*** Update File: a.txt", "*** Move to: dir/a.txt"),
			is:    ErrOutsideRoot,
		},
		{
			name: "symlink loop",
			setup: func(t *testing.T, root, _ string) {
				symlink(t, "l2", filepath.Join(root, "l1"))
				symlink(t, "l1", filepath.Join(root, "l2"))
			},
			patch: patchOf("*** Add File: l1/x", "+x"),
			msg:   []string{"too many levels of symbolic links"},
		},
		{
			name:  "update of a missing file",
			patch: patchOf("*** Update File: missing.txt", "@@", "-a", "+b"),
			is:    fs.ErrNotExist,
			msg:   []string{"missing.txt: cannot update the file: it does not exist"},
		},
		{
			name:  "delete of a missing file",
			patch: patchOf("*** Delete File: missing.txt"),
			is:    fs.ErrNotExist,
			msg:   []string{"missing.txt: cannot delete the file: it does not exist"},
		},
		{
			name:  "move of a missing file",
			patch: patchOf("*** Update File: missing.txt", "*** Move to: b.txt"),
			is:    fs.ErrNotExist,
		},
		{
			name:  "add over an existing different file",
			files: map[string]string{"a.txt": "old\n"},
			patch: patchOf("*** Add File: a.txt", "+new"),
			is:    fs.ErrExist,
			msg:   []string{"a.txt: cannot add the file: it already exists with different content"},
		},
		{
			name:  "move onto an existing file",
			files: map[string]string{"a.txt": "a\n", "b.txt": "b\n"},
			patch: patchOf("*** Update File: a.txt", "*** Move to: b.txt"),
			is:    fs.ErrExist,
			msg:   []string{"b.txt: cannot move a.txt here: the file already exists"},
		},
		{
			name:  "move of a symbolic link",
			files: map[string]string{"target.txt": "t\n"},
			setup: func(t *testing.T, root, _ string) {
				symlink(t, "target.txt", filepath.Join(root, "link"))
			},
			patch: patchOf("*** Update File: link", "*** Move to: moved"),
			msg:   []string{"link: cannot move a symbolic link; move its target target.txt instead"},
		},
		{
			name:  "delete of a directory",
			files: map[string]string{"dir/a.txt": "a\n"},
			patch: patchOf("*** Delete File: dir"),
			msg:   []string{"dir: is a directory, not a file"},
		},
		{
			name:  "add under a file",
			files: map[string]string{"f.txt": "f\n"},
			patch: patchOf("*** Add File: f.txt/x", "+x"),
			msg:   []string{"f.txt is not a directory"},
		},
		{
			name:  "add a file where the patch makes a directory",
			patch: patchOf("*** Add File: a/b", "+x", "*** Add File: a", "+y"),
			msg:   []string{"a: cannot create the file: the patch creates a/b inside it"},
		},
		{
			name:  "path naming the root",
			patch: patchOf("*** Delete File: ."),
			msg:   []string{"names the root directory"},
		},
		{
			name:  "context not found",
			files: map[string]string{"a.txt": "one\ntwo\nthree\n"},
			patch: patchOf("*** Update File: a.txt", "@@", "-one", "+1", "@@", " two", "-four", "+4"),
			is:    ErrNoMatch,
			msg:   []string{"a.txt: hunk 2: could not find the expected lines:\n    two\n    four"},
		},
		{
			name:  "nothing looser than trimmed whitespace",
			files: map[string]string{"a.txt": "f oo\nFoo\nfoo;\n"},
			patch: patchOf("*** Update File: a.txt", "@@", "-foo", "+bar"),
			is:    ErrNoMatch,
		},
		{
			name:  "hint not found",
			files: map[string]string{"a.txt": "a\n"},
			patch: patchOf("*** Update File: a.txt", "@@ func missing()", "-a", "+b"),
			is:    ErrNoMatch,
			msg:   []string{`a.txt: hunk 1: could not find the @@ line:` + "\n    func missing()"},
		},
		{
			name:  "hunks out of order",
			files: map[string]string{"a.txt": "a\nb\n"},
			patch: patchOf("*** Update File: a.txt", "@@", "-b", "+B", "@@", "-a", "+A"),
			is:    ErrNoMatch,
			msg:   []string{"hunk 2"},
		},
		{
			name:  "end of file marker, lines elsewhere",
			files: map[string]string{"a.txt": "x\ny\n"},
			patch: patchOf("*** Update File: a.txt", "@@", "-x", "+z", "*** End of File"),
			is:    ErrNoMatch,
			msg:   []string{"at the end of the file"},
		},
		{
			name:  "ambiguous context",
			files: map[string]string{"a.go": "if err != nil {\n\treturn err\n}\nif err != nil {\n\treturn err\n}\n"},
			patch: patchOf("*** Update File: a.go", "@@", " if err != nil {", "-\treturn err", "+\treturn nil"),
			is:    ErrAmbiguous,
			msg: []string{
				"a.go: hunk 1: the expected lines match at 2 places (lines 1, 4)",
				"\n    if err != nil {\n    \treturn err",
			},
		},
		{
			name:  "ambiguous at the first level that matches",
			files: map[string]string{"a.txt": "  foo\nfoo  \n"},
			patch: patchOf("*** Update File: a.txt", "@@", "-\tfoo", "+bar"),
			is:    ErrAmbiguous,
		},
		{
			name:  "binary file",
			files: map[string]string{"bin": "a\x00b\n"},
			patch: patchOf("*** Update File: bin", "@@", "-a", "+b"),
			msg:   []string{"bin: binary file"},
		},
		{
			name:  "file over the size limit",
			files: map[string]string{"big.txt": strings.Repeat("x\n", 100)},
			patch: patchOf("*** Update File: big.txt", "@@", "-x", "+y"),
			opts:  Options{MaxFileBytes: 100},
			is:    ErrTooLarge,
			msg:   []string{"big.txt: the file is 200 bytes, over the 100-byte limit"},
		},
		{
			name:  "updated file over the size limit",
			files: map[string]string{"a.txt": "x\n"},
			patch: patchOf("*** Update File: a.txt", "@@", "-x", "+"+strings.Repeat("y", 100)),
			opts:  Options{MaxFileBytes: 100},
			is:    ErrTooLarge,
		},
		{
			name:  "patch over the size limit",
			patch: patchOf("*** Add File: a.txt", "+"+strings.Repeat("y", 100)),
			opts:  Options{MaxPatchBytes: 100},
			is:    ErrTooLarge,
		},
		{name: "missing Begin", patch: "*** Add File: a\n+x\n*** End Patch", msg: []string{`line 1: expected "*** Begin Patch"`}},
		{name: "missing End", patch: "*** Begin Patch\n*** Add File: a\n+x", msg: []string{`line 3: expected "*** End Patch"`}},
		{name: "unknown header", patch: patchOf("*** Copy File: a"), msg: []string{"line 2: unknown header"}},
		{name: "hunk line without prefix", files: map[string]string{"a": "x\n"}, patch: patchOf("*** Update File: a", "@@", "x"), msg: []string{"line 4: hunk line must start with"}},
		{name: "empty patch", patch: "", msg: []string{"line 1: empty patch"}},
		{
			name:  "last file fails, earlier files untouched",
			files: map[string]string{"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n", "gone.txt": "g\n"},
			patch: patchOf(
				"*** Add File: new/dir/n.txt", "+n",
				"*** Update File: a.txt", "@@", "-a", "+A",
				"*** Delete File: gone.txt",
				"*** Update File: b.txt", "*** Move to: moved/b.txt",
				"*** Update File: c.txt", "@@", "-not there", "+C",
			),
			is:  ErrNoMatch,
			msg: []string{"c.txt: hunk 1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			root, outside := testDirs(t)
			writeFiles(t, root, tt.files)
			if tt.setup != nil {
				tt.setup(t, root, outside)
			}
			rootBefore, outsideBefore := snapshot(t, root), snapshot(t, outside)
			sum, err := Apply(t.Context(), root, expand(tt.patch, root, outside), tt.opts)
			if err == nil {
				t.Fatalf("Apply succeeded: %s", sum.Text())
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("Apply error %q does not match %v", err, tt.is)
			}
			var pe *PatchError
			var parseErr *ParseError
			if !errors.As(err, &pe) && !errors.As(err, &parseErr) {
				t.Errorf("Apply error %q (%T) is neither a *PatchError nor a *ParseError", err, err)
			}
			for _, m := range tt.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("Apply error\n%s\ndoes not contain\n%s", err, m)
				}
			}
			if d := diffSnapshots(rootBefore, snapshot(t, root)); d != "" {
				t.Errorf("the root changed:%s", d)
			}
			if d := diffSnapshots(outsideBefore, snapshot(t, outside)); d != "" {
				t.Errorf("the outside directory changed:%s", d)
			}
			if len(sum.Added)+len(sum.Modified)+len(sum.Deleted)+len(sum.Moved) != 0 {
				t.Errorf("a failed Apply returned a summary: %+v", sum)
			}
		})
	}
}

func TestApplyRollback(t *testing.T) {
	t.Parallel()
	injected := errors.New("injected disk error")
	patch := patchOf(
		"*** Add File: new/dir/n.txt", "+n",
		"*** Update File: a.txt", "@@", "-a", "+A",
		"*** Delete File: link",
		"*** Delete File: gone.txt",
		"*** Update File: b.txt", "*** Move to: moved/b.txt",
		"*** Update File: c.txt", "@@", "-c", "+C",
	)
	tests := []struct {
		name string
		fail failFunc
	}{
		{"last write fails", func(op, rel string) error {
			if op == "write" && rel == "c.txt" {
				return injected
			}
			return nil
		}},
		{"a removal fails", func(op, rel string) error {
			if op == "remove" && rel == "b.txt" {
				return injected
			}
			return nil
		}},
		{"the first write fails", func(op, rel string) error {
			if op == "write" {
				return injected
			}
			return nil
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			root, _ := testDirs(t)
			writeFiles(t, root, map[string]string{"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n", "gone.txt": "g\n", "target": "t\n"})
			symlink(t, "target", filepath.Join(root, "link"))
			if err := os.Chmod(filepath.Join(root, "a.txt"), 0o751); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, root)
			_, err := apply(t.Context(), root, patch, Options{}, tt.fail)
			if !errors.Is(err, injected) {
				t.Fatalf("apply = %v; want the injected error", err)
			}
			var pe *PatchError
			if !errors.As(err, &pe) || !strings.Contains(pe.Msg, "every file was restored") {
				t.Errorf("error %q does not say the files were restored", err)
			}
			if d := diffSnapshots(before, snapshot(t, root)); d != "" {
				t.Errorf("the root changed:%s", d)
			}
		})
	}
}

func TestApplyKeepsMode(t *testing.T) {
	t.Parallel()
	root, _ := testDirs(t)
	writeFiles(t, root, map[string]string{"run.sh": "echo a\n", "mv.sh": "echo m\n"})
	for name, mode := range map[string]fs.FileMode{"run.sh": 0o755, "mv.sh": 0o700} {
		if err := os.Chmod(filepath.Join(root, name), mode); err != nil {
			t.Fatal(err)
		}
	}
	patch := patchOf(
		"*** Update File: run.sh", "@@", "-echo a", "+echo b",
		"*** Update File: mv.sh", "*** Move to: bin/mv.sh", "@@", "-echo m", "+echo n",
		"*** Add File: new.txt", "+x",
	)
	if _, err := Apply(t.Context(), root, patch, Options{}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]fs.FileMode{"run.sh": 0o755, "bin/mv.sh": 0o700} {
		fi, err := os.Stat(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s mode = %v; want %v", name, fi.Mode(), want)
		}
	}
	fi, err := os.Stat(filepath.Join(root, "new.txt"))
	if err != nil {
		t.Fatal(err)
	}
	// 0644 less the umask.
	if m := fi.Mode(); m&0o600 != 0o600 || m&0o133 != 0 {
		t.Errorf("new file mode = %v; want 0644 less the umask", m)
	}
	fi, err = os.Stat(filepath.Join(root, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	if m := fi.Mode(); !m.IsDir() || m.Perm()&0o700 != 0o700 || m.Perm()&0o022 != 0 {
		t.Errorf("new directory mode = %v; want 0755 less the umask", m)
	}
}

func TestApplyCanceled(t *testing.T) {
	t.Parallel()
	root, _ := testDirs(t)
	writeFiles(t, root, map[string]string{"a.txt": "a\n"})
	before := snapshot(t, root)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := Apply(ctx, root, patchOf("*** Update File: a.txt", "@@", "-a", "+b"), Options{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Apply with a canceled context = %v; want context.Canceled", err)
	}
	if d := diffSnapshots(before, snapshot(t, root)); d != "" {
		t.Errorf("the root changed:%s", d)
	}
}

func TestApplyBadRoot(t *testing.T) {
	t.Parallel()
	root, _ := testDirs(t)
	writeFiles(t, root, map[string]string{"file": "x\n"})
	for _, r := range []string{filepath.Join(root, "missing"), filepath.Join(root, "file")} {
		if _, err := Apply(t.Context(), r, patchOf("*** Add File: a", "+a"), Options{}); err == nil {
			t.Errorf("Apply under %s succeeded", r)
		}
	}
}

func TestApplyRootThroughSymlink(t *testing.T) {
	t.Parallel()
	root, _ := testDirs(t)
	alias := filepath.Join(filepath.Dir(root), "alias")
	symlink(t, root, alias)
	writeFiles(t, root, map[string]string{"a.txt": "a\n"})
	// Absolute paths may name the root either way.
	patch := patchOf("*** Update File: "+filepath.Join(root, "a.txt"), "@@", "-a", "+b",
		"*** Add File: "+filepath.Join(alias, "c.txt"), "+c")
	if _, err := Apply(t.Context(), alias, patch, Options{}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a.txt": "b\n", "c.txt": "c\n"}
	if got := regularFiles(t, root); !maps.Equal(got, want) {
		t.Errorf("files = %q; want %q", got, want)
	}
}

func TestSummary(t *testing.T) {
	t.Parallel()
	s := Summary{
		Added:    []string{"a"},
		Modified: []string{"m"},
		Deleted:  []string{"d"},
		Moved:    []Move{{From: "old", To: "new"}},
	}
	const text = "Success. Updated the following files:\nA a\nM m\nM new (moved from old)\nD d\n"
	if got := s.Text(); got != text {
		t.Errorf("Text() = %q; want %q", got, text)
	}
	res := s.Result()
	if res.Text() != text || res.Status() != "completed" {
		t.Errorf("Result() = %+v", res)
	}
	raw, err := json.Marshal(s.Details())
	if err != nil {
		t.Fatal(err)
	}
	const details = `{"added":["a"],"deleted":["d"],"modified":["m"],"moved":[{"from":"old","to":"new"}],"status":"completed"}`
	if string(raw) != details {
		t.Errorf("Details() = %s; want %s", raw, details)
	}
	raw, err = json.Marshal(Summary{}.Details())
	if err != nil {
		t.Fatal(err)
	}
	const empty = `{"added":[],"deleted":[],"modified":[],"moved":[],"status":"completed"}`
	if string(raw) != empty {
		t.Errorf("empty Details() = %s; want %s", raw, empty)
	}
}

func TestPatchErrorText(t *testing.T) {
	t.Parallel()
	cause := errors.New("no space left on device")
	tests := []struct {
		err  *PatchError
		want string
	}{
		{&PatchError{File: "a.txt", Hunk: 2, Msg: "could not find the expected lines", Context: "x\n\ty"},
			"a.txt: hunk 2: could not find the expected lines:\n    x\n    \ty"},
		{&PatchError{File: "a.txt", Msg: "could not write the file", Err: cause}, "a.txt: could not write the file: no space left on device"},
		{&PatchError{Msg: "whole patch"}, "whole patch"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q; want %q", got, tt.want)
		}
	}
	if !errors.Is(&PatchError{Err: cause}, cause) {
		t.Error("PatchError does not unwrap to its cause")
	}
	if errors.Is(&PatchError{}, ErrNoMatch) {
		t.Error("a PatchError without a kind matches ErrNoMatch")
	}
}

// A move writes the new file before it removes the old one, so a crash in
// between cannot lose the content.
func TestApplyMoveWritesFirst(t *testing.T) {
	t.Parallel()
	root, _ := testDirs(t)
	writeFiles(t, root, map[string]string{"a.txt": "a\n"})
	var ops []string
	record := func(op, rel string) error {
		ops = append(ops, op+" "+filepath.ToSlash(rel))
		return nil
	}
	patch := patchOf("*** Update File: a.txt", "*** Move to: b/a.txt", "*** Add File: a.txt/c.txt", "+c")
	if _, err := apply(t.Context(), root, patch, Options{}, record); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(ops, ", "), "write b/a.txt, remove a.txt, write a.txt/c.txt"; got != want {
		t.Errorf("operations = %s; want %s", got, want)
	}
	if got, want := regularFiles(t, root), map[string]string{"b/a.txt": "a\n", "a.txt/c.txt": "c\n"}; !maps.Equal(got, want) {
		t.Errorf("files = %q; want %q", got, want)
	}
}

// TestApplyNeverWritesGitDir: no path inside a .git directory is written,
// whatever the spelling, the link or the operation, and a root inside one
// refuses everything; nothing changes when a patch is refused. A file that
// merely has .git in its name is fine.
func TestApplyNeverWritesGitDir(t *testing.T) {
	cases := map[string]string{
		"add config":     patchOf("*** Add File: .git/config", "+[alias]", "+\tst = !touch M"),
		"add hook":       patchOf("*** Add File: sub/.git/hooks/pre-commit", "+#!/bin/sh"),
		"upper case":     patchOf("*** Add File: .GIT/config", "+x"),
		"through a link": patchOf("*** Add File: gitlink/config", "+x"),
		"absolute":       "",
		"update":         patchOf("*** Update File: .git/HEAD", "@@", "-ref: refs/heads/main", "+ref: refs/heads/x"),
		"delete":         patchOf("*** Delete File: .git/HEAD"),
		"move into":      patchOf("*** Update File: f.txt", "*** Move to: .git/info/attributes", "@@", "-f", "+f"),
		"move out":       patchOf("*** Update File: .git/HEAD", "*** Move to: head.txt", "@@", "-ref: refs/heads/main", "+x"),
	}
	for name, patch := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{".git/HEAD": "ref: refs/heads/main\n", "f.txt": "f\n"})
			symlink(t, ".git", filepath.Join(dir, "gitlink"))
			if name == "absolute" {
				patch = patchOf("*** Add File: "+filepath.Join(dir, ".git", "hooks", "post-checkout"), "+x")
			}
			before := snapshot(t, dir)
			_, err := Apply(t.Context(), dir, patch, Options{})
			if !errors.Is(err, ErrOutsideRoot) || !strings.Contains(err.Error(), ".git directory") {
				t.Fatalf("err = %v, want ErrOutsideRoot for a .git path", err)
			}
			if after := snapshot(t, dir); !maps.Equal(before, after) {
				t.Fatalf("tree changed:\n%v\n%v", before, after)
			}
		})
	}
	t.Run("root inside .git", func(t *testing.T) {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{".git/hooks/x": ""})
		_, err := Apply(t.Context(), filepath.Join(dir, ".git", "hooks"), patchOf("*** Add File: pre-commit", "+x"), Options{})
		if !errors.Is(err, ErrOutsideRoot) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("names that only look alike", func(t *testing.T) {
		dir := t.TempDir()
		patch := patchOf("*** Add File: .gitignore", "+x", "*** Add File: docs/.git.md", "+y", "*** Add File: a.git/b", "+z")
		if _, err := Apply(t.Context(), dir, patch, Options{}); err != nil {
			t.Fatal(err)
		}
	})
}
