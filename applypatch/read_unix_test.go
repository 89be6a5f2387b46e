//go:build unix

package applypatch

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReadNeverBlocksOnSwap: a file swapped for a FIFO between the Lstat
// that saw a regular file and the read is refused at once ("was replaced
// while being read"); the open used to wait for a writer that never came.
func TestReadNeverBlocksOnSwap(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "a.txt")
	if err := os.WriteFile(p, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := newApplier(t.Context(), dir, DefaultMaxFileBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.root.Close()
	fi, err := a.root.Lstat("a.txt")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // a failed run leaves its reader blocked: let it go
		if f, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	done := make(chan error, 1)
	go func() {
		_, err := a.read("a.txt", "a.txt", fi)
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("read blocked on a FIFO put in the file's place")
	}
	if err == nil || !strings.Contains(err.Error(), "was replaced while being read") {
		t.Fatalf("read: %v, want a refusal saying the file was replaced", err)
	}
}
