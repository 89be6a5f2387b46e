package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/execmesh/execmesh/protocol"
)

// Invoker runs tool calls and reads system events for one sessionKey. Its
// two implementations are NewHTTPInvoker (a gateway over HTTP) and
// NewGatewayInvoker (an in-process *gateway.Gateway).
type Invoker interface {
	// Invoke runs one exec or process call. A non-nil error is raised by
	// the tool before anything ran (invalid arguments, a security
	// violation, …) or means the gateway could not be reached.
	Invoke(ctx context.Context, tool string, args json.RawMessage) (protocol.Result, error)
	// Follow hands each system event of the sessionKey to send, as it
	// comes, until ctx ends or send fails; an event is confirmed (removed
	// from the queue) only once send accepted it. wait bounds one read of
	// a polling implementation; a wait of 0 hands over only the events
	// queued now and returns.
	Follow(ctx context.Context, wait time.Duration, send func(protocol.SystemEvent) error) error
}

// Options configure the MCP server. The zero value is ready to use.
type Options struct {
	// Version is reported as serverInfo.version; empty means "dev".
	Version string
	// Logger receives the server's own diagnostics (event delivery
	// failures, the SDK's session logs); nil discards them.
	Logger *slog.Logger
	// EventWait bounds one long poll for system events; 0 means 25 s.
	EventWait time.Duration
	// DisableEvents turns off system events: no logging notifications,
	// nothing appended to tool results.
	DisableEvents bool
	// SessionTimeout closes a streamable-HTTP session that sent no request
	// for that long, which also ends its event forwarding (HTTPHandler
	// only); 0 means 30 minutes, a negative value never.
	SessionTimeout time.Duration
	// AckTimeout bounds how long a client has to answer the ping that
	// follows each system event (see forwardEvents): an event is
	// confirmed only once the client answered it. 0 means 10 s.
	AckTimeout time.Duration
	// StructuredContent returns each result's details object as
	// structured content beside the text. Off, a result is its text alone:
	// OpenClaw (2026.9.6) prepends structured content to the text it shows
	// the model, which would then read every output twice. HTTPHandler
	// also turns it on for a session whose request asks
	// (StructuredContentHeader).
	StructuredContent bool
	// ApplyPatch reports whether to offer the apply_patch tool too (the
	// gateway's tools.exec.applyPatch.enabled). It is asked when a server
	// is built: once for ServeStdio, per session for HTTPHandler, so a
	// reloaded configuration applies to new sessions. nil never offers it.
	// The gateway still decides every call.
	ApplyPatch func() bool
}

// Logger is the name logging notifications carry.
const Logger = "execmesh"

const (
	defaultEventWait      = 25 * time.Second
	defaultSessionTimeout = 30 * time.Minute
	defaultAckTimeout     = 10 * time.Second
	// minEventInterval paces an event source that answers at once with
	// nothing, so a gateway that ignores waitMs cannot make a busy loop.
	minEventInterval = time.Second
	maxEventBackoff  = 30 * time.Second
)

// serverVersions are the protocol versions this server negotiates: the
// initialize-handshake versions only. Exit events are pushed as logging
// notifications on a session, and the sessionless 2026-07-28 protocol has
// neither sessions nor logging; its clients fall back to initialize.
var serverVersions = slices.DeleteFunc(mcp.SupportedProtocolVersions(), func(v string) bool { return v >= "2026-07-28" })

// server is one *mcp.Server and the event forwarders of its sessions.
type server struct {
	mcp  *mcp.Server
	inv  Invoker
	opts Options
	log  *slog.Logger
	// wg counts the goroutines of every session's event forwarding, so
	// that ServeStdio returns only after they have ended.
	wg sync.WaitGroup
	// levels holds each session's logging level (*mcp.ServerSession →
	// mcp.LoggingLevel) as the client set it with logging/setLevel: the
	// SDK drops a message below it without an error, so an event is not
	// sent (and not confirmed) to a session that would drop it, and one
	// that never set a level gets its events on tool results instead.
	levels sync.Map
	// following holds the sessions whose event forwarding has started
	// (*mcp.ServerSession → struct{}).
	following sync.Map
}

// New returns an MCP server exposing the exec and process tools, each call
// forwarded to inv. System events (exit notices) reach a session's client
// one of two ways, each event exactly once (see forwardEvents and
// withNotices): a session that called logging/setLevel with info or debug
// gets a goroutine that long-polls inv.Follow and sends each event as a
// notifications/message (level info, logger "execmesh"), ending with the
// session; any other session gets the events pending at each tool call
// appended to that call's result. Serve it with (*mcp.Server).Run on any
// transport, or use ServeStdio and HTTPHandler.
func New(inv Invoker, opts Options) *mcp.Server {
	return newServer(inv, opts).mcp
}

