// Package statelock gives a daemon its state directory to itself: an
// exclusive flock(2) on a file in the directory, taken at start and held
// for the life of the process, with the holder's pid written in the file
// so that a second daemon can say who holds it.
//
// The kernel releases a flock when the process ends, however it ends
// (kill -9 included), so a lock is never left behind; the file stays, and
// the next daemon locks it again.
package statelock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// FileName is the lock file in the state directory.
const FileName = "daemon.lock"

// Lock is a held state-directory lock.
type Lock struct {
	f    *os.File
	path string
}

// HeldError is the error of Acquire when another process holds the lock.
type HeldError struct {
	Dir  string // the state directory
	Path string // the lock file
	PID  int    // the holder's pid; 0 when the file does not say
}

func (e *HeldError) Error() string {
	who := "another process"
	if e.PID > 0 {
		who = "another execmesh daemon, pid " + strconv.Itoa(e.PID) + ","
	}
	return fmt.Sprintf("state directory %s is in use by %s (lock %s): one daemon per state directory; stop that one, or give this one its own --state-dir", e.Dir, who, e.Path)
}

// Acquire takes the lock of dir (created with mode 0700 when missing) at
// once, without waiting: when another process holds it, the error is a
// *HeldError naming the holder's pid. The caller keeps the Lock for as
// long as it uses dir and calls Release when done (process exit releases
// it too).
func Acquire(dir string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	path := filepath.Join(dir, FileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state directory lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &HeldError{Dir: dir, Path: path, PID: readPID(f)}
		}
		return nil, fmt.Errorf("state directory lock %s: %w", path, err)
	}
	// Ours: record the pid for whoever finds the directory in use.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f, path: path}, nil
}

// readPID reads the holder's pid from the lock file, 0 when it says none
// (the holder may not have written it yet).
func readPID(f *os.File) int {
	buf := make([]byte, 32)
	n, _ := f.ReadAt(buf, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// Path is the lock file.
func (l *Lock) Path() string { return l.path }

// Release gives the lock up. The file stays: removing it would let a
// daemon that opened it just before lock a file nobody else can find.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
