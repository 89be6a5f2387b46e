package hostbus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/protocol"
)

// Remote defaults.
const (
	// DefaultRequestMargin is added to the longest wait of a request (the
	// yield window of an exec, the wait of a poll, the timeout of a
	// synchronous run) to form its deadline.
	DefaultRequestMargin = 15 * time.Second
	// DefaultCallTimeout bounds requests that do not wait (process actions
	// other than poll, list, background starts).
	DefaultCallTimeout = 15 * time.Second
	// maxPollWait is the session core's cap on a poll wait (DESIGN §3.2).
	maxPollWait = 30 * time.Second
	minYieldMs  = 10
	maxYieldMs  = 120000
)

// ErrSilent is the cause of a request given up because its host stopped
// answering while it waited (no heartbeat for the presence TTL, a failed
// liveness probe, or a new run of the agent took its place).
var ErrSilent = errors.New("the host went silent")

// SilentError is ErrSilent with what the host did: "stopped sending
// heartbeats", "restarted", … (completing "the host …").
type SilentError struct{ Reason string }

func (e *SilentError) Error() string { return "the host " + e.Reason }

// Is makes a SilentError match ErrSilent.
func (e *SilentError) Is(target error) bool { return target == ErrSilent }

// ErrNoAnswer marks a request whose answer did not come (the deadline
// passed, the connection dropped or the host went silent while it waited):
// it may have been delivered and acted upon.
var ErrNoAnswer = errors.New("no answer from the host in time")

// Remote is a Host reached over NATS: the endpoints a Server serves under
// Group. Its zero value is not usable; fill every field without a default.
type Remote struct {
	Conn *nats.Conn
	// Group is the host's subject group, <prefix>.node.<id>.
	Group string
	// Label names the host in errors: "node alpha (b3nd…)".
	Label string
	Log   *slog.Logger
	// Watch, when set, derives from ctx a context that ends with cause
	// ErrSilent when the host goes silent or is replaced by a new run,
	// so that a request the host will never answer fails then instead of
	// at its deadline. The second result must be called to release it.
	Watch func(ctx context.Context) (context.Context, context.CancelFunc)
	// ServerWatch, when set, watches the NATS server itself: a request fails
	// at once while the server is silent (nothing is sent), and one under
	// way fails when it goes silent, within seconds, not at its deadline.
	ServerWatch *bus.ServerWatch
	// Requests, when set, carries the requests: one reply subscription
	// shared by every request on Conn (bus.Requester); nil opens one per
	// request (bus.RequestChunked).
	Requests *bus.Requester
	// OnUnreachable is called when a request finds nobody listening, so
	// the caller's view of the host's liveness can follow at once.
	OnUnreachable func()
	// RequestMargin and CallTimeout; zero takes the defaults.
	RequestMargin time.Duration
	CallTimeout   time.Duration
	// StreamWindow, StreamPing and StreamTimeout shape the streams of
	// Attach (stream.go): the output in flight, the ping of an idle side,
	// the silence that ends a stream; zero takes DefaultStreamWindow,
	// DefaultStreamPing, DefaultStreamTimeout.
	StreamWindow  int64
	StreamPing    time.Duration
	StreamTimeout time.Duration
}

func (r *Remote) margin() time.Duration {
	if r.RequestMargin > 0 {
		return r.RequestMargin
	}
	return DefaultRequestMargin
}

func (r *Remote) callTimeout() time.Duration {
	if r.CallTimeout > 0 {
		return r.CallTimeout
	}
	return DefaultCallTimeout
}

