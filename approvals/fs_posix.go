//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package approvals

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"
)

// oNoFollow makes opening a symbolic link fail, closing the window between
// the Lstat check and the open.
const oNoFollow = syscall.O_NOFOLLOW

// oNonBlock makes opening a FIFO return at once (see openForRead).
const oNonBlock = syscall.O_NONBLOCK

// linkCount returns the number of hard links of a file.
func linkCount(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 1
}

// lockWait bounds how long Save waits for another writer. Writers hold the
// lock for one read, one write and one rename.
const lockWait = 10 * time.Second

// lockFile takes an exclusive flock on name (created 0600 if missing) and
// returns its release function. flock locks belong to the open file
// description, so two goroutines of one process exclude each other too.
func lockFile(name string) (func(), error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|oNoFollow, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(lockWait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", name, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("lock %s: still held by another writer after %s", name, lockWait)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
