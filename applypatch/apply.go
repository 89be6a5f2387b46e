package applypatch

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Options tunes Apply. The zero value uses the defaults.
type Options struct {
	// MaxPatchBytes limits the size of the patch text; 0 means
	// DefaultMaxPatchBytes.
	MaxPatchBytes int64
	// MaxFileBytes limits the size of every file the patch reads (to update,
	// move or delete it) or writes; 0 means DefaultMaxFileBytes.
	MaxFileBytes int64
}

// Apply parses patch (see Parse) and applies it to the files under root.
//
// Paths in the patch are relative to root; absolute paths are accepted when
// they are inside root. A path that leads out of root — through "..", as an
// absolute path elsewhere, or through a symbolic link, whether a directory
// on the way or the file itself — is refused with an error matching
// ErrOutsideRoot, and so is every path inside a .git directory (where it
// is, links resolved, or a root that is one): hooks and config written
// there would run at a later, innocent-looking git command. Symbolic links that stay inside root are followed: an
// update writes through to the link's target and keeps the link, a delete
// removes the link itself, and moving a link is refused.
//
// Nothing is written until the whole patch has been checked: every path,
// every hunk located (see the package documentation for how), every file
// present or absent as the patch needs. Adding a file that exists is refused
// (fs.ErrExist) unless its content is identical; updating, moving or
// deleting a missing file is refused (fs.ErrNotExist), and so is a move onto
// an existing file. Then each file is written atomically: a temporary file
// in the same directory, synced, renamed over the old one. Updated and moved
// files keep their mode (and owner, when the process may set it); new files
// get 0644 and new directories 0755, less the umask.
//
// If a write fails part way (a full disk, a read-only directory), the files
// already written are restored from copies kept in memory, new files and
// the directories made for them removed, and the error says so; restoring
// is best effort and the error reports what could not be restored. The
// context is checked while the patch is checked, not while it is written:
// a patch that started writing is finished or rolled back, never left half
// done. Apply does not guard against other processes changing the tree
// while it runs.
//
// On success the Summary lists the files in patch order; a file added with
// the content it already had is listed as added although nothing was
// written. Errors are a *ParseError for a malformed patch and a
// *PatchError for a patch that does not fit the files or could not be
// written; a root that cannot be opened and a canceled context give
// wrapped errors of their own.
func Apply(ctx context.Context, root string, patch string, opts Options) (Summary, error) {
	return apply(ctx, root, patch, opts, nil)
}

// failFunc, in tests, makes a write or removal fail just before it takes
// effect.
type failFunc func(op, rel string) error

func apply(ctx context.Context, root, patch string, opts Options, fail failFunc) (Summary, error) {
	maxPatch, maxFile := opts.MaxPatchBytes, opts.MaxFileBytes
	if maxPatch <= 0 {
		maxPatch = DefaultMaxPatchBytes
	}
	if maxFile <= 0 {
		maxFile = DefaultMaxFileBytes
	}
	if err := ctx.Err(); err != nil {
		return Summary{}, fmt.Errorf("apply patch: %w", err)
	}
	p, err := parse(patch, maxPatch)
	if err != nil {
		return Summary{}, err
	}
	a, err := newApplier(ctx, root, maxFile, fail)
	if err != nil {
		return Summary{}, err
	}
	defer a.root.Close()
	if err := a.plan(p); err != nil {
		return Summary{}, err
	}
	// Last chance to give up with nothing written.
	if err := ctx.Err(); err != nil {
		return Summary{}, fmt.Errorf("apply patch: %w", err)
	}
	if err := a.commit(); err != nil {
		return Summary{}, err
	}
	return a.sum, nil
}

// applier holds one Apply call: the planned state of every file the patch
// touches, then the writes.
type applier struct {
	ctx       context.Context
	root      *os.Root
	rootPaths []string // the root as given (absolute) and with links resolved
	// rootInGitDir: the root itself is (inside) a .git directory.
	rootInGitDir bool
	maxFile      int64
	fail         failFunc

	files map[string]*entry // by resolved path relative to the root
	order []*entry          // in the order the patch first touches them
	sum   Summary
}

