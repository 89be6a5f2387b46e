// Package hostbus carries a host.Host over NATS: Server serves a host's
// endpoints in a nats micro service group (a node agent's
// <prefix>.node.<id>), and Remote is the Host a gateway calls, which sends
// each call to those endpoints and turns what can go wrong on the way
// (nobody listening, no answer in time, the host going silent, a dropped
// connection) into clear, retryable errors.
//
// Requests are JSON and decoded strictly; errors are micro error replies
// whose code is the HTTP status of the error type and whose data is the
// JSON of a *protocol.Error (with "approval" for ErrApprovalRequired), so a
// gateway hands the very same error to its caller. Replies and requests
// larger than the server's max_payload travel in chunks (bus.RespondChunked,
// bus.RequestChunked).
package hostbus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/protocol"
)

// Server defaults.
const (
	DefaultIdempotencyTTL = 15 * time.Minute
	DefaultMaxIdempotency = 4096
)

// ServerConfig configures a Server.
type ServerConfig struct {
	Logger *slog.Logger
	// Host answers the calls.
	Host host.Host
	// Name says whose host it is, in errors ("node alpha").
	Name string
	// Instance is the host's run, answered to pings.
	Instance string
	// IdempotencyTTL and MaxIdempotencyKeys bound the exec-start replay
	// cache; zero values take the defaults.
	IdempotencyTTL     time.Duration
	MaxIdempotencyKeys int
	// Count, when set, wraps every handler (the node agent's counters).
	Count func(endpoint string, fn HandlerFunc) HandlerFunc
	// StreamPing and StreamTimeout time the liveness of streams (a Host
	// that is a host.Streamer, see stream.go); zero values take
	// DefaultStreamPing and DefaultStreamTimeout.
	StreamPing    time.Duration
	StreamTimeout time.Duration
}

// HandlerFunc serves one endpoint: it returns the JSON reply, or an error
// that is answered as a micro error (a *protocol.Error keeps its type and
// text; an *host.ApprovalNeededError carries its request).
type HandlerFunc func(ctx context.Context, req micro.Request) ([]byte, error)

// Server serves a host's endpoints. Build it with NewServer, register it
// with AddTo, and stop it with Close.
type Server struct {
	cfg  ServerConfig
	log  *slog.Logger
	idem *idemCache

	// ctx ends when Close begins, so that waits (yield windows, polls)
	// answer promptly.
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	workers workers

	mu      sync.Mutex
	closing bool
	nc      *nats.Conn
	streams map[string]*nodeStream // open streams by id (stream.go)
	timing  streamTiming

	// listBuf is the buffer of the last list reply, once sent: the next
	// one is written into it (a node's list of ten thousand sessions is
	// about 4 MB, and fresh memory costs a page fault per 4 KiB).
	listBuf atomic.Pointer[[]byte]
}