// Exec starts a command on the host. The deadline is the yield window (or
// the timeout of a synchronous run) plus the margin, computed from the
// request's resolved values, so there is no shorter hidden transport
// timeout. Every start carries a fresh idempotency key: a duplicate
// delivery runs once, and a start that gets no answer in time is reported
// as possibly started, never re-run.
func (r *Remote) Exec(ctx context.Context, req protocol.ExecRequest) (protocol.ExecReply, error) {
	var deadline time.Duration
	a := req.Args
	if req.Stream != nil {
		// Its subjects are named after the stream id (Attach).
		if err := protocol.ValidateStreamID(req.Stream.ID); err != nil {
			return protocol.ExecReply{}, err
		}
	}
	switch {
	case req.Sync && req.Stream == nil:
		if a.Timeout != nil && *a.Timeout > 0 {
			deadline = time.Duration(*a.Timeout*float64(time.Second)) + r.margin()
		} // else: the caller's context alone
	case a.Background || req.Stream != nil:
		// A start with a stream runs in the background (host.Local).
		deadline = r.callTimeout()
	default:
		y := float64(maxYieldMs)
		if a.YieldMs != nil {
			y = min(max(*a.YieldMs, minYieldMs), maxYieldMs)
		}
		deadline = time.Duration(y*float64(time.Millisecond)) + r.margin()
	}
	body, err := json.Marshal(req)
	if err != nil {
		return protocol.ExecReply{}, protocol.Errorf(protocol.ErrInternal, "exec: encode request: %v", err)
	}
	key := newUUID()
	if req.IdempotencyKey != "" {
		key = req.IdempotencyKey
	}
	if req.Approval != nil {
		// An approved start is idempotent by its approval.
		key = "approval-" + req.Approval.Decision.ApprovalID
	}
	hdr := nats.Header{}
	hdr.Set(protocol.NodeHeaderIdempotencyKey, key)
	m, err := r.call(ctx, protocol.NodeEndpointExec, body, hdr, deadline)
	if errors.Is(err, ErrNoAnswer) {
		r.log().Warn("exec start outcome unknown", "host", r.Label, "idempotencyKey", key, "err", err)
		return protocol.ExecReply{}, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
			Message: fmt.Sprintf("exec on %s: %s, so the command may or may not have started (idempotency key %s). It was not retried automatically; check with process list before running it again.", r.Label, noAnswer(err, deadline), key)}
	}
	if err != nil {
		return protocol.ExecReply{}, err
	}
	var reply protocol.ExecReply
	if err := protocol.DecodeExecReply(m.Data, &reply); err != nil {
		return protocol.ExecReply{}, protocol.Errorf(protocol.ErrInternal, "exec on %s: malformed reply: %v", r.Label, err)
	}
	return reply, nil
}

// Process runs a process action on one of the host's sessions.
func (r *Remote) Process(ctx context.Context, req protocol.ProcessRequest) (protocol.ProcessReply, error) {
	timeout := r.callTimeout()
	if req.Args.Action == "poll" {
		wait := time.Duration(0)
		if req.Args.Timeout != nil {
			wait = min(time.Duration(*req.Args.Timeout)*time.Millisecond, maxPollWait)
		}
		timeout = wait + r.margin()
	}
	body, err := json.Marshal(req)
	if err != nil {
		return protocol.ProcessReply{}, protocol.Errorf(protocol.ErrInternal, "process: encode request: %v", err)
	}
	m, err := r.call(ctx, protocol.NodeEndpointProcess, body, nil, timeout)
	if errors.Is(err, ErrNoAnswer) {
		return protocol.ProcessReply{}, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
			Message: fmt.Sprintf("process %s on %s: %s; the action may or may not have been applied.", req.Args.Action, r.Label, noAnswer(err, timeout))}
	}
	if err != nil {
		return protocol.ProcessReply{}, err
	}
	var reply protocol.ProcessReply
	if err := protocol.DecodeProcessReply(m.Data, &reply); err != nil {
		return protocol.ProcessReply{}, protocol.Errorf(protocol.ErrInternal, "process on %s: malformed reply: %v", r.Label, err)
	}
	return reply, nil
}

// List lists a sessionKey's sessions on the host.
func (r *Remote) List(ctx context.Context, req protocol.ListRequest) (protocol.ListReply, error) {
	data, err := r.list(ctx, req)
	if err != nil {
		return protocol.ListReply{}, err
	}
	var reply protocol.ListReply
	if err := protocol.DecodeListReply(data, &reply); err != nil {
		return protocol.ListReply{}, protocol.Errorf(protocol.ErrInternal, "list on %s: malformed reply: %v", r.Label, err)
	}
	return reply, nil
}

