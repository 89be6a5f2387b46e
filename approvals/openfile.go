package approvals

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// Limits of the files read on behalf of a request.
const (
	// maxBoundFileSize bounds a file an approval is bound to (an
	// executable or a script operand): hashing it at approval and again
	// at spawn must not take minutes (a sparse file of a terabyte costs
	// nothing to make).
	maxBoundFileSize = 1 << 30
)

// errNotRegular is wrapped by openRegular's error for a path that is not
// a regular file, errIsDir for a directory.
var (
	errNotRegular = errors.New("not a regular file")
	errIsDir      = errors.New("a directory, not a file")
)

// openRegular opens path, a file a request names (a script operand, an
// executable, a git config file in its workdir), for reading without ever
// blocking the daemon: it stats first, so that a FIFO, a device or a
// socket is never opened (opening a tape or a terminal can act); it opens
// with O_NONBLOCK, so that one put in the file's place after the stat
// returns at once instead of waiting for a writer, and close-on-exec
// (os.OpenFile's default); then fstat checks that what it opened is the
// regular file it saw, at most limit bytes long. A symbolic link is
// followed (a loop fails at once, ELOOP). The error names path and says
// what it is instead; ENOENT stays matchable with errors.Is.
func openRegular(path string, limit int64) (*os.File, fs.FileInfo, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	if err := regularWithin(path, fi, limit); err != nil {
		return nil, nil, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|oNonBlock, 0)
	if err != nil {
		return nil, nil, err
	}
	fi2, err := f.Stat()
	if err == nil && !os.SameFile(fi, fi2) {
		err = fmt.Errorf("%s: replaced while being opened", path)
	}
	if err == nil {
		err = regularWithin(path, fi2, limit)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi2, nil
}

// regularWithin refuses anything but a regular file of at most limit
// bytes, naming what it is.
func regularWithin(path string, fi fs.FileInfo, limit int64) error {
	m := fi.Mode()
	if m.IsDir() {
		return fmt.Errorf("%s: %w", path, errIsDir)
	}
	if !m.IsRegular() {
		what := "a special file"
		switch {
		case m&fs.ModeNamedPipe != 0:
			what = "a FIFO"
		case m&fs.ModeCharDevice != 0:
			what = "a character device"
		case m&fs.ModeDevice != 0:
			what = "a block device"
		case m&fs.ModeSocket != 0:
			what = "a socket"
		}
		return fmt.Errorf("%s is %s: %w", path, what, errNotRegular)
	}
	if fi.Size() > limit {
		return fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return nil
}