func newApplier(ctx context.Context, root string, maxFile int64, fail failFunc) (*applier, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("apply patch: root directory: %w", err)
	}
	resolved, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("apply patch: root directory: %w", err)
	}
	r, err := os.OpenRoot(abs)
	if err != nil {
		return nil, fmt.Errorf("apply patch: root directory: %w", err)
	}
	paths := []string{abs}
	if resolved != abs {
		paths = append(paths, resolved)
	}
	inGit := false
	for _, p := range paths {
		if slices.ContainsFunc(strings.Split(filepath.ToSlash(p), "/"), isGitDirName) {
			inGit = true
		}
	}
	return &applier{
		ctx:          ctx,
		root:         r,
		rootPaths:    paths,
		rootInGitDir: inGit,
		maxFile:      maxFile,
		fail:         fail,
		files:        make(map[string]*entry),
	}, nil
}

type kind int

const (
	kindAbsent kind = iota
	kindRegular
	kindSymlink
)

// state is what a path holds: on disk before the patch, or as planned.
type state struct {
	kind  kind
	data  []byte
	mode  fs.FileMode // permission and special bits of a regular file
	fresh bool        // a new file: created with the default mode
	owner owner
	link  string // a symbolic link's target
}

// entry is one path the patch touches. orig doubles as the backup that a
// failed write is rolled back to.
type entry struct {
	rel  string // resolved, relative to the root
	file string // as shown in errors
	orig state
	cur  state
}

func (e *entry) changed() bool {
	o, c := e.orig, e.cur
	if o.kind != c.kind {
		return true
	}
	if c.kind == kindRegular {
		return c.fresh || o.mode != c.mode || !bytes.Equal(o.data, c.data)
	}
	return false
}

const modeBits = fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

// plan checks every file section against the files and records the
// outcome in a.files, writing nothing.
func (a *applier) plan(p *Patch) error {
	for _, op := range p.Files {
		if err := a.ctx.Err(); err != nil {
			return fmt.Errorf("apply patch: %w", err)
		}
		var err error
		switch op.Action {
		case AddFile:
			err = a.add(op)
		case DeleteFile:
			err = a.delete(op)
		case UpdateFile:
			err = a.update(op)
		}
		if err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("apply patch: %w", err)
			}
			return err
		}
	}
	return nil
}

func (a *applier) add(op FileOp) error {
	lex, file, err := a.lexical(op.Path)
	if err != nil {
		return err
	}
	rel, err := a.resolve(file, lex, true)
	if err != nil {
		return err
	}
	if int64(len(op.Content)) > a.maxFile {
		return tooLarge(file, "the new file", int64(len(op.Content)), a.maxFile)
	}
	e, err := a.load(file, rel)
	if err != nil {
		return err
	}
	switch {
	case e.cur.kind == kindAbsent:
		if err := a.checkNotDir(file, rel); err != nil {
			return err
		}
		e.cur = state{kind: kindRegular, data: []byte(op.Content), fresh: true}
	case e.cur.kind == kindRegular && string(e.cur.data) == op.Content:
		// Already there: adding it again changes nothing.
	default:
		return &PatchError{File: file, Msg: fmt.Sprintf("cannot add the file: it already exists with different content (use %q to change it)", updateMarker), kind: fs.ErrExist}
	}
	a.sum.Added = appendNew(a.sum.Added, file)
	return nil
}

