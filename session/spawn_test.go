package session

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// TestDedupEnv: the environment a pipe session is spawned with follows
// os/exec's rules: the last of duplicate variables wins, order is kept,
// entries without "=" stay, empty ones go, a NUL byte is refused.
func TestDedupEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, want []string
		err      bool
	}{
		{in: []string{"A=1", "B=2", "A=3"}, want: []string{"B=2", "A=3"}},
		{in: []string{"A=1", "junk", "", "=X=1", "=X=2"}, want: []string{"A=1", "junk", "=X=2"}},
		{in: []string{"A=1", "B=x\x00y"}, want: []string{"A=1"}, err: true},
	} {
		got, err := dedupEnv(tc.in)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("dedupEnv(%q) = %q, %v; want %q (error %v)", tc.in, got, err, tc.want, tc.err)
		}
	}
	m := newManager(t, nil)
	res := mustExec(t, m, ExecRequest{Command: "echo $A", Env: []string{"A=1", "PATH=/usr/bin:/bin", "A=2"}})
	if strings.TrimSpace(res.Text()) != "2" {
		t.Errorf("duplicate variable: %q, want 2", res.Text())
	}
	res, err := m.Exec(context.Background(), ExecRequest{Command: "true", Env: []string{"A=x\x00y"}})
	if err != nil || res.Status() != "failed" || !strings.Contains(res.Text(), "environment variable contains NUL") {
		t.Errorf("NUL in env: %v %s %q", err, res.Status(), res.Text())
	}
}

// TestPipeSessionStdin: a pipe session's stdin is /dev/null (one
// descriptor the Manager opened once), at end of file for every command.
func TestPipeSessionStdin(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	for range 3 {
		res := mustExec(t, m, ExecRequest{Command: "cat; readlink /proc/self/fd/0; echo done"})
		if got := strings.TrimSpace(res.Text()); got != "/dev/null\ndone" {
			t.Errorf("stdin: %q", got)
		}
	}
}

// TestBootTicksIsProcStart: a fork bracketed by two equal bootTicks
// started in that tick, as /proc/<pid>/stat shows it, and a session's
// leader start time is /proc's whichever way it was found.
func TestBootTicksIsProcStart(t *testing.T) {
	bracketed := 0
	for range 100 {
		t0 := bootTicks()
		pid, err := syscall.ForkExec("/bin/sh", []string{"/bin/sh", "-c", "exit 0"}, &syscall.ProcAttr{})
		t1 := bootTicks()
		if err != nil {
			t.Fatal(err)
		}
		var buf [512]byte
		p, ok := readProcStat(pid, buf[:])
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, 0, nil)
		if !ok {
			t.Fatalf("no /proc/%d/stat before the wait", pid)
		}
		if p.start < t0 || p.start > t1 {
			t.Fatalf("pid %d started at tick %d, outside its fork's bracket [%d, %d]", pid, p.start, t0, t1)
		}
		if t0 == t1 {
			bracketed++
		}
	}
	if bracketed < 50 {
		t.Fatalf("only %d of 100 forks fell within one tick", bracketed)
	}

	m := newManager(t, nil)
	for range 20 {
		res, err := m.Exec(t.Context(), ExecRequest{Command: "sleep 5", Background: true})
		if err != nil {
			t.Fatal(err)
		}
		s := m.lookup("", res.SessionID())
		var buf [512]byte
		p, ok := readProcStat(s.pid, buf[:])
		if !ok || p.start != s.leaderStart {
			t.Fatalf("session %s: leader start %d, /proc says %d (%v)", s.id, s.leaderStart, p.start, ok)
		}
		m.Process(t.Context(), "", protocol.ProcessArgs{Action: "kill", SessionID: s.id})
	}
}

