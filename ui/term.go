package ui

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// followPollMs is the poll wait FollowSession asks for: long enough that a
// quiet command costs one request per 5 s, short enough that ctx
// cancellation and the status line stay responsive.
const followPollMs = 5000

// spinnerInterval is the redraw rate of a terminal status line.
const spinnerInterval = 100 * time.Millisecond

var spinnerFrames = []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}

// FollowOptions shape what FollowSession writes.
type FollowOptions struct {
	// TTY keeps a status line with a spinner, the elapsed time and the
	// session name below the output (w is a terminal), erased at the end.
	TTY bool
	// ExitLine ends the output with the final poll's last lines
	// ("Process exited with code 0."); without it only the session's own
	// output is written (ended with a newline if it lacks one), and the
	// caller reports the end.
	ExitLine bool
	// OnCut, when set, is called each time the written output misses a
	// part: the session's retention cap dropped it before a poll could
	// take it. The output then goes on without the inline marker that
	// says so otherwise, so that w receives only the session's own text
	// and the caller reports the cut (execmesh exec does, on stderr).
	OnCut func()
}

// FollowSession tails a background session until it exits: it calls poll
// (a process poll of the session with the given wait in milliseconds) in a
// loop and writes the session's output to w as it arrives, then, with
// opts.ExitLine, the exit line ("Process exited with code 0."). It returns
// the final poll result, whose details.status is completed or failed; a
// poll that answers anything but running (an unknown session) ends the
// loop too, and its text is written as is.
//
// Output is taken from details.aggregated (the session's retained output),
// printing what was added since the previous poll, so it is exact to the
// byte; a gateway that does not send it gets the poll texts instead.
func FollowSession(ctx context.Context, poll func(ctx context.Context, timeoutMs int) (protocol.Result, error), w io.Writer, opts FollowOptions) (protocol.Result, error) {
	f := &follower{w: w, exitLine: opts.ExitLine, onCut: opts.OnCut}
	if opts.TTY {
		f.line = newStatusLine(w, "following")
		defer f.line.stop()
	}
	for {
		res, err := poll(ctx, followPollMs)
		if err != nil {
			return res, err
		}
		if res.Status() != protocol.StatusRunning {
			f.finish(res)
			return res, nil
		}
		f.output(res)
		if f.line != nil {
			f.line.setLabel(runningLabel(res))
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
	}
}

// runningLabel describes a running session for the status line.
func runningLabel(res protocol.Result) string {
	label := "running"
	if name := res.Details.Name.Value(); name != "" {
		label += " · " + name
	}
	if id := res.SessionID(); id != "" {
		label += " (" + id + ")"
	}
	if res.Details.WaitingForInput.Value() {
		label += " · waiting for input"
	}
	return label
}

// follower turns successive poll results into one output stream.
type follower struct {
	w    io.Writer
	line *statusLine // nil without a terminal
	// seen is the last details.aggregated printed from.
	seen     string
	lastNL   bool
	written  bool
	exitLine bool
	onCut    func()
}

func (f *follower) write(s string) {
	if s == "" {
		return
	}
	if f.line != nil {
		f.line.write(s)
	} else {
		io.WriteString(f.w, s)
	}
	f.written = true
	f.lastNL = strings.HasSuffix(s, "\n")
}

// output writes what the poll added to the session's output.
func (f *follower) output(res protocol.Result) {
	if agg, ok := res.Details.Aggregated.Get(); ok {
		f.write(f.delta(agg))
		return
	}
	if out := pollOutput(res.Text()); out != "" {
		f.write(out + "\n")
	}
}

// delta returns the part of agg not printed yet. The retained output is
// capped and drops its oldest part, so when agg no longer extends what was
// printed, agg starts with a suffix of it: the longest such overlap is
// found through the last 256 printed characters and skipped.
func (f *follower) delta(agg string) string {
	prev := f.seen
	f.seen = agg
	if strings.HasPrefix(agg, prev) {
		return agg[len(prev):]
	}
	anchor := prev[max(0, len(prev)-256):]
	overlap := -1
	for i := 0; ; {
		j := strings.Index(agg[i:], anchor)
		if j < 0 {
			break
		}
		end := i + j + len(anchor)
		if strings.HasSuffix(prev, agg[:end]) {
			overlap = end
		}
		i += j + 1
	}
	if overlap >= 0 {
		return agg[overlap:]
	}
	if f.onCut != nil {
		f.onCut()
		return agg
	}
	return "\n[… output dropped at the retention cap …]\n" + agg
}

// finish writes the rest of the output and, with exitLine, the final
// lines of the result.
func (f *follower) finish(res protocol.Result) {
	text := res.Text()
	agg, ok := res.Details.Aggregated.Get()
	if ok {
		f.write(f.delta(agg))
	}
	if !f.exitLine {
		if f.written && !f.lastNL {
			f.write("\n")
		}
		return
	}
	if ok {
		// The text is [notes] output "\n\nProcess exited with …"
		// [guidance]; the output is printed already.
		if i := strings.LastIndex(text, "\n\nProcess "); i >= 0 {
			text = text[i+2:]
		}
	}
	if f.written && !f.lastNL {
		f.write("\n")
	}
	f.write(text + "\n")
}

// pollOutput extracts the new output from a running poll's text, for a
// gateway that does not send details.aggregated.
func pollOutput(text string) string {
	for _, suffix := range []string{"\n\nProcess still running.", "\n\nNo new output for "} {
		if i := strings.LastIndex(text, suffix); i >= 0 {
			text = text[:i]
			break
		}
	}
	if text == "(no new output)" {
		return ""
	}
	return text
}

// Spinner shows a spinner, label and the elapsed time on the terminal w
// until stop is called or ctx ends, then erases the line. stop waits for
// the drawing goroutine and may be called more than once. Use it only when
// w is a terminal: it redraws one line with \r and an erase sequence.
func Spinner(ctx context.Context, w io.Writer, label string) (stop func()) {
	l := newStatusLine(w, label)
	stopCtx := context.AfterFunc(ctx, l.stop)
	return func() {
		stopCtx()
		l.stop()
	}
}

// statusLine is a redrawn last line of a terminal with output written
// above it. A goroutine redraws it until stop.
type statusLine struct {
	w     io.Writer
	start time.Time

	mu    sync.Mutex
	label string
	frame int
	shown bool
	// partial is set while the output above ends inside a line: the
	// status line waits for the rest, so the output stays exact.
	partial bool

	quit chan struct{}
	done chan struct{}
	once sync.Once
}

func newStatusLine(w io.Writer, label string) *statusLine {
	l := &statusLine{w: w, start: time.Now(), label: label, quit: make(chan struct{}), done: make(chan struct{})}
	l.draw()
	go l.run()
	return l
}

func (l *statusLine) run() {
	defer close(l.done)
	t := time.NewTicker(spinnerInterval)
	defer t.Stop()
	for {
		select {
		case <-l.quit:
			return
		case <-t.C:
			l.draw()
		}
	}
}

func (l *statusLine) setLabel(s string) {
	l.mu.Lock()
	l.label = s
	l.mu.Unlock()
	l.draw()
}

func (l *statusLine) draw() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.partial {
		return
	}
	l.frame = (l.frame + 1) % len(spinnerFrames)
	fmt.Fprintf(l.w, "\r\x1b[K%s %s %s", spinnerFrames[l.frame], l.label, elapsed(time.Since(l.start)))
	l.shown = true
}

// write prints s above the status line.
func (l *statusLine) write(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.shown {
		io.WriteString(l.w, "\r\x1b[K")
		l.shown = false
	}
	io.WriteString(l.w, s)
	l.partial = !strings.HasSuffix(s, "\n")
}

// stop ends the redraws and erases the line.
func (l *statusLine) stop() {
	l.once.Do(func() {
		close(l.quit)
		<-l.done
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.shown {
			io.WriteString(l.w, "\r\x1b[K")
			l.shown = false
		}
		l.partial = true // no drawing after stop
	})
}

// elapsed formats a duration for the status line: 4.2s, 1m05s, 2h03m.
func elapsed(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	default:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
}
