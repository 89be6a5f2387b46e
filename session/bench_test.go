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
