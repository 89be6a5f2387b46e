package applypatch

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
)

// maxLinkHops bounds symbolic link expansion, like the kernel's ELOOP.
const maxLinkHops = 40

// lexical turns a path from the patch into a clean path relative to the
// root, refusing ".." escapes and absolute paths elsewhere. It also returns
// the path as shown in summaries and errors.
func (a *applier) lexical(name string) (rel, file string, err error) {
	if filepath.IsAbs(name) {
		r, ok := a.relToRoot(name)
		if !ok {
			return "", name, &PatchError{File: name, Msg: "absolute path outside the root directory", kind: ErrOutsideRoot}
		}
		rel = r
	} else {
		rel = filepath.Clean(name)
		if escapes(rel) {
			file = filepath.ToSlash(rel)
			return "", file, &PatchError{File: file, Msg: `path leads out of the root directory through ".."`, kind: ErrOutsideRoot}
		}
	}
	file = filepath.ToSlash(rel)
	if rel == "." {
		return "", name, &PatchError{File: name, Msg: "path names the root directory, not a file"}
	}
	return rel, file, nil
}

// relToRoot returns the absolute path p relative to the root, when it is
// inside the root as given or as its symbolic links resolve.
func (a *applier) relToRoot(p string) (string, bool) {
	p = filepath.Clean(p)
	for _, r := range a.rootPaths {
		if rel, err := filepath.Rel(r, p); err == nil && !escapes(rel) {
			return rel, true
		}
	}
	return "", false
}

func escapes(rel string) bool {
	return rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// resolve returns the path, relative to the root, that the clean relative
// path rel refers to once every symbolic link on the way is expanded (the
// last component's too when follow is set). Links are expanded here, one
// component at a time, so that a link leading out of the root is refused
// with a clear error before anything is written; the files are then
// reached through an os.Root, which refuses escapes again at the moment of
// each access. Files the patch already added or removed count as present
// or absent. file names the path in errors.
//
// A path inside a .git directory, where it really is, is refused
// (ErrOutsideRoot): apply_patch never writes there.
func (a *applier) resolve(file, rel string, follow bool) (string, error) {
	p, err := a.resolveLinks(file, rel, follow)
	if err == nil && (a.rootInGitDir || slices.ContainsFunc(strings.Split(p, string(filepath.Separator)), isGitDirName)) {
		return "", &PatchError{File: file, Msg: "path inside a .git directory (apply_patch never writes there: hooks and config in it would run at a later git command)", kind: ErrOutsideRoot}
	}
	return p, err
}

func (a *applier) resolveLinks(file, rel string, follow bool) (string, error) {
	todo := strings.Split(rel, string(filepath.Separator))
	var done []string
	hops := 0
	link := "" // the last link expanded, for errors
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(done) == 0 {
				// rel is clean, so only a link's target can get here.
				return "", &PatchError{File: file, Msg: fmt.Sprintf("symbolic link %s points outside the root directory", link), kind: ErrOutsideRoot}
			}
			done = done[:len(done)-1]
			continue
		}
		p := filepath.Join(filepath.Join(done...), c)
		last := len(todo) == 0
		if e := a.files[p]; e != nil {
			switch {
			case e.cur.kind == kindAbsent:
				return a.missing(file, p, todo)
			case !last:
				return "", &PatchError{File: file, Msg: fmt.Sprintf("%s is a file, not a directory", filepath.ToSlash(p))}
			}
			return p, nil
		}
		fi, err := a.root.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return a.missing(file, p, todo)
		}
		if err != nil {
			return "", &PatchError{File: file, Msg: "cannot inspect the path", Err: err}
		}
		if fi.Mode()&fs.ModeSymlink != 0 && (!last || follow) {
			hops++
			if hops > maxLinkHops {
				return "", &PatchError{File: file, Msg: "too many levels of symbolic links"}
			}
			target, err := a.root.Readlink(p)
			if err != nil {
				return "", &PatchError{File: file, Msg: "cannot read the symbolic link", Err: err}
			}
			link = filepath.ToSlash(p)
			if filepath.IsAbs(target) {
				r, ok := a.relToRoot(target)
				if !ok {
					return "", &PatchError{File: file, Msg: fmt.Sprintf("symbolic link %s points outside the root directory", link), kind: ErrOutsideRoot}
				}
				done = nil
				target = r
			}
			todo = append(strings.Split(target, string(filepath.Separator)), todo...)
			continue
		}
		if !last && !fi.IsDir() {
			return "", &PatchError{File: file, Msg: fmt.Sprintf("%s is not a directory", filepath.ToSlash(p))}
		}
		done = append(done, c)
	}
	if len(done) == 0 {
		return "", &PatchError{File: file, Msg: "path names the root directory, not a file"}
	}
	return filepath.Join(done...), nil
}

// isGitDirName reports a path component git treats as its directory. The
// comparison ignores case: case-insensitive file systems open .git for
// .GIT.
func isGitDirName(c string) bool {
	return strings.EqualFold(c, ".git")
}

// missing returns the path of something that does not exist yet: p and the
// components after it, which the patch may create.
func (a *applier) missing(file, p string, todo []string) (string, error) {
	for _, c := range todo {
		if c == ".." {
			return "", &PatchError{File: file, Msg: fmt.Sprintf("%s does not exist", filepath.ToSlash(p)), kind: fs.ErrNotExist}
		}
	}
	return filepath.Join(append([]string{p}, todo...)...), nil
}
