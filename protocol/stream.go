package protocol

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// Streams and attach (DESIGN.md §3.7): a session's raw output, its input,
// window size and signals, as frames. The same frames travel on the
// gateway's WebSocket (GET /v1/sessions/<id>/attach, GET /v1/exec/attach)
// and, with a sequence number, between a gateway and a node over NATS.
//
// On a WebSocket, output and input are binary messages, one byte of kind
// then the bytes; everything else is a text message holding a Control.

// Kinds of a data frame: the first byte of a binary message.
const (
	FrameStdin  byte = 0 // client → session: input bytes
	FrameStdout byte = 1 // session → client: stdout (a PTY's output)
	FrameStderr byte = 2 // session → client: stderr
	// FrameControl is a Control as JSON; a WebSocket sends it as a text
	// message, NATS after the kind byte.
	FrameControl byte = 3
)

// Types of a Control.
const (
	// ControlStart (client, first message of GET /v1/exec/attach): start
	// Exec attached. Stdin gives a pipe session a stdin to write;
	// KeepOnDetach keeps the session running when the client goes away
	// (by default it is killed).
	ControlStart = "start"
	// ControlStarted (server, first message): the session the socket is
	// attached to, whether it runs on a PTY and whether this client holds
	// its input.
	ControlStarted = "started"
	// ControlResize (client): the terminal's size.
	ControlResize = "resize"
	// ControlSignal (client): send Signal (a name such as "SIGINT") to
	// the session's foreground process group.
	ControlSignal = "signal"
	// ControlEOF (client): end of input (a pipe's end of file, Ctrl-D on
	// a PTY).
	ControlEOF = "eof"
	// ControlExit (server, last message): how the session ended.
	ControlExit = "exit"
	// ControlResult (server, last message): the start did not leave a
	// running session (an approval is needed, policy refused it, the
	// spawn failed); Result is the exec tool's result.
	ControlResult = "result"
	// ControlError (server): a request of the client was refused (the
	// socket stays open), or, just before the close, why it ends.
	ControlError = "error"
	// ControlCredit (NATS only, receiver → sender): Credit more bytes of
	// output, or of input, may be sent.
	ControlCredit = "credit"
	// ControlPing (NATS only, both ways): the peer is alive.
	ControlPing = "ping"
)

// Control is a non-data frame. Fields beyond Type are set per type.
type Control struct {
	Type string `json:"type"`

	// start
	// Exec holds the exec tool's arguments (DecodeExecArgs decodes them).
	Exec         json.RawMessage `json:"exec,omitempty"`
	SessionKey   string          `json:"sessionKey,omitempty"`
	Stdin        bool            `json:"stdin,omitempty"`
	KeepOnDetach bool            `json:"keepOnDetach,omitempty"`

	// started
	SessionID string `json:"sessionId,omitempty"`
	PTY       bool   `json:"pty,omitempty"`
	Writer    bool   `json:"writer,omitempty"`

	// resize
	Cols int `json:"cols,omitempty"`
	Rows int `json:"rows,omitempty"`

	// signal; exit: the signal that ended the session
	Signal string `json:"signal,omitempty"`

	// exit
	Status   string `json:"status,omitempty"`
	ExitCode *int   `json:"exitCode,omitempty"`
	Reason   string `json:"reason,omitempty"`

	// result
	Result *Result `json:"result,omitempty"`

	// error
	Error string `json:"error,omitempty"`

	// credit
	Credit int64 `json:"credit,omitempty"`
}

// Frame is one frame of a stream: data of a kind, or a Control.
type Frame struct {
	Kind    byte
	Data    []byte
	Control *Control // Kind == FrameControl
}

// Stream limits.
const (
	// MaxFrameData bounds the bytes of one data frame; senders split
	// larger output.
	MaxFrameData = 256 << 10
	// MaxControlBytes bounds the JSON of one Control.
	MaxControlBytes = 64 << 10
)

