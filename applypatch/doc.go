// Package applypatch applies structured multi-file edits, in the patch
// envelope that Codex-style models write, to the files under a root
// directory, safely: every path stays inside the root, the whole patch is
// checked before anything is written, and each file is replaced
// atomically.
//
// # The envelope
//
//	*** Begin Patch
//	*** Add File: docs/new.md
//	+# New
//	+
//	*** Delete File: old.txt
//	*** Update File: cmd/main.go
//	*** Move to: cmd/tool/main.go
//	@@ func main() {
//	 	cfg := load()
//	-	run(cfg)
//	+	if err := run(cfg); err != nil {
//	+		log.Fatal(err)
//	+	}
//	@@
//	 // end
//	+// more
//	*** End of File
//	*** End Patch
//
// An Add lists every line of the new file with a "+" prefix. An Update
// holds hunks: each starts with "@@", optionally followed by a hint (a line
// to find first, typically the enclosing function's), then lines prefixed
// with " " (context, kept), "-" (removed) and "+" (added). A hunk followed
// by "*** End of File" must match at the end of the file. Parse documents
// the leniencies of the syntax.
//
// # Locating hunks
//
// Hunks are placed in order, each searched from where the previous one
// ended. A hunk with a hint first looks for the hint line, then for its own
// lines from there on, and takes the first match. The lines a hunk expects
// (its context and removed lines) are compared with the file's lines
// exactly, then, if that finds nothing, ignoring trailing whitespace, then
// ignoring leading and trailing whitespace, as Codex's apply_patch does;
// nothing looser is ever tried. A hunk without a hint whose lines match at
// more than one place, at the first of these levels that matches, is
// refused as ambiguous (ErrAmbiguous) rather than guessed at: the error
// names the file, the hunk and the lines, and the author can add context or
// a hint. A hunk whose lines are not found fails with ErrNoMatch, naming
// the same. A hunk with only added lines is inserted after its hint line,
// or, without a hint, at the end of the file.
//
// # Files
//
// Context lines keep the file's own text, so a hunk matched while ignoring
// whitespace does not re-indent them. A file keeps its line endings: new
// lines take the ending most of the file's lines have, so a CRLF file stays
// CRLF. A UTF-8 byte order mark is kept. A file that does not end with a
// newline keeps that while its last line stays last; a patch that changes
// the last line or appends after it leaves the file ending with a newline,
// as Codex does. Added files are written as the patch gives them, every
// line ending in "\n". Files containing NUL bytes are not patched.
//
// Adding a file that already exists is refused unless the content is
// identical (then nothing is written). Codex overwrites; a model that
// believes a file is new when it is not is better told so than allowed to
// wipe it out. Moving onto an existing file is refused for the same reason.
//
// # Results
//
// Apply returns a Summary whose Text is Codex's report ("Success. Updated
// the following files:" and "A path", "M path", "D path" lines; a move is
// "M new (moved from old)") and whose Details is the structured form for a
// tool result. Failures are a *ParseError (with the line of the patch) or a
// *PatchError (with the file, the hunk and the lines not found); the
// sentinel errors classify them. A gateway would report ErrOutsideRoot as a
// security violation and the rest as a failed tool result the model can
// read and act on.
package applypatch