func newServer(inv Invoker, opts Options) *server {
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.EventWait <= 0 {
		opts.EventWait = defaultEventWait
	}
	if opts.AckTimeout <= 0 {
		opts.AckTimeout = defaultAckTimeout
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &server{inv: inv, opts: opts, log: log}
	so := &mcp.ServerOptions{
		Instructions: "exec runs shell commands: a command still running after the yield window continues as a background session, " +
			"which process follows up (poll, log, write, send-keys, kill). " +
			"When a background session exits, a notice arrives as a log message from logger \"" + Logger + "\" " +
			"to a client that set a logging level, otherwise at the end of the next tool result (\"" + noticePrefix + "Exec completed …\").",
		Logger:                    log,
		SupportedProtocolVersions: serverVersions,
		// Tools are fixed, so no list_changed; logging carries exit events.
		Capabilities: &mcp.ServerCapabilities{
			Tools:   &mcp.ToolCapabilities{},
			Logging: &mcp.LoggingCapabilities{},
		},
	}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "execmesh", Title: "execmesh", Version: opts.Version}, so)
	if !opts.DisableEvents {
		s.mcp.AddReceivingMiddleware(s.trackLogLevel)
	}
	s.mcp.AddTool(execTool(), s.handler(protocol.ToolExec))
	s.mcp.AddTool(processTool(), s.handler(protocol.ToolProcess))
	if opts.ApplyPatch != nil && opts.ApplyPatch() {
		s.mcp.AddTool(applyPatchTool(), s.handler(protocol.ToolApplyPatch))
	}
	return s
}

// handler forwards one tool's calls to the Invoker.
//
// What the gateway raises (its 400s: wrong argument types, unknown
// parameters, security violations; an unreachable gateway too) becomes a
// result with isError set and the message as text, so the model reads it
// and can correct the call. A result is returned as its text plus the
// details object as structured content; a failed exec is also marked as an
// error, as OpenClaw marks it (spec §12.2), and so is a failed apply_patch,
// while a failed process action
// ("No session found for …") is a plain result (spec §15.2).
func (s *server) handler(tool string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		args := req.Params.Arguments
		if len(args) == 0 {
			args = json.RawMessage("{}")
		}
		res, err := s.inv.Invoke(ctx, tool, args)
		if err != nil {
			return s.withNotices(ctx, req.Session, &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}), nil
		}
		out := &mcp.CallToolResult{
			Content: make([]mcp.Content, 0, len(res.Content)),
			IsError: tool != protocol.ToolProcess && res.Status() == protocol.StatusFailed,
		}
		for _, c := range res.Content {
			out.Content = append(out.Content, &mcp.TextContent{Text: c.Text})
		}
		if s.opts.StructuredContent {
			out.StructuredContent = res.Details
		}
		return s.withNotices(ctx, req.Session, out), nil
	}
}

// noticePrefix starts the text of a system event appended to a tool
// result, as OpenClaw shows its own system events to the model.
const noticePrefix = "System: "

// withNotices appends the system events pending for the sessionKey to a
// tool result, one text content each, when the session does not take
// logging notifications (it never set a level that lets info through):
// OpenClaw's MCP client, for one, registers no handler for them, while
// its SDK answers pings, so neither a sent notification nor an answered
// ping says the model saw anything. The result is what the model reads
// next, so an event is confirmed (removed from the queue) only as it is
// added to one; an event that cannot be read now stays queued.
func (s *server) withNotices(ctx context.Context, ss *mcp.ServerSession, res *mcp.CallToolResult) *mcp.CallToolResult {
	if s.opts.DisableEvents || ss == nil || s.takesInfo(ss) || ctx.Err() != nil {
		return res
	}
	err := s.inv.Follow(ctx, 0, func(ev protocol.SystemEvent) error {
		if ctx.Err() != nil {
			return ctx.Err() // the result will not be sent: leave it queued
		}
		res.Content = append(res.Content, &mcp.TextContent{Text: noticePrefix + ev.Text})
		return nil
	})
	if err != nil && ctx.Err() == nil {
		s.log.Warn("reading system events for a tool result", "err", err)
	}
	return res
}

