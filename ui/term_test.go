package ui

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/internal/testutil"
	"github.com/execmesh/execmesh/protocol"
)

// polls returns a poll function answering the given results in order.
func polls(t *testing.T, results ...protocol.Result) func(context.Context, int) (protocol.Result, error) {
	return func(ctx context.Context, timeoutMs int) (protocol.Result, error) {
		if timeoutMs != followPollMs {
			t.Errorf("poll timeout %d, want %d", timeoutMs, followPollMs)
		}
		if len(results) == 0 {
			return protocol.Result{}, errors.New("polled after the end")
		}
		r := results[0]
		results = results[1:]
		return r, nil
	}
}

func running(text, agg string) protocol.Result {
	d := protocol.Details{Status: protocol.Some("running"), SessionID: protocol.Some("calm-reef"), Name: protocol.Some("make build")}
	if agg != "\x00" {
		d.Aggregated = protocol.Some(agg)
	}
	return protocol.TextResult(text, d)
}

func TestFollowSessionAggregated(t *testing.T) {
	t.Parallel()
	final := protocol.TextResult("done\n\nProcess exited with code 2.", protocol.Details{Status: protocol.Some("completed"), ExitCode: protocol.Some(2), Aggregated: protocol.Some("a\nbc\ndone\n")})
	var buf bytes.Buffer
	res, err := FollowSession(t.Context(), polls(t,
		running("a\n\nProcess still running.", "a\n"),
		running("b\n\nProcess still running.", "a\nb"),
		running("(no new output)\n\nProcess still running.", "a\nb"),
		running("c\n\nProcess still running.", "a\nbc\n"),
		final,
	), &buf, FollowOptions{ExitLine: true})
	if err != nil || res.Status() != "completed" {
		t.Fatalf("FollowSession: %v %v", res, err)
	}
	if want := "a\nbc\ndone\nProcess exited with code 2.\n"; buf.String() != want {
		t.Errorf("output %q, want %q", buf.String(), want)
	}
}

func TestFollowSessionWithoutAggregated(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	res, err := FollowSession(t.Context(), polls(t,
		running("line one\n\nProcess still running.", "\x00"),
		running("(no new output)\n\nNo new output for 15s; this session may be waiting for input. Use process write, send-keys, submit, or paste to provide input.", "\x00"),
		protocol.TextResult("line two\n\nProcess exited with code 0.", protocol.Details{Status: protocol.Some("completed")}),
	), &buf, FollowOptions{ExitLine: true})
	if err != nil || res.Status() != "completed" {
		t.Fatalf("FollowSession: %v %v", res, err)
	}
	if want := "line one\nline two\n\nProcess exited with code 0.\n"; buf.String() != want {
		t.Errorf("output %q, want %q", buf.String(), want)
	}
}

// TestFollowSessionOutputOnly: without ExitLine only the session's own
// output is written (a missing last newline added, no exit text):
// `execmesh exec` reports the end itself, on stderr and in its status.
func TestFollowSessionOutputOnly(t *testing.T) {
	t.Parallel()
	final := protocol.TextResult("x\n\nProcess exited with code 3.", protocol.Details{Status: protocol.Some("completed"), ExitCode: protocol.Some(3), Aggregated: protocol.Some("a\nno newline")})
	var buf bytes.Buffer
	res, err := FollowSession(t.Context(), polls(t, running("a\n\nProcess still running.", "a\n"), final), &buf, FollowOptions{})
	if err != nil || res.Status() != "completed" {
		t.Fatalf("FollowSession: %v %v", res, err)
	}
	if want := "a\nno newline\n"; buf.String() != want {
		t.Errorf("output %q, want %q", buf.String(), want)
	}
}

func TestFollowSessionCapSlide(t *testing.T) {
	t.Parallel()
	f := &follower{}
	first := strings.Repeat("0123456789", 40)
	if d := f.delta(first); d != first {
		t.Fatalf("first delta %q", d)
	}
	// The oldest part was dropped and new output added.
	if d := f.delta(first[123:] + "abc"); d != "abc" {
		t.Errorf("slid delta %q, want abc", d)
	}
	// Nothing in common: everything, with a note.
	if d := f.delta("xyz"); !strings.Contains(d, "retention cap") || !strings.HasSuffix(d, "xyz") {
		t.Errorf("disjoint delta %q", d)
	}
}

