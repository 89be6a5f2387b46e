package nodeagent

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/hostbus"
	"github.com/execmesh/execmesh/protocol"
)

// TestAgentStreams: the agent serves its sessions' streams (the attach
// endpoint of its host), and its Close ends them, telling the gateway.
func TestAgentStreams(t *testing.T) {
	h := newHarness(t, nil)
	r := &hostbus.Remote{Conn: h.nc, Group: protocol.Subjects("execmesh").NodeGroup(h.a.ID()), Label: "node test-node"}
	start := func(command, id string, stdin bool) string {
		t.Helper()
		req := h.execRequest(map[string]any{"command": command}, "full", "off")
		req.Stream = &protocol.StreamSpec{ID: id, Stdin: stdin}
		reply, err := r.Exec(t.Context(), req)
		if err != nil || reply.Result.Status() != protocol.StatusRunning {
			t.Fatalf("exec %q: %+v, %v", command, reply.Result, err)
		}
		return reply.Result.SessionID()
	}
	sid := start("cat; printf err >&2", "s-cat", true)
	st, err := r.Attach(t.Context(), protocol.AttachRequest{SessionKey: "agent:main:main", StreamID: "s-cat"})
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Started(); got.SessionID != sid || !got.Writer {
		t.Fatalf("started %+v, want session %s", got, sid)
	}
	input := strings.Repeat("0123456789", 300_000)
	go func() {
		_ = st.Send(t.Context(), protocol.Frame{Kind: protocol.FrameStdin, Data: []byte(input)})
		_ = st.Send(t.Context(), protocol.Frame{Kind: protocol.FrameControl, Control: &protocol.Control{Type: protocol.ControlEOF}})
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var stdout, stderr []byte
	for {
		f, err := st.Recv(ctx)
		if err != nil {
			t.Fatalf("Recv after %d bytes: %v", len(stdout), err)
		}
		switch f.Kind {
		case protocol.FrameStdout:
			stdout = append(stdout, f.Data...)
			continue
		case protocol.FrameStderr:
			stderr = append(stderr, f.Data...)
			continue
		}
		if f.Control.Type != protocol.ControlExit || f.Control.ExitCode == nil || *f.Control.ExitCode != 0 {
			t.Fatalf("end %+v", f.Control)
		}
		break
	}
	if string(stdout) != input || string(stderr) != "err" {
		t.Fatalf("stdout %d bytes (equal %v), stderr %q", len(stdout), string(stdout) == input, stderr)
	}
	_ = st.Close()

	// The agent's Close ends the streams it serves, and says why.
	start("echo up; sleep 60", "s-sleep", false)
	st, err = r.Attach(t.Context(), protocol.AttachRequest{SessionKey: "agent:main:main", StreamID: "s-sleep"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if f, err := st.Recv(ctx); err != nil || string(f.Data) != "up\n" {
		t.Fatalf("Recv: %+v, %v", f, err)
	}
	closed := make(chan error, 1)
	go func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer ccancel()
		closed <- h.a.Close(cctx)
	}()
	if _, err := st.Recv(ctx); !errors.Is(err, hostbus.ErrStreamLost) || !strings.Contains(err.Error(), "shutting down") {
		t.Fatalf("Recv during the agent's Close: %v", err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}