// TestFloodReadInBatches: a command flooding its stdout is read in
// batches far larger than its writes (8 KiB at a time, which a reader
// keeping up would see one by one), and what is retained is the same:
// the newest output, ending with the last line. NUL bytes, which the
// sanitizer rewrites into the retained window's worth, get the wide
// batch; text, which passes through, keeps the smaller one. With the
// Manager's flood buffers taken, a flood is read in ordinary reads, or
// in batches that do not widen, with the same output. Either way the
// budget is as it was once the session ended.
func TestFloodReadInBatches(t *testing.T) {
	const nul, text = "head -c %d /dev/zero; echo END", "yes 'the quick brown fox' | head -c %d; echo END"
	for _, tc := range []struct {
		name    string
		command string
		held    int64 // flood buffer bytes held elsewhere
		size    int
		batched string // "yes", "no", or "" when the reader's speed decides (text under the race detector)
		wide    bool   // a piece larger than floodReadBuffer
		tail    string
	}{
		{"NUL bytes", nul, 0, 256 << 20, "yes", true, `\x00\x00END`},
		{"text", text, 0, 64 << 20, "", false, "fox\nthe END"},
		{"budget taken", nul, floodBuffersMax - floodReadBuffer + 1, 32 << 20, "no", false, `\x00\x00END`},
		{"budget for a narrow batch", nul, floodBuffersMax - floodReadBuffer, 64 << 20, "yes", false, `\x00\x00END`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pieces, bytes, largest atomic.Int64
			m := newManager(t, func(c *Config) {
				c.OnOutput = func(n int) {
					pieces.Add(1)
					bytes.Add(int64(n))
					for m := largest.Load(); int64(n) > m && !largest.CompareAndSwap(m, int64(n)); m = largest.Load() {
					}
				}
			})
			m.batchBytes.Store(tc.held)
			res, err := m.Exec(t.Context(), ExecRequest{Command: fmt.Sprintf(tc.command, tc.size), Synchronous: true})
			if err != nil || res.Status() != protocol.StatusCompleted {
				t.Fatalf("%v %s", err, res.Status())
			}
			if bytes.Load() != int64(tc.size)+4 {
				t.Fatalf("read %d bytes, want %d", bytes.Load(), tc.size+4)
			}
			// A piece larger than one read can be is a batch. (How many
			// batches there are depends on the writer keeping up: one
			// that pauses for floodBatchWait, as under load, ends the
			// flood until the next window. Under the race detector the
			// reader may never take floodBytes within floodWindow: there
			// only the budget's refusal is certain, and TestConsumeWindowed
			// and TestReadBufferFloodBudget cover the widening.)
			batched := largest.Load() > readBufferSize
			if tc.batched == "no" && batched || tc.batched == "yes" && !batched && !raceEnabled {
				t.Fatalf("%d pieces, the largest %d bytes: batched %v, want %q",
					pieces.Load(), largest.Load(), batched, tc.batched)
			}
			if wide := largest.Load() > floodReadBuffer; wide && !tc.wide || !wide && tc.wide && !raceEnabled {
				t.Fatalf("largest piece %d bytes: wide %v, want %v", largest.Load(), wide, tc.wide)
			}
			out := res.Text()
			if !strings.HasSuffix(strings.TrimSpace(out), tc.tail) {
				t.Fatalf("retained output ends %q, want %q", out[max(0, len(out)-40):], tc.tail)
			}
			if got := m.batchBytes.Load(); got != tc.held {
				t.Fatalf("flood buffers held after the session: %d bytes, want %d", got, tc.held)
			}
		})
	}
}