// ErrBadFrame is wrapped by every decoding error of a frame.
var ErrBadFrame = errors.New("bad stream frame")

// ParseControl decodes a Control strictly: unknown types and fields are
// errors.
func ParseControl(b []byte) (*Control, error) {
	if len(b) > MaxControlBytes {
		return nil, fmt.Errorf("%w: control message of %d bytes exceeds %d", ErrBadFrame, len(b), MaxControlBytes)
	}
	var c Control
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&c); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadFrame, err)
	}
	if d.More() {
		return nil, fmt.Errorf("%w: data after the control message", ErrBadFrame)
	}
	switch c.Type {
	case ControlStart:
		if c.Exec == nil {
			return nil, fmt.Errorf("%w: start needs exec", ErrBadFrame)
		}
	case ControlResize:
		if c.Cols < 1 || c.Rows < 1 || c.Cols > 0xffff || c.Rows > 0xffff {
			return nil, fmt.Errorf("%w: resize needs cols and rows from 1 to 65535", ErrBadFrame)
		}
	case ControlSignal:
		if c.Signal == "" {
			return nil, fmt.Errorf("%w: signal needs a signal name", ErrBadFrame)
		}
	case ControlStarted, ControlEOF, ControlExit, ControlResult, ControlError, ControlCredit, ControlPing:
	case "":
		return nil, fmt.Errorf("%w: control message without a type", ErrBadFrame)
	default:
		return nil, fmt.Errorf("%w: unknown control type %q", ErrBadFrame, c.Type)
	}
	return &c, nil
}

// AppendSeqFrame appends the NATS form of f: kind, an 8-byte sequence
// number (big-endian) that lets the receiver see a lost message, then the
// data or the Control's JSON.
func AppendSeqFrame(b []byte, seq uint64, f Frame) ([]byte, error) {
	b = append(b, f.Kind)
	b = binary.BigEndian.AppendUint64(b, seq)
	if f.Kind == FrameControl {
		j, err := json.Marshal(f.Control)
		if err != nil {
			return nil, err
		}
		return append(b, j...), nil
	}
	return append(b, f.Data...), nil
}

// ParseSeqFrame decodes a frame of AppendSeqFrame. Data aliases b.
func ParseSeqFrame(b []byte) (Frame, uint64, error) {
	if len(b) < 9 {
		return Frame{}, 0, fmt.Errorf("%w: %d bytes", ErrBadFrame, len(b))
	}
	f := Frame{Kind: b[0]}
	seq := binary.BigEndian.Uint64(b[1:9])
	switch f.Kind {
	case FrameStdin, FrameStdout, FrameStderr:
		f.Data = b[9:]
	case FrameControl:
		c, err := ParseControl(b[9:])
		if err != nil {
			return Frame{}, 0, err
		}
		f.Control = c
	default:
		return Frame{}, 0, fmt.Errorf("%w: unknown kind %d", ErrBadFrame, f.Kind)
	}
	return f, seq, nil
}

// AttachRequest asks a host for a stream of one of its sessions: a
// running one (SessionID, under SessionKey), or one its Exec started with
// ExecRequest.Stream (StreamID).
type AttachRequest struct {
	SessionKey string `json:"sessionKey"`
	SessionID  string `json:"sessionId,omitempty"`
	StreamID   string `json:"streamId,omitempty"`
	// Write asks for the session's input (one client at a time).
	Write bool `json:"write,omitempty"`
}

// StreamSpec asks Exec to bind a stream to the session before it runs,
// so that the stream sees all output; the caller then claims it with an
// AttachRequest naming ID. An unclaimed stream is dropped after a while
// (and its session killed, without KeepOnDetach).
type StreamSpec struct {
	ID           string `json:"id"`
	Stdin        bool   `json:"stdin,omitempty"`
	KeepOnDetach bool   `json:"keepOnDetach,omitempty"`
}