// trackLogLevel records the logging level each session sets and starts
// the session's event forwarding on its first logging/setLevel. Setting a
// level is the client's word that it takes log messages: the SDK of every
// client answers pings, and sending notifications to a client that has no
// handler for them (OpenClaw's) would confirm events nobody read. A
// session that never sets one gets its events on tool results.
func (s *server) trackLogLevel(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if err != nil || method != "logging/setLevel" {
			return res, err
		}
		ss, ok := req.GetSession().(*mcp.ServerSession)
		if !ok {
			return res, nil
		}
		if p, ok := req.GetParams().(*mcp.SetLoggingLevelParams); ok && p != nil {
			s.levels.Store(ss, p.Level)
			if _, started := s.following.LoadOrStore(ss, struct{}{}); !started {
				s.forward(ss)
			}
		}
		return res, nil
	}
}

// takesInfo reports whether the session's logging level lets an info
// message through: debug or info (MCP's levels are syslog's).
func (s *server) takesInfo(ss *mcp.ServerSession) bool {
	l, _ := s.levels.Load(ss)
	return l == mcp.LoggingLevel("info") || l == mcp.LoggingLevel("debug")
}

// forward starts the event forwarding of one session: a goroutine that
// long-polls the events and one that cancels it when the session ends.
// Both are counted in s.wg.
func (s *server) forward(ss *mcp.ServerSession) {
	ctx, cancel := context.WithCancel(context.Background())
	s.wg.Go(func() {
		_ = ss.Wait()
		cancel()
		s.levels.Delete(ss)
		s.following.Delete(ss)
	})
	s.wg.Go(func() {
		defer cancel()
		s.forwardEvents(ctx, ss)
	})
}

// forwardEvents sends every system event of the session key as a logging
// notification until ctx ends. An event is confirmed only once the client
// has it: one that cannot be sent (no stream is connected, the session is
// closing, its logging level is above info) or whose delivery the client
// does not confirm stays queued for the next reader, and forwarding pauses
// with a growing delay before it tries again.
//
// A notification has no answer, and a transport's write succeeding says
// nothing about the client: a streamable-HTTP stream whose client is gone
// but whose connection the server has not seen close yet (a network path
// that died, a suspended machine, a killed process in the moment before
// its socket closes) takes writes into socket buffers that nobody reads.
// So each event is followed by a ping on the same stream: the client
// answers it only after it has read what came before. An event may thus
// come twice (the answer was lost), never not at all. The ping only says
// the client read the stream; that it takes log messages at all, the
// client said by setting a level (trackLogLevel): a ping alone never
// counts as delivery.
func (s *server) forwardEvents(ctx context.Context, ss *mcp.ServerSession) {
	backoff := minEventInterval
	for ctx.Err() == nil {
		start := time.Now()
		sent := false
		err := s.inv.Follow(ctx, s.opts.EventWait, func(ev protocol.SystemEvent) error {
			if err := s.deliver(ctx, ss, ev); err != nil {
				return &undelivered{err}
			}
			sent = true
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		var und *undelivered
		switch {
		case errors.As(err, &und):
			s.log.Debug("system event not delivered; it stays queued", "err", und.err, "retryIn", backoff)
		case err != nil:
			s.log.Warn("reading system events", "err", err, "retryIn", backoff)
		case sent || time.Since(start) >= minEventInterval/4:
			backoff = minEventInterval
			continue
		}
		sleep(ctx, backoff)
		backoff = min(2*backoff, maxEventBackoff)
	}
}

// errLevel is a session whose logging level is above info.
var errLevel = errors.New("the client's logging level is above info")

// deliver sends ev to the session's client and returns once the client has
// confirmed it by answering a ping (an error answer is an answer too).
func (s *server) deliver(ctx context.Context, ss *mcp.ServerSession, ev protocol.SystemEvent) error {
	if !s.takesInfo(ss) {
		return errLevel
	}
	// A context of its own (not a request's): the SDK sends both on the
	// session's standalone stream, in this order.
	if err := ss.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Logger: Logger, Data: ev}); err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, s.opts.AckTimeout)
	defer cancel()
	err := ss.Ping(pctx, nil)
	if err != nil && !errors.As(err, new(*jsonrpc.Error)) {
		return fmt.Errorf("the client did not confirm the event: %w", err)
	}
	return nil
}

// undelivered is a send that the session's transport refused.
type undelivered struct{ err error }

func (u *undelivered) Error() string { return "undelivered: " + u.err.Error() }

// sleep waits for d or the end of ctx.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