// ListEntries is List with the entries kept as the host encoded them
// (protocol.DecodeListEntries), for a gateway that merges them.
func (r *Remote) ListEntries(ctx context.Context, req protocol.ListRequest) (protocol.ListEntries, error) {
	data, err := r.list(ctx, req)
	if err != nil {
		return protocol.ListEntries{}, err
	}
	d, err := protocol.DecodeListEntries(data)
	if err != nil {
		return protocol.ListEntries{}, protocol.Errorf(protocol.ErrInternal, "list on %s: malformed reply: %v", r.Label, err)
	}
	return d, nil
}

// list asks the host for a list and returns the JSON of its reply.
func (r *Remote) list(ctx context.Context, req protocol.ListRequest) ([]byte, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, protocol.Errorf(protocol.ErrInternal, "list: encode request: %v", err)
	}
	timeout := r.callTimeout()
	m, err := r.call(ctx, protocol.NodeEndpointList, body, nil, timeout)
	if errors.Is(err, ErrNoAnswer) {
		return nil, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
			Message: fmt.Sprintf("list on %s: %s.", r.Label, noAnswer(err, timeout))}
	}
	if err != nil {
		return nil, err
	}
	return m.Data, nil
}

// ApplyPatch applies a patch on the host.
func (r *Remote) ApplyPatch(ctx context.Context, req protocol.ApplyPatchRequest) (protocol.Result, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return protocol.Result{}, protocol.Errorf(protocol.ErrInternal, "apply_patch: encode request: %v", err)
	}
	timeout := r.callTimeout()
	m, err := r.call(ctx, protocol.NodeEndpointApplyPatch, body, nil, timeout)
	if errors.Is(err, ErrNoAnswer) {
		return protocol.Result{}, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
			Message: fmt.Sprintf("apply_patch on %s: %s; the patch may or may not have been applied.", r.Label, noAnswer(err, timeout))}
	}
	if err != nil {
		return protocol.Result{}, err
	}
	var res protocol.Result
	if err := json.Unmarshal(m.Data, &res); err != nil {
		return protocol.Result{}, protocol.Errorf(protocol.ErrInternal, "apply_patch on %s: malformed result: %v", r.Label, err)
	}
	return res, nil
}

// Request sends one request to another endpoint of the host's group
// (approvals.get, approvals.set, pairing, …) with the same error handling
// as the host calls, and returns the reply's data.
func (r *Remote) Request(ctx context.Context, endpoint string, body []byte, timeout time.Duration) ([]byte, error) {
	if timeout <= 0 {
		timeout = r.callTimeout()
	}
	m, err := r.call(ctx, endpoint, body, nil, timeout)
	if errors.Is(err, ErrNoAnswer) {
		return nil, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
			Message: fmt.Sprintf("%s on %s: %s.", endpoint, r.Label, noAnswer(err, timeout))}
	}
	if err != nil {
		return nil, err
	}
	return m.Data, nil
}

func (r *Remote) log() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.New(slog.DiscardHandler)
}