func (a *applier) delete(op FileOp) error {
	lex, file, err := a.lexical(op.Path)
	if err != nil {
		return err
	}
	// A symbolic link is removed itself, not its target, but a link that
	// leads out of the root is refused like any other path that does.
	if _, err := a.resolve(file, lex, true); errors.Is(err, ErrOutsideRoot) {
		return err
	}
	rel, err := a.resolve(file, lex, false)
	if err != nil {
		return err
	}
	e, err := a.load(file, rel)
	if err != nil {
		return err
	}
	if e.cur.kind == kindAbsent {
		return &PatchError{File: file, Msg: "cannot delete the file: it does not exist", kind: fs.ErrNotExist}
	}
	e.cur = state{kind: kindAbsent}
	a.sum.Deleted = appendNew(a.sum.Deleted, file)
	return nil
}

func (a *applier) update(op FileOp) error {
	lex, file, err := a.lexical(op.Path)
	if err != nil {
		return err
	}
	rel, err := a.resolve(file, lex, true)
	if err != nil {
		return err
	}
	if op.MoveTo != "" {
		// Whether to move the link or its target is anyone's guess, so
		// neither.
		if self, err := a.resolve(file, lex, false); err == nil && self != rel {
			return &PatchError{File: file, Msg: fmt.Sprintf("cannot move a symbolic link; move its target %s instead", filepath.ToSlash(rel))}
		}
	}
	e, err := a.load(file, rel)
	if err != nil {
		return err
	}
	if e.cur.kind != kindRegular {
		return &PatchError{File: file, Msg: "cannot update the file: it does not exist", kind: fs.ErrNotExist}
	}
	data := e.cur.data
	if len(op.Hunks) > 0 {
		if data, err = applyHunks(a.ctx, file, data, op.Hunks); err != nil {
			return err
		}
		if int64(len(data)) > a.maxFile {
			return tooLarge(file, "the updated file", int64(len(data)), a.maxFile)
		}
	}
	if op.MoveTo == "" {
		e.cur.data = data
		a.sum.Modified = appendNew(a.sum.Modified, file)
		return nil
	}
	dlex, dfile, err := a.lexical(op.MoveTo)
	if err != nil {
		return err
	}
	drel, err := a.resolve(dfile, dlex, true)
	if err != nil {
		return err
	}
	if drel == rel {
		e.cur.data = data
		a.sum.Modified = appendNew(a.sum.Modified, file)
		return nil
	}
	d, err := a.load(dfile, drel)
	if err != nil {
		return err
	}
	if d.cur.kind != kindAbsent {
		return &PatchError{File: dfile, Msg: fmt.Sprintf("cannot move %s here: the file already exists", file), kind: fs.ErrExist}
	}
	if err := a.checkNotDir(dfile, drel); err != nil {
		return err
	}
	moved := e.cur
	moved.data = data
	d.cur = moved
	e.cur = state{kind: kindAbsent}
	// Write the new place before removing the old one, so that a crash
	// between the two leaves the content in two places rather than none.
	// Nothing planned so far lies under e.rel (it was a file), so the
	// removal may move later.
	a.order = append(slices.DeleteFunc(a.order, func(x *entry) bool { return x == e }), e)
	a.sum.Moved = append(a.sum.Moved, Move{From: file, To: dfile})
	return nil
}

// load returns the entry for rel, reading the file on first use.
func (a *applier) load(file, rel string) (*entry, error) {
	if e := a.files[rel]; e != nil {
		return e, nil
	}
	e := &entry{rel: rel, file: file}
	fi, err := a.root.Lstat(rel)
	switch {
	case errors.Is(err, fs.ErrNotExist) || a.underRemoved(rel):
		e.orig.kind = kindAbsent
	case err != nil:
		return nil, &PatchError{File: file, Msg: "cannot inspect the file", Err: err}
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := a.root.Readlink(rel)
		if err != nil {
			return nil, &PatchError{File: file, Msg: "cannot read the symbolic link", Err: err}
		}
		e.orig = state{kind: kindSymlink, link: target}
	case fi.IsDir():
		return nil, &PatchError{File: file, Msg: "is a directory, not a file"}
	case !fi.Mode().IsRegular():
		return nil, &PatchError{File: file, Msg: "is not a regular file"}
	default:
		data, err := a.read(file, rel, fi)
		if err != nil {
			return nil, err
		}
		e.orig = state{kind: kindRegular, data: data, mode: fi.Mode() & modeBits, owner: ownerOf(fi)}
	}
	e.cur = e.orig
	a.files[rel] = e
	a.order = append(a.order, e)
	return e, nil
}

