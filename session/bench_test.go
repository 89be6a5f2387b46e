package session

import (
	"context"
	"testing"
)

// BenchmarkExecOutput measures the whole output path (pipe, sanitizer,
// buffers) with a command writing 100 MB of text.
func BenchmarkExecOutput(b *testing.B) {
	cfg := testConfig()
	m, err := NewManager(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close(context.Background())
	const size = 100 << 20
	b.SetBytes(size)
	for b.Loop() {
		res, err := m.Exec(context.Background(), ExecRequest{
			Command:     "yes 'the quick brown fox jumps over the lazy dog' | head -c 104857600",
			Synchronous: true,
		})
		if err != nil || res.Status() != "completed" {
			b.Fatalf("%v %s", err, res.Text())
		}
	}
}

// BenchmarkExecContainment measures one short foreground exec (`echo hi`
// under /bin/sh) in each containment, with and without a state dir: the
// cost of the session's cgroup (mkdir, clone3 into it, rmdir) and of its
// record.
func BenchmarkExecContainment(b *testing.B) {
	for _, mode := range []string{ContainmentCgroup, ContainmentProcessGroup} {
		for _, state := range []bool{false, true} {
			name := mode
			if state {
				name += "+statedir"
			}
			b.Run(name, func(b *testing.B) {
				cfg := testConfig()
				cfg.Shell = "/bin/sh"
				cfg.Containment = mode
				if state {
					cfg.StateDir = b.TempDir()
				}
				m, err := NewManager(cfg)
				if err != nil {
					b.Skipf("containment %s: %v", mode, err)
				}
				defer m.Close(context.Background())
				for b.Loop() {
					if _, err := m.Exec(context.Background(), ExecRequest{Command: "echo hi"}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