// call sends one request to an endpoint of the host and returns its
// reply. Errors: a retryable *protocol.Error when the host (or this
// side's NATS connection) is not there, so nothing was delivered; an
// error wrapping ErrNoAnswer when the deadline passed, the connection
// dropped or the host went silent meanwhile (outcome unknown); the host's
// *protocol.Error (or *host.ApprovalNeededError) when it refused the
// request; the caller's ctx error when the caller went away.
func (r *Remote) call(ctx context.Context, endpoint string, body []byte, hdr nats.Header, timeout time.Duration) (*nats.Msg, error) {
	if r.Conn.IsClosed() || !r.Conn.IsConnected() {
		return nil, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
			Message: fmt.Sprintf("the gateway is not connected to NATS; %s cannot be reached. Retry later.", r.Label)}
	}
	if err := r.ServerWatch.Healthy(); err != nil {
		return nil, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
			Message: fmt.Sprintf("%s cannot be reached: %v; nothing was sent. Retry in a few seconds.", r.Label, err)}
	}
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		rctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	if r.Watch != nil {
		wctx, wcancel := r.Watch(rctx)
		defer wcancel()
		rctx = wctx
	}
	sctx, scancel := r.ServerWatch.Watch(rctx)
	defer scancel()
	rctx = sctx
	var m *nats.Msg
	var err error
	if r.Requests != nil {
		m, err = r.Requests.Request(rctx, r.Group+"."+endpoint, body, hdr)
	} else {
		m, err = bus.RequestChunked(rctx, r.Conn, r.Group+"."+endpoint, body, hdr)
	}
	switch {
	case errors.Is(err, bus.ErrUnreachable):
		if r.OnUnreachable != nil {
			r.OnUnreachable()
		}
		return nil, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
			Message: fmt.Sprintf("%s is unreachable (not connected to NATS); nothing was delivered. Retry when it reconnects.", r.Label)}
	case err != nil && ctx.Err() != nil:
		return nil, ctx.Err()
	case err != nil && errors.Is(context.Cause(rctx), bus.ErrServerSilent):
		r.log().Warn("request given up: the NATS server stopped answering", "host", r.Label, "endpoint", endpoint)
		return nil, fmt.Errorf("%w (%s): %w", ErrNoAnswer, timeout, context.Cause(rctx))
	case err != nil && errors.Is(context.Cause(rctx), ErrSilent):
		r.log().Info("request given up: the host went silent", "host", r.Label, "endpoint", endpoint)
		return nil, fmt.Errorf("%w (%s): %w", ErrNoAnswer, timeout, context.Cause(rctx))
	case err != nil && (rctx.Err() != nil || errors.Is(err, bus.ErrConnectionLost)):
		return nil, fmt.Errorf("%w (%s): %w", ErrNoAnswer, timeout, err)
	case err != nil:
		return nil, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: fmt.Sprintf("%s: %v", r.Label, err)}
	}
	if rerr := bus.ReplyError(m); rerr != nil {
		return nil, r.replyError(rerr)
	}
	return m, nil
}

// replyError turns a micro error reply into the host's error.
func (r *Remote) replyError(rerr error) error {
	var se *bus.ServiceError
	errors.As(rerr, &se)
	var data errorReply
	if se != nil && json.Unmarshal(se.Data, &data) == nil && data.Error != nil && data.Type != "" && data.Message != "" {
		if data.Type == protocol.ErrApprovalRequired && data.Approval != nil {
			return &host.ApprovalNeededError{Err: data.Error, Request: *data.Approval}
		}
		return data.Error
	}
	return protocol.Errorf(protocol.ErrInternal, "%s: %v", r.Label, rerr)
}

// noAnswer says why a call failed with ErrNoAnswer.
func noAnswer(err error, timeout time.Duration) string {
	switch {
	case errors.Is(err, bus.ErrConnectionLost):
		return "no answer (the gateway's NATS connection dropped while it waited)"
	case errors.Is(err, bus.ErrServerSilent):
		return "no answer, and the NATS server stopped answering pings while the gateway waited (frozen or cut off)"
	case errors.Is(err, ErrSilent):
		var se *SilentError
		if errors.As(err, &se) {
			return "no answer, and the host " + se.Reason + " while the gateway waited"
		}
		return "no answer, and the host stopped answering (or restarted) while the gateway waited"
	}
	return fmt.Sprintf("no answer within %s", timeout)
}

// newUUID returns a random (version 4) UUID, the idempotency key of one
// exec start.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	// By hand: fmt costs more than the rest of the key (one per exec).
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], b[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], b[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], b[8:10])
	out[23] = '-'
	hex.Encode(out[24:36], b[10:16])
	return string(out[:])
}

var _ host.Host = (*Remote)(nil)