func (a *applier) read(file, rel string, fi fs.FileInfo) ([]byte, error) {
	if fi.Size() > a.maxFile {
		return nil, tooLarge(file, "the file", fi.Size(), a.maxFile)
	}
	// Without waiting (oNonBlock): a FIFO put in the file's place since
	// the Lstat would otherwise hold the open until a writer came. What
	// was opened must be the file the Lstat saw.
	f, err := a.root.OpenFile(rel, os.O_RDONLY|oNonBlock, 0)
	if err != nil {
		return nil, &PatchError{File: file, Msg: "cannot read the file", Err: err}
	}
	defer f.Close()
	if fi2, err := f.Stat(); err != nil || !fi2.Mode().IsRegular() || !os.SameFile(fi, fi2) {
		return nil, &PatchError{File: file, Msg: "was replaced while being read"}
	}
	// The size may have changed since Lstat; read one byte past the limit
	// to notice.
	data, err := io.ReadAll(io.LimitReader(f, a.maxFile+1))
	if err != nil {
		return nil, &PatchError{File: file, Msg: "cannot read the file", Err: err}
	}
	if int64(len(data)) > a.maxFile {
		return nil, tooLarge(file, "the file", int64(len(data)), a.maxFile)
	}
	return data, nil
}

// underRemoved reports whether the patch removes a file where a directory
// of rel is: then nothing on disk is at rel any more.
func (a *applier) underRemoved(rel string) bool {
	for dir := filepath.Dir(rel); dir != "."; dir = filepath.Dir(dir) {
		if e := a.files[dir]; e != nil && e.cur.kind == kindAbsent {
			return true
		}
	}
	return false
}

// checkNotDir refuses to create a file at rel when the patch creates files
// beneath it: rel would have to be a directory too.
func (a *applier) checkNotDir(file, rel string) error {
	prefix := rel + string(filepath.Separator)
	for _, e := range a.order {
		if e.cur.kind != kindAbsent && strings.HasPrefix(e.rel, prefix) {
			return &PatchError{File: file, Msg: fmt.Sprintf("cannot create the file: the patch creates %s inside it", e.file)}
		}
	}
	return nil
}

func tooLarge(file, what string, size, limit int64) error {
	return &PatchError{File: file, Msg: fmt.Sprintf("%s is %d bytes, over the %d-byte limit", what, size, limit), kind: ErrTooLarge}
}

// done is an entry whose change was made (or attempted, when applied is
// false), with the directories made for it.
type done struct {
	e       *entry
	created []string
	applied bool
}

// commit writes the planned changes, rolling back on the first failure.
func (a *applier) commit() error {
	var finished []done
	for _, e := range a.order {
		if !e.changed() {
			continue
		}
		d, err := a.commitEntry(e)
		if err == nil {
			finished = append(finished, d)
			continue
		}
		verb := "write"
		if e.cur.kind == kindAbsent {
			verb = "delete"
		}
		rbErr := a.rollback(append(finished, d))
		if rbErr != nil {
			return &PatchError{
				File: e.file,
				Msg:  fmt.Sprintf("could not %s the file, and restoring the files already changed failed", verb),
				Err:  errors.Join(err, rbErr),
			}
		}
		return &PatchError{File: e.file, Msg: fmt.Sprintf("could not %s the file; every file was restored", verb), Err: err}
	}
	return nil
}

