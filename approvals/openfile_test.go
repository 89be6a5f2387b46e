//go:build unix

package approvals

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// withinSeconds runs f and fails the test if it does not return within
// 10 s: a regression that blocks on an open fails instead of hanging.
func withinSeconds[T any](t *testing.T, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("blocked: no answer within 10 s")
		panic("unreachable")
	}
}

// unblockFIFO opens path for writing at cleanup, so that a reader a
// failed test left blocked in open returns.
func unblockFIFO(t *testing.T, path string) {
	t.Cleanup(func() {
		if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
}

// TestHashFileNeverBlocks: what hashFile binds for each kind of file a
// request can put where a script or an executable is expected. A regular
// file is hashed; nothing, a directory or an unreadable file binds ""; a
// FIFO (no writer), a character device, a socket, a symbolic link loop and
// a file over maxBoundFileSize are errors naming what is there, at once.
func TestHashFileNeverBlocks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name) }
	if err := os.WriteFile(path("script.sh"), []byte("echo hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path("fifo.sh"), 0o644); err != nil {
		t.Fatal(err)
	}
	unblockFIFO(t, path("fifo.sh"))
	if err := os.Symlink("loop.sh", path("loop.sh")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", path("zero.sh")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path("dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", path("sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	big, err := os.Create(path("big.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if err := big.Truncate(maxBoundFileSize + 1); err != nil { // sparse: costs nothing
		t.Fatal(err)
	}
	big.Close()

	for _, tc := range []struct {
		name    string
		errText string // "" means no error
		hashed  bool
	}{
		{"script.sh", "", true},
		{"missing.sh", "", false},
		{"dir", "", false},
		{"fifo.sh", "fifo.sh is a FIFO", false},
		{"zero.sh", "zero.sh is a character device", false},
		{"sock", "sock is a socket", false},
		{"loop.sh", "too many levels of symbolic links", false},
		{"big.sh", "big.sh is larger than 1073741824 bytes", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			type res struct {
				sum string
				err error
			}
			r := withinSeconds(t, func() res { s, err := hashFile(path(tc.name)); return res{s, err} })
			switch {
			case tc.errText != "":
				if r.err == nil || !strings.Contains(r.err.Error(), tc.errText) {
					t.Fatalf("hashFile: %q %v, want an error containing %q", r.sum, r.err, tc.errText)
				}
			case r.err != nil || (r.sum != "") != tc.hashed:
				t.Fatalf("hashFile: %q %v, want hashed=%v", r.sum, r.err, tc.hashed)
			}
		})
	}

	// Verify counts a file that can no longer be hashed as changed, and
	// a FIFO put where nothing was (bound "") too.
	b := &Binding{Files: []BoundFile{{Path: path("fifo.sh"), SHA256: ""}}}
	if err := withinSeconds(t, b.Verify); !errors.Is(err, ErrBindingChanged) {
		t.Fatalf("Verify with a FIFO: %v, want a binding change", err)
	}
}