// NewServer returns a Server for cfg.Host.
func NewServer(cfg ServerConfig) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.IdempotencyTTL <= 0 {
		cfg.IdempotencyTTL = DefaultIdempotencyTTL
	}
	if cfg.MaxIdempotencyKeys <= 0 {
		cfg.MaxIdempotencyKeys = DefaultMaxIdempotency
	}
	s := &Server{cfg: cfg, log: cfg.Logger, idem: newIdemCache(cfg.IdempotencyTTL, cfg.MaxIdempotencyKeys),
		timing: newStreamTiming(cfg.StreamPing, cfg.StreamTimeout)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// Endpoint names and subjects of a host's group.
var hostEndpoints = []struct{ name, subject string }{
	{"exec", protocol.NodeEndpointExec},
	{"process", protocol.NodeEndpointProcess},
	{"list", protocol.NodeEndpointList},
	{"applypatch", protocol.NodeEndpointApplyPatch},
	{"ping", protocol.NodeEndpointPing},
	{"attach", protocol.NodeEndpointAttach},
}

// AddTo registers the host endpoints (exec, process, list, applypatch,
// ping, attach) in g, answering on nc.
func (s *Server) AddTo(nc *nats.Conn, g micro.Group) error {
	s.mu.Lock()
	s.nc = nc
	s.mu.Unlock()
	handlers := map[string]HandlerFunc{
		"exec": s.handleExec, "process": s.handleProcess, "list": s.handleList, "applypatch": s.handleApplyPatch,
		"ping": s.handlePing, "attach": s.handleAttach,
	}
	for _, e := range hostEndpoints {
		if err := g.AddEndpoint(e.name, s.Endpoint(e.name, handlers[e.name]), micro.WithEndpointSubject(e.subject),
			micro.WithEndpointPendingLimits(bus.PendingMsgsLimit, bus.PendingBytesLimit)); err != nil {
			return fmt.Errorf("hostbus: endpoint %s: %w", e.name, err)
		}
	}
	return nil
}

// Endpoint adapts fn to micro. Every endpoint is a single subscription
// whose messages are handled one at a time, so the handler only hands the
// request to a tracked goroutine (a worker, see workers): a poll waiting
// 30 s must not hold up the next exec. Once Close has begun requests are
// refused as retryable.
func (s *Server) Endpoint(name string, fn HandlerFunc) micro.HandlerFunc {
	if s.cfg.Count != nil {
		fn = s.cfg.Count(name, fn)
	}
	return func(req micro.Request) {
		if req.Reply() == "" {
			s.log.Debug("request without reply subject ignored", "endpoint", name)
			return
		}
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			replyError(req, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: s.cfg.Name + " is shutting down"}, nil, s.log)
			return
		}
		s.wg.Add(1)
		nc := s.nc
		s.mu.Unlock()
		s.workers.run(func() {
			defer s.wg.Done()
			defer func() {
				if r := recover(); r != nil {
					s.log.Error("handler panic", "endpoint", name, "panic", r)
					publishError(nc, req.Reply(), protocol.Errorf(protocol.ErrInternal, "%s: internal error in %s", s.cfg.Name, name), nil, s.log)
				}
			}()
			reply, err := fn(s.ctx, req)
			if err != nil {
				pe := protocol.AsError(err)
				if s.ctx.Err() != nil && pe.Type == protocol.ErrInternal {
					// Close cut the wait short: say so, retryably.
					pe = &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: s.cfg.Name + " is shutting down: " + pe.Message}
				}
				publishError(nc, req.Reply(), pe, err, s.log)
				return
			}
			if err := bus.RespondChunked(nc, req.Reply(), reply, nil); err != nil {
				s.log.Warn("reply not sent", "endpoint", name, "err", err)
			}
			if name == "list" && cap(reply) <= maxListBuf {
				// Sent (nats.go copies what it publishes): the next
				// list reply may be written over it.
				s.listBuf.Store(&reply)
			}
		})
	}
}

// Close refuses new requests, ends the streams (their gateways hear
// why) and the waits of the requests in flight, and waits for them,
// bounded by ctx. It is idempotent.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.closeStreams()
	s.cancel()
	s.workers.close()
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("hostbus: handlers still running: %w", ctx.Err())
	}
}

// handleExec starts a command. With an idempotency key, a repeated start
// answers what the first one answered.
func (s *Server) handleExec(ctx context.Context, req micro.Request) ([]byte, error) {
	var r protocol.ExecRequest
	if err := DecodeStrict("exec", req.Data(), &r); err != nil {
		return nil, err
	}
	run := func() ([]byte, error) {
		reply, err := s.cfg.Host.Exec(ctx, r)
		if err != nil {
			return nil, err
		}
		return reply.AppendJSON(make([]byte, 0, 1024)), nil
	}
	key := req.Headers().Get(protocol.NodeHeaderIdempotencyKey)
	if key == "" {
		return run()
	}
	if !validIdempotencyKey(key) {
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "exec: invalid %s header (1 to %d printable characters)", protocol.NodeHeaderIdempotencyKey, maxIdempotencyKeyLen)
	}
	reply, err, replayed := s.idem.do(ctx, key, r.SessionKey, run)
	if replayed {
		s.log.Info("exec start repeated; answering the first start", "idempotencyKey", key)
	}
	return reply, err
}

func (s *Server) handleProcess(ctx context.Context, req micro.Request) ([]byte, error) {
	var r protocol.ProcessRequest
	if err := DecodeStrict("process", req.Data(), &r); err != nil {
		return nil, err
	}
	reply, err := s.cfg.Host.Process(ctx, r)
	if err != nil {
		return nil, err
	}
	return reply.AppendJSON(make([]byte, 0, 1024)), nil
}

