package ratelog

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// lines is a log handler's output, safe for the limiter's timers.
type lines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lines) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lines) take() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := strings.TrimSpace(b.buf.String())
	b.buf.Reset()
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func newLimiter(every time.Duration) (*Limiter, *lines) {
	out := &lines{}
	h := slog.NewTextHandler(out, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})
	return New(slog.New(h), every), out
}

// TestLimiter: per message and key, the first occurrence is logged at
// once, the rest of the interval is one line with their count (and the
// attributes of the latest), a lasting condition is one line per
// interval, other keys are not held back, a key that went quiet is
// forgotten, and Stop logs what is counted.
func TestLimiter(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(l *Limiter)
		want []string
	}{
		{"one occurrence, one line", func(l *Limiter) {
			l.Warn("a", "dropped", "dropped", "kind", "x")
			time.Sleep(25 * time.Second)
		}, []string{`level=WARN msg=dropped kind=x dropped=1`}},
		{"a burst is two lines", func(l *Limiter) {
			for i := range 1000 {
				l.Warn("a", "dropped", "dropped", "i", i)
			}
			time.Sleep(25 * time.Second)
		}, []string{`level=WARN msg=dropped i=0 dropped=1`, `level=WARN msg=dropped i=999 dropped=999`}},
		{"a lasting condition is a line per interval", func(l *Limiter) {
			for i := range 300 { // 30 s, ten a second, off the interval ends
				if i > 0 {
					time.Sleep(100 * time.Millisecond)
				}
				l.Warn("a", "dropped", "dropped")
				if i == 0 {
					time.Sleep(50 * time.Millisecond)
				}
			}
			time.Sleep(25 * time.Second)
		}, []string{`level=WARN msg=dropped dropped=1`, `level=WARN msg=dropped dropped=99`,
			`level=WARN msg=dropped dropped=100`, `level=WARN msg=dropped dropped=100`}},
		{"keys and messages apart", func(l *Limiter) {
			for range 3 {
				l.Warn("a", "dropped", "dropped")
				l.Warn("b", "dropped", "dropped")
				l.Warn("a", "retried", "attempts")
			}
			time.Sleep(15 * time.Second)
		}, []string{`level=WARN msg=dropped dropped=1`, `level=WARN msg=dropped dropped=1`, `level=WARN msg=retried attempts=1`,
			`level=WARN msg=dropped dropped=2`, `level=WARN msg=dropped dropped=2`, `level=WARN msg=retried attempts=2`}},
		{"quiet key forgotten", func(l *Limiter) {
			l.Warn("a", "dropped", "dropped")
			time.Sleep(11 * time.Second)
			l.Warn("a", "dropped", "dropped") // counted: the next interval had started
			time.Sleep(10 * time.Second)
			time.Sleep(11 * time.Second) // nothing in that interval: forgotten
			l.Warn("a", "dropped", "dropped")
			l.mu.Lock()
			n := len(l.entries)
			l.mu.Unlock()
			if n != 1 {
				panic("entries not forgotten")
			}
			time.Sleep(25 * time.Second)
			l.mu.Lock()
			n = len(l.entries)
			l.mu.Unlock()
			if n != 0 {
				panic("entries left")
			}
		}, []string{`level=WARN msg=dropped dropped=1`, `level=WARN msg=dropped dropped=1`, `level=WARN msg=dropped dropped=1`}},
		{"Stop logs the count", func(l *Limiter) {
			l.Warn("a", "dropped", "dropped")
			l.Warn("a", "dropped", "dropped")
			l.Warn("a", "dropped", "dropped")
			l.Stop()
			l.Warn("a", "dropped", "dropped")
		}, []string{`level=WARN msg=dropped dropped=1`, `level=WARN msg=dropped dropped=2`, `level=WARN msg=dropped dropped=1`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, out := newLimiter(10 * time.Second)
				tc.run(l)
				l.Stop()
				synctest.Wait()
				// Timers due at one instant fire in any order.
				got := out.take()
				slices.Sort(got)
				slices.Sort(tc.want)
				if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
					t.Errorf("lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
				}
			})
		})
	}
}
