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

// isTerminal reports whether w is a terminal, where live output and a
// spinner make sense.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// follow tails a background session until it exits, printing its output
// as it arrives, and returns the final poll result. Interrupted, it says
// how to pick the session up again: the command keeps running.
func (c *cli) follow(ctx context.Context, cl *client, sessionKey, sessionID string) (protocol.Result, error) {
	poll := func(ctx context.Context, timeoutMs int) (protocol.Result, error) {
		_, ans, err := cl.invokeTool(ctx, protocol.ToolProcess, protocol.ProcessArgs{Action: "poll", SessionID: sessionID, Timeout: &timeoutMs}, sessionKey)
		return ans.Result, err
	}
	res, err := ui.FollowSession(ctx, poll, c.stdout, isTerminal(c.stdout))
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		fmt.Fprintf(c.stderr, "\nexecmesh: session %s keeps running; follow it with: execmesh process poll %s --follow\n", sessionID, sessionID)
		return res, &exitError{code: exitFail}
	}
	return res, err
}