// TestConsumeWindowed: a piece the sanitizer cuts to the retained window
// (NUL bytes beyond what the window holds) asks for the wide batch; text
// passing through and a piece written whole, even one that shrinks to a
// third (colours stripped), do not.
func TestConsumeWindowed(t *testing.T) {
	m := newManager(t, nil)
	for _, tc := range []struct {
		name  string
		piece []byte
		want  bool
	}{
		{"NUL bytes beyond the window", make([]byte, floodReadBuffer), true},
		{"NUL bytes within the window", make([]byte, 1<<10), false},
		{"text", bytes.Repeat([]byte("the quick brown fox\n"), floodReadBuffer/20), false},
		{"colours stripped", bytes.Repeat([]byte("\x1b[31mred\x1b[0m\n"), floodReadBuffer/13), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &session{m: m, out: newOutputBuffer(m.cfg.MaxOutputChars, m.cfg.PendingMaxOutputChars)}
			w := newStreamWriter(s, streamStdout)
			if got := w.consume(tc.piece); got != tc.want {
				t.Fatalf("consume of %d bytes: windowed %v, want %v", len(tc.piece), got, tc.want)
			}
		})
	}
}

// testPipe returns the read end of a pipe, for readBuffer's F_SETPIPE_SZ;
// both ends are closed when the test ends.
func testPipe(t *testing.T) *os.File {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r
}

// TestReadBufferSizes: the read buffer grows while reads fill it, turns
// to batching once floodBytes arrived within floodWindow however small
// the reads (a reader keeping up sees a writer's 8 KiB at a time), not
// when the same bytes trickle in more slowly, and gives the flood's
// buffer back when a batch comes back nearly empty.
func TestReadBufferSizes(t *testing.T) {
	r := testPipe(t)
	now := time.Unix(1_000_000, 0)
	rb := readBuffer{pipe: r}
	read := func(n int, after time.Duration) {
		t.Helper()
		now = now.Add(after)
		n = min(n, len(rb.next()))
		rb.fill = n
		if p := rb.take(now); len(p) != n {
			t.Fatalf("took %d bytes of %d", len(p), n)
		}
	}
	for len(rb.next()) < readBufferSize {
		read(len(rb.next()), time.Millisecond)
	}
	if rb.flood || len(rb.buf) != readBufferSize {
		t.Fatalf("after growth: flood %v, buffer %d", rb.flood, len(rb.buf))
	}
	// 8 KiB every 11 ms: far more than floodBytes in all, never within
	// one window.
	for range 2 * floodBytes / (8 << 10) {
		read(8<<10, floodWindow+time.Millisecond)
	}
	if rb.flood || len(rb.buf) != readBufferSize {
		t.Fatalf("after a trickle: flood %v, buffer %d", rb.flood, len(rb.buf))
	}
	// 8 KiB every 10 µs: a flood in small reads.
	for i := 0; i < floodBytes/(8<<10) && !rb.flood; i++ {
		read(8<<10, 10*time.Microsecond)
	}
	if !rb.flood || len(rb.buf) != floodReadBuffer || !rb.batching() {
		t.Fatalf("after %d KiB within %v: flood %v, buffer %d, batching %v",
			floodBytes>>10, floodWindow, rb.flood, len(rb.buf), rb.batching())
	}
	rb.fill = floodReadBuffer - readBufferSize + 1
	if rb.batching() {
		t.Fatal("batching with less than a pipe's worth of room")
	}
	rb.take(now)
	rb.fill = 100
	rb.take(now)
	if rb.flood || len(rb.buf) != readBufferSize {
		t.Fatalf("after a nearly empty batch: flood %v, buffer %d", rb.flood, len(rb.buf))
	}
	// The window starts afresh: the bytes of the flood do not count.
	read(8<<10, time.Microsecond)
	if rb.flood {
		t.Fatal("a flood again after one read")
	}
}

