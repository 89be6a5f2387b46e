package host

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// TestApprovalBindingNeverBlocks: a command that needs approval and names
// as its script a FIFO (with no writer), a device or a symbolic link
// loop is denied at once with an error that says what is there, instead
// of holding the request (and the daemon's goroutine) on an open that
// never returns. The FIFO case blocked forever before.
func TestApprovalBindingNeverBlocks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		command string
		make    func(t *testing.T, dir string)
		want    string
	}{
		{"fifo script", "sh ./script.sh", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "script.sh")
			if err := syscall.Mkfifo(p, 0o755); err != nil {
				t.Fatal(err)
			}
			// A failed run leaves its reader blocked: let it go.
			t.Cleanup(func() {
				if f, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					f.Close()
				}
			})
		}, "script.sh is a FIFO"},
		{"fifo program", "./tool --flag", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "tool")
			if err := syscall.Mkfifo(p, 0o755); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if f, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					f.Close()
				}
			})
		}, "tool is a FIFO"},
		{"device script", "sh ./zero.sh", func(t *testing.T, dir string) {
			if err := os.Symlink("/dev/zero", filepath.Join(dir, "zero.sh")); err != nil {
				t.Fatal(err)
			}
		}, "zero.sh is a character device"},
		{"symlink loop", "sh ./loop.sh", func(t *testing.T, dir string) {
			if err := os.Symlink("loop.sh", filepath.Join(dir, "loop.sh")); err != nil {
				t.Fatal(err)
			}
		}, "too many levels of symbolic links"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newApprovalHost(t, KindGateway)
			tc.make(t, h.cfg.Cwd)
			req := execReq(h.Local, tc.command)
			req.Security, req.Ask = "allowlist", "on-miss"
			done := make(chan error, 1)
			go func() {
				_, err := h.Exec(t.Context(), req)
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("exec blocked: no answer within 10 s")
			}
			if errType(err) != protocol.ErrDenied || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "cannot be bound to an approval") {
				t.Fatalf("exec: %v (%s), want a denial saying %q", err, errType(err), tc.want)
			}
			if _, ok := AsApprovalNeeded(err); ok || errors.Is(err, os.ErrNotExist) {
				t.Fatalf("exec asked for an approval: %v", err)
			}
		})
	}
}