func (s *Server) handleList(ctx context.Context, req micro.Request) ([]byte, error) {
	var r protocol.ListRequest
	if err := DecodeStrict("list", req.Data(), &r); err != nil {
		return nil, err
	}
	if a, ok := s.cfg.Host.(ListAppender); ok {
		var buf []byte
		if p := s.listBuf.Swap(nil); p != nil {
			buf = (*p)[:0]
		}
		return a.AppendListJSON(ctx, r, buf)
	}
	reply, err := s.cfg.Host.List(ctx, r)
	if err != nil {
		return nil, err
	}
	// By hand: encoding/json takes hundreds of milliseconds over the
	// entries of ten thousand sessions (see protocol.Result.AppendJSON).
	return reply.AppendJSON(make([]byte, 0, 64+listEntryBytes*len(reply.Sessions))), nil
}

// listEntryBytes is about the size of one encoded list entry.
const listEntryBytes = 512

// maxListBuf bounds the list reply buffer a Server keeps for the next.
const maxListBuf = 64 << 20

// ListAppender is a Host that writes the JSON of its list replies itself
// (host.Local), which the list endpoint then answers as it is.
type ListAppender interface {
	// AppendListJSON appends to dst the JSON of the reply List would
	// give, as ListReply.AppendJSON writes it.
	AppendListJSON(ctx context.Context, req protocol.ListRequest, dst []byte) ([]byte, error)
}

func (s *Server) handleApplyPatch(ctx context.Context, req micro.Request) ([]byte, error) {
	var r protocol.ApplyPatchRequest
	if err := DecodeStrict("applypatch", req.Data(), &r); err != nil {
		return nil, err
	}
	res, err := s.cfg.Host.ApplyPatch(ctx, r)
	if err != nil {
		return nil, err
	}
	return json.Marshal(res)
}

// handlePing answers the gateway's liveness probe with the host's run.
func (s *Server) handlePing(_ context.Context, _ micro.Request) ([]byte, error) {
	return json.Marshal(protocol.PingReply{Instance: s.cfg.Instance})
}

// errorReply is the data of an error reply: the *protocol.Error, and the
// approval request of an ErrApprovalRequired.
type errorReply struct {
	*protocol.Error
	Approval *protocol.ApprovalRequest `json:"approval,omitempty"`
}

// errorData encodes the data of an error reply for pe (err, when it asks
// for an approval, adds its request).
func errorData(pe *protocol.Error, err error) []byte {
	r := errorReply{Error: pe}
	if a, ok := host.AsApprovalNeeded(err); ok {
		r.Approval = &a.Request
	}
	b, merr := json.Marshal(r)
	if merr != nil {
		return nil
	}
	return b
}

// replyError answers req with a micro error from the handler's own
// goroutine (req.Error records the error for STATS in a field the
// handler's caller reads unsynchronised).
func replyError(req micro.Request, pe *protocol.Error, err error, log *slog.Logger) {
	if rerr := req.Error(strconv.Itoa(pe.Type.HTTPStatus()), pe.Message, errorData(pe, err)); rerr != nil {
		log.Debug("error reply not sent", "err", rerr)
	}
}

// publishError sends the same error reply as replyError from any
// goroutine (such errors are not counted in the service's STATS).
func publishError(nc *nats.Conn, reply string, pe *protocol.Error, err error, log *slog.Logger) {
	m := nats.NewMsg(reply)
	m.Header.Set(micro.ErrorHeader, pe.Message)
	m.Header.Set(micro.ErrorCodeHeader, strconv.Itoa(pe.Type.HTTPStatus()))
	m.Data = errorData(pe, err)
	if perr := nc.PublishMsg(m); perr != nil {
		log.Debug("error reply not sent", "err", perr)
	}
}

// DecodeStrict decodes one JSON object into v, refusing unknown fields,
// wrong types and trailing data, with an *protocol.Error that says what
// was wrong.
func DecodeStrict(what string, data []byte, v any) error {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return protocol.Errorf(protocol.ErrInvalidRequest, "%s: request must be a JSON object", what)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return protocol.Errorf(protocol.ErrInvalidRequest, "%s: field %q must be %s", what, te.Field, jsonKind(te.Type.Kind().String()))
		}
		return protocol.Errorf(protocol.ErrInvalidRequest, "%s: malformed request: %v", what, err)
	}
	if dec.More() {
		return protocol.Errorf(protocol.ErrInvalidRequest, "%s: trailing data after the JSON object", what)
	}
	return nil
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "int", "int64", "float64", "uint64":
		return "a number"
	case "slice", "array":
		return "an array"
	case "map", "struct":
		return "an object"
	default:
		return "a " + goKind
	}
}