// TestReadBufferFloodBudget: a flood takes its buffer from the Manager's
// budget and gives it back when it ends, once; a flood that does not fit
// goes on in ordinary reads and tries again in the next window.
func TestReadBufferFloodBudget(t *testing.T) {
	r := testPipe(t)
	var held atomic.Int64
	now := time.Unix(1_000_000, 0)
	flood := func(rb *readBuffer) {
		t.Helper()
		for i := 0; i < floodBytes/readBufferSize+1 && !rb.flood; i++ {
			now = now.Add(10 * time.Microsecond)
			rb.fill = len(rb.next())
			rb.take(now)
		}
	}
	var floods []*readBuffer
	for range floodBuffersMax / floodReadBuffer {
		rb := &readBuffer{pipe: r, held: &held, buf: make([]byte, readBufferSize)}
		flood(rb)
		if !rb.flood {
			t.Fatalf("flood %d not batched with %d bytes held", len(floods)+1, held.Load())
		}
		floods = append(floods, rb)
	}
	if held.Load() != floodBuffersMax {
		t.Fatalf("held %d, want %d", held.Load(), floodBuffersMax)
	}
	over := &readBuffer{pipe: r, held: &held, buf: make([]byte, readBufferSize)}
	flood(over)
	if over.flood || len(over.buf) != readBufferSize || held.Load() != floodBuffersMax {
		t.Fatalf("over the budget: flood %v, buffer %d, held %d", over.flood, len(over.buf), held.Load())
	}
	// One flood ends (a nearly empty batch); its share goes back once.
	floods[0].fill = 1
	floods[0].take(now)
	floods[0].endFlood()
	if floods[0].flood || held.Load() != floodBuffersMax-floodReadBuffer {
		t.Fatalf("after a flood ended: flood %v, held %d", floods[0].flood, held.Load())
	}
	flood(over)
	if !over.flood || held.Load() != floodBuffersMax {
		t.Fatalf("in the next window: flood %v, held %d", over.flood, held.Load())
	}
	// Widening needs room for the difference; a flood that widened gives
	// the whole wide buffer back.
	over.widen()
	if len(over.buf) != floodReadBuffer || held.Load() != floodBuffersMax {
		t.Fatalf("widened without room: buffer %d, held %d", len(over.buf), held.Load())
	}
	for _, rb := range floods[1:4] {
		rb.endFlood()
	}
	over.widen()
	if len(over.buf) != floodWideBuffer || held.Load() != floodBuffersMax-4*floodReadBuffer+floodWideBuffer {
		t.Fatalf("widened: buffer %d, held %d", len(over.buf), held.Load())
	}
	over.widen()
	if len(over.buf) != floodWideBuffer || held.Load() != floodBuffersMax-4*floodReadBuffer+floodWideBuffer {
		t.Fatalf("widened twice: buffer %d, held %d", len(over.buf), held.Load())
	}
	for _, rb := range append(floods, over) {
		rb.endFlood() // as ReadFrom does when the pipe ends
	}
	if held.Load() != 0 {
		t.Fatalf("held %d after every reader ended", held.Load())
	}
}

// TestWorkdirCache: a cached working directory is the one its path names
// now: a symlink retargeted resolves to its new target, a directory gone
// or turned into a file is refused, and one created again resolves.
func TestWorkdirCache(t *testing.T) {
	root, _ := filepath.EvalSymlinks(t.TempDir())
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	link := filepath.Join(root, "link")
	for _, d := range []string{a, b} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(a, link); err != nil {
		t.Fatal(err)
	}
	var c workdirCache
	check := func(step, path, want string, wantOK bool) {
		t.Helper()
		got, ok := c.resolve(path)
		if ok != wantOK || (ok && got != want) {
			t.Fatalf("%s: resolve(%q) = %q, %v; want %q, %v", step, path, got, ok, want, wantOK)
		}
	}
	check("first", link, a, true)
	check("cached", link, a, true)
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(b, link); err != nil {
		t.Fatal(err)
	}
	check("retargeted", link, b, true)
	if err := os.Remove(b); err != nil {
		t.Fatal(err)
	}
	check("gone", link, "", false)
	if err := os.WriteFile(b, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	check("a file now", link, "", false)
	if err := os.Remove(b); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(b, 0o755); err != nil {
		t.Fatal(err)
	}
	check("made again", link, b, true)
	check("empty is the daemon's", "  ", "", false)
}
