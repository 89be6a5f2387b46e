package cgroup

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Files keeps a group's most read control files open, so that reading one
// costs a pread instead of an open, a read and a close: a kernfs open is
// most of the cost (~6 µs of the ~9 µs of a cpu.stat read here), and a
// short command's group is read three times around its exit. A pread at
// offset 0 renders the file anew.
//
// The zero value holds nothing; OpenFiles opens them. Files is not safe for
// concurrent use. Close releases the descriptors.
type Files struct {
	Dir Dir
	fds [numFiles]int // +1: 0 is "not open"
}

// The files kept open.
const (
	fileDir     = iota // the directory itself (O_PATH), for CLONE_INTO_CGROUP
	fileCPUStat        // cpu.stat
	fileEvents         // cgroup.events
	numFiles
)

// FilesOpen is the number of descriptors an open Files holds.
const FilesOpen = numFiles

var fileNames = [numFiles]string{"", "cpu.stat", "cgroup.events"}

// OpenFiles opens d's directory and its cpu.stat and cgroup.events. On an
// error nothing stays open.
func OpenFiles(d Dir) (*Files, error) {
	f := &Files{Dir: d}
	for i := range numFiles {
		path, flags := d.Path+"/"+fileNames[i], unix.O_RDONLY|unix.O_CLOEXEC
		if i == fileDir {
			path, flags = d.Path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC
		}
		fd, err := unix.Open(path, flags, 0)
		if err != nil {
			f.Close()
			return nil, fileError("open", path, err)
		}
		f.fds[i] = fd + 1
	}
	return f, nil
}

// Close closes the descriptors; it is idempotent.
func (f *Files) Close() {
	for i, fd := range f.fds {
		if fd > 0 {
			_ = unix.Close(fd - 1)
			f.fds[i] = 0
		}
	}
}

// DirFD is the group's directory, for CLONE_INTO_CGROUP; it stays Files'.
func (f *Files) DirFD() int { return f.fds[fileDir] - 1 }

// read renders file i anew into buf.
func (f *Files) read(i int, buf []byte) ([]byte, error) {
	if f.fds[i] <= 0 {
		return nil, fmt.Errorf("%s/%s: %w", f.Dir.Path, fileNames[i], os.ErrClosed)
	}
	for {
		n, err := unix.Pread(f.fds[i]-1, buf, 0)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return nil, fileError("read", f.Dir.Path+"/"+fileNames[i], err)
		case n == len(buf):
			return nil, fmt.Errorf("%s/%s: longer than %d bytes", f.Dir.Path, fileNames[i], len(buf))
		}
		return buf[:n], nil
	}
}

// CPUStat is Dir.CPUStat.
func (f *Files) CPUStat() (userUsec, systemUsec uint64, err error) {
	var buf [1024]byte
	b, err := f.read(fileCPUStat, buf[:])
	if err != nil {
		return 0, 0, err
	}
	return parseCPUStat(f.Dir, b)
}

// Events returns cgroup.events (populated, frozen).
func (f *Files) Events(buf []byte) ([]byte, error) { return f.read(fileEvents, buf) }