// TestFollowSessionOnCut: with OnCut, a gap is reported to the caller and
// the output carries no marker; a slide with an overlap is no gap.
func TestFollowSessionOnCut(t *testing.T) {
	t.Parallel()
	cuts := 0
	f := &follower{onCut: func() { cuts++ }}
	first := strings.Repeat("0123456789", 40)
	f.delta(first)
	if d := f.delta(first[123:] + "abc"); d != "abc" || cuts != 0 {
		t.Fatalf("slid delta %q, %d cuts", d, cuts)
	}
	if d := f.delta("xyz"); d != "xyz" || cuts != 1 {
		t.Errorf("disjoint delta %q, %d cuts, want xyz and 1", d, cuts)
	}
}

func TestFollowSessionUnknown(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	res, err := FollowSession(t.Context(), polls(t, protocol.FailedResult("No session found for nope")), &buf, FollowOptions{ExitLine: true})
	if err != nil || res.Status() != "failed" || buf.String() != "No session found for nope\n" {
		t.Errorf("%q %v %v", buf.String(), res, err)
	}
}

func TestFollowSessionPollError(t *testing.T) {
	t.Parallel()
	boom := errors.New("gateway gone")
	_, err := FollowSession(t.Context(), func(context.Context, int) (protocol.Result, error) {
		return protocol.Result{}, boom
	}, &bytes.Buffer{}, FollowOptions{TTY: true})
	if !errors.Is(err, boom) {
		t.Errorf("err %v", err)
	}
}

// screen returns what a terminal would show: each \r\x1b[K erases the
// current line.
func screen(s string) string {
	var lines []string
	cur := ""
	for i := 0; i < len(s); {
		switch {
		case strings.HasPrefix(s[i:], "\r\x1b[K"):
			cur = ""
			i += 4
		case s[i] == '\n':
			lines = append(lines, cur)
			cur = ""
			i++
		default:
			cur += s[i : i+1]
			i++
		}
	}
	return strings.Join(append(lines, cur), "\n")
}

func TestFollowSessionTTY(t *testing.T) {
	t.Parallel()
	var buf testutil.SyncBuffer
	step := make(chan struct{})
	results := []protocol.Result{
		running("part\n\nProcess still running.", "part"),
		running("ial line\n\nProcess still running.", "partial line\n"),
		protocol.TextResult("(no new output)\n\nProcess exited with code 0.", protocol.Details{Status: protocol.Some("completed"), Aggregated: protocol.Some("partial line\n")}),
	}
	poll := func(ctx context.Context, _ int) (protocol.Result, error) {
		<-step
		r := results[0]
		results = results[1:]
		return r, nil
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := FollowSession(t.Context(), poll, &buf, FollowOptions{TTY: true, ExitLine: true}); err != nil {
			t.Errorf("FollowSession: %v", err)
		}
	}()
	step <- struct{}{}
	step <- struct{}{}
	// The status line shows the running session.
	waitUntil(t, func() bool { return strings.Contains(buf.String(), "running · make build (calm-reef)") })
	step <- struct{}{}
	<-done
	if got, want := screen(buf.String()), "partial line\nProcess exited with code 0.\n"; got != want {
		t.Errorf("screen %q, want %q (raw %q)", got, want, buf.String())
	}
}

func TestSpinner(t *testing.T) {
	t.Parallel()
	var buf testutil.SyncBuffer
	stop := Spinner(t.Context(), &buf, "backgrounded")
	waitUntil(t, func() bool { return strings.Count(buf.String(), "backgrounded") >= 2 })
	stop()
	stop() // idempotent
	out := buf.String()
	if !regexp.MustCompile(`[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏] backgrounded \d+\.\ds`).MatchString(out) {
		t.Errorf("spinner output %q", out)
	}
	if screen(out) != "" {
		t.Errorf("line not erased: %q", screen(out))
	}
	n := len(out)
	time.Sleep(3 * spinnerInterval)
	if len(buf.String()) != n {
		t.Errorf("spinner drew after stop")
	}

	// Cancelling ctx stops it too.
	ctx, cancel := context.WithCancel(t.Context())
	var buf2 testutil.SyncBuffer
	stop2 := Spinner(ctx, &buf2, "x")
	cancel()
	waitUntil(t, func() bool { return strings.HasSuffix(buf2.String(), "\r\x1b[K") })
	stop2()
}

func TestElapsed(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		4200 * time.Millisecond:               "4.2s",
		65 * time.Second:                      "1m05s",
		2*time.Hour + 3*time.Minute:           "2h03m",
		59*time.Second + 940*time.Millisecond: "59.9s",
	} {
		if got := elapsed(d); got != want {
			t.Errorf("elapsed(%v) = %q, want %q", d, got, want)
		}
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
