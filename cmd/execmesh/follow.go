package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/ui"
)

// isTerminal reports whether w (a reader or a writer) is a terminal,
// where live output and a spinner make sense, or raw input.
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// pollFunc is one process poll of a session with the given wait.
type pollFunc func(ctx context.Context, timeoutMs int) (protocol.Result, error)

// follow tails a background session until it exits, printing its output
// as it arrives and, with exitLine, the final poll's last line ("Process
// exited with code 0."), and returns the final poll result.
func (c *cli) follow(ctx context.Context, cl *client, sessionKey, sessionID string, exitLine bool) (protocol.Result, error) {
	poll := func(ctx context.Context, timeoutMs int) (protocol.Result, error) {
		_, ans, err := cl.invokeTool(ctx, protocol.ToolProcess, protocol.ProcessArgs{Action: "poll", SessionID: sessionID, Timeout: &timeoutMs}, sessionKey)
		return ans.Result, err
	}
	return c.followPolls(ctx, poll, sessionID, ui.FollowOptions{TTY: isTerminal(c.stdout), ExitLine: exitLine}, c.stdout)
}

// followWith follows a session for exec: its output only, to w (the exit
// is reported by the caller), or nothing with quiet. onCut is called for
// each part of the output the retention cap dropped before a poll took it
// (no marker goes into the output).
func (c *cli) followWith(ctx context.Context, poll pollFunc, sessionID string, quiet bool, w io.Writer, onCut func()) (protocol.Result, error) {
	if quiet {
		w = io.Discard
	}
	return c.followPolls(ctx, poll, sessionID, ui.FollowOptions{TTY: !quiet && isTerminal(c.stdout), OnCut: onCut}, w)
}

// followPolls runs ui.FollowSession. Interrupted, it says how to pick the
// session up again: the command keeps running.
func (c *cli) followPolls(ctx context.Context, poll pollFunc, sessionID string, opts ui.FollowOptions, w io.Writer) (protocol.Result, error) {
	res, err := ui.FollowSession(ctx, poll, w, opts)
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		fmt.Fprintf(c.stderr, "\nexecmesh: session %s keeps running; follow it with: execmesh process poll %s --follow\n", sessionID, sessionID)
		return res, &exitError{code: exitFail}
	}
	return res, err
}