func (a *applier) commitEntry(e *entry) (done, error) {
	d := done{e: e}
	if e.cur.kind == kindAbsent {
		if a.fail != nil {
			if err := a.fail("remove", e.rel); err != nil {
				return d, err
			}
		}
		if err := a.root.Remove(e.rel); err != nil {
			return d, err
		}
		d.applied = true
		return d, nil
	}
	var err error
	d.created, err = a.mkdirs(filepath.Dir(e.rel))
	if err != nil {
		return d, err
	}
	if err := a.writeFile(e.rel, e.cur, a.fail); err != nil {
		return d, err
	}
	d.applied = true
	return d, nil
}

// mkdirs creates dir and its missing parents, returning the ones it made,
// outermost first.
func (a *applier) mkdirs(dir string) ([]string, error) {
	if dir == "." {
		return nil, nil
	}
	var created []string
	p := ""
	for c := range strings.SplitSeq(dir, string(filepath.Separator)) {
		p = filepath.Join(p, c)
		err := a.root.Mkdir(p, 0o755)
		switch {
		case err == nil:
			created = append(created, p)
		case errors.Is(err, fs.ErrExist):
			// Resolved paths hold no links: this is a directory, or
			// the next Mkdir or the write says otherwise.
		default:
			return created, err
		}
	}
	return created, nil
}

// writeFile replaces rel with s atomically: a temporary file in the same
// directory, written, synced and renamed over rel.
func (a *applier) writeFile(rel string, s state, fail failFunc) (err error) {
	dir := filepath.Dir(rel)
	perm := fs.FileMode(0o644)
	if !s.fresh {
		// Made private until it has the right mode.
		perm = 0o600
	}
	var f *os.File
	var tmp string
	for range 3 {
		tmp = filepath.Join(dir, ".applypatch-"+rand.Text()+".tmp")
		f, err = a.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
		if !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			a.root.Remove(tmp)
		}
	}()
	if _, err := f.Write(s.data); err != nil {
		return err
	}
	if !s.fresh {
		// Owner before mode: chown clears the setuid and setgid bits.
		keepOwner(f, s.owner)
		if err := f.Chmod(s.mode); err != nil {
			return err
		}
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if fail != nil {
		if err := fail("write", rel); err != nil {
			return err
		}
	}
	if err := a.root.Rename(tmp, rel); err != nil {
		return err
	}
	a.syncDir(dir)
	return nil
}

// keepOwner gives f the owner the file had. Only a privileged process can
// give a file away; an unprivileged one can only edit its own files, whose
// owner already matches, so a failure here changes nothing worth reporting.
func keepOwner(f *os.File, o owner) {
	if !o.known {
		return
	}
	if fi, err := f.Stat(); err == nil && ownerOf(fi) != o {
		_ = f.Chown(o.uid, o.gid)
	}
}

// syncDir makes a rename in dir durable. Best effort: some file systems
// refuse to sync a directory, and the rename itself already happened.
func (a *applier) syncDir(dir string) {
	d, err := a.root.Open(dir)
	if err != nil {
		return
	}
	_ = d.Sync()
	d.Close()
}

// rollback undoes finished changes, newest first, and returns what could
// not be undone.
func (a *applier) rollback(finished []done) error {
	var errs []error
	for _, d := range slices.Backward(finished) {
		e := d.e
		if d.applied {
			if err := a.restore(e); err != nil {
				errs = append(errs, fmt.Errorf("restore %s: %w", e.file, err))
			}
		}
		for _, dir := range slices.Backward(d.created) {
			if err := a.root.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove directory %s: %w", filepath.ToSlash(dir), err))
			}
		}
	}
	return errors.Join(errs...)
}

func (a *applier) restore(e *entry) error {
	switch e.orig.kind {
	case kindRegular:
		return a.writeFile(e.rel, e.orig, nil)
	case kindSymlink:
		if err := a.root.Remove(e.rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return a.root.Symlink(e.orig.link, e.rel)
	}
	if err := a.root.Remove(e.rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func appendNew(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}
