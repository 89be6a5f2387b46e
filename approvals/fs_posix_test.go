//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package approvals

import (
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// A FIFO that takes the file's place between the Lstat check and the
// open must not block the reader: the open returns at once and the check
// of what was opened refuses it.
func TestOpenForReadFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		f, err := openForRead(path)
		if err == nil {
			fi, serr := f.Stat()
			if serr == nil {
				err = safeFileInfo(path, fi)
			}
			f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrUnsafePath) {
			t.Fatalf("opened FIFO: %v, want ErrUnsafePath", err)
		}
	case <-time.After(10 * time.Second):
		// Unblock the open so that the goroutine ends.
		if fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_NONBLOCK, 0); err == nil {
			syscall.Close(fd)
		}
		t.Fatal("opening a FIFO blocked waiting for a writer")
	}
}
