package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/hostbus"
	"github.com/execmesh/execmesh/metrics"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// Errors of the agent's life cycle.
var (
	// ErrClosed: the agent is closed or closing.
	ErrClosed = errors.New("nodeagent: closed")
	// ErrNoServer: neither the configuration nor a saved join names a
	// NATS server.
	ErrNoServer = errors.New("nodeagent: no NATS server configured (pass --nats-url, or --join CODE)")
	// ErrRejected: the gateway rejected this node (it said so, or the
	// server stopped accepting the key of a node that was paired). Run
	// returns it: a rejected node gets no work, so it stops.
	ErrRejected = errors.New("nodeagent: this node was rejected by the gateway; it gets no work (approve it again with `execmesh nodes approve`, then start it again)")
)

// authRefusalsToStop is how many refused reconnections of a node that
// was accepted before mean that its key was removed (it was rejected).
const authRefusalsToStop = 3

// announceTimeout bounds one pairing request to the gateway.
const announceTimeout = 3 * time.Second

// Agent is a headless node agent: it connects to NATS, serves its micro
// endpoints under <prefix>.node.<id>, runs the session core for the
// commands the gateway sends, publishes heartbeats and exit events, and
// keeps its sessions running across NATS disconnects and gateway
// restarts. Build it with New, then Start (or Run); Close releases it.
type Agent struct {
	cfg       Config
	log       *slog.Logger
	id        bus.Identity
	name      string
	hostname  string
	platform  string
	instance  string
	startedAt time.Time
	subj      protocol.SubjectSet
	ownPath   string
	host      *host.Local           // the host pipeline and session core
	lost      []session.LostSession // what the session core found of a crashed run, told at Start
	srv       *hostbus.Server       // serves host's endpoints
	mgr       *session.Manager
	keys      *trustedKeys // gateway keys whose signed decisions the host acts on
	counters  counters     // for $SRV.STATS and metrics (stats.go)

	// pubCtx bounds the publication of exit events; it ends when
	// Close's flush time is up.
	pubCtx     context.Context
	cancelPub  context.CancelFunc
	loopCancel context.CancelFunc

	pubWG  sync.WaitGroup // exit-event publishers
	loopWG sync.WaitGroup // heartbeat loop

	mu        sync.Mutex // guards the fields below
	started   bool
	closing   bool // no new handler goroutines
	pubClosed bool // no new exit publishers
	pairing   string
	local     bool          // started without NATS (StartLocal)
	refusals  int           // consecutive refused (re)connections
	rejected  chan struct{} // closed once the node is rejected
	notices   uint64        // pairing notices received, so an older answer does not undo one
	nc        *nats.Conn
	js        jetstream.JetStream
	svc       micro.Service

	closeOnce sync.Once
	closeErr  error
}

// New validates cfg, loads (or creates) the node's identity and builds the
// session core. Nothing is started or connected yet.
func New(cfg Config) (*Agent, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	var id bus.Identity
	if cfg.Identity != nil {
		id = *cfg.Identity
	} else {
		var err error
		id, err = bus.LoadOrCreateNodeIdentity(cfg.StateDir)
		if err != nil {
			return nil, fmt.Errorf("nodeagent: StateDir: %w", err)
		}
	}
	if err := protocol.ValidateNodeID(id.NodeID); err != nil {
		return nil, fmt.Errorf("nodeagent: Identity: %w", err)
	}
	hostname, _ := os.Hostname()
	name := cfg.Name
	if name == "" {
		name = hostname
	}
	if name == "" {
		name = id.NodeID
	}
	a := &Agent{
		rejected:  make(chan struct{}),
		cfg:       cfg,
		id:        id,
		name:      name,
		hostname:  hostname,
		platform:  runtime.GOOS + "/" + runtime.GOARCH,
		startedAt: time.Now(),
		subj:      protocol.Subjects(cfg.Prefix),
	}
	a.log = cfg.Logger.With("nodeId", id.NodeID)
	a.ownPath = protocol.EnvMap(cfg.Environ)["PATH"]
	keys, err := loadTrustedKeys(cfg.StateDir, cfg.GatewayKeys)
	if err != nil {
		return nil, err
	}
	a.keys = keys

	scfg := cfg.Session
	if scfg.Logger == nil {
		scfg.Logger = a.log.With("component", "session")
	}
	// A terminal poll through the gateway acknowledges the queued event
	// there; the node has nothing to drop.
	scfg.OnAcknowledged = nil
	// Command output is counted for $SRV.STATS and metrics (stats.go).
	if prev := scfg.OnOutput; prev != nil {
		scfg.OnOutput = func(n int) { prev(n); a.counters.addOutput(n) }
	} else {
		scfg.OnOutput = a.counters.addOutput
	}
	a.counters.usage = metrics.NewUsageRecorder()
	scfg.OnUsage = a.counters.usage.Observe
	// Running sessions are recorded in the state dir, so that the next
	// run ends what a crash left and tells their agents (exec.lost); the
	// gateway's session core of `execmesh up` has a directory of its own
	// beside it.
	if scfg.StateDir == "" && cfg.StateDir != "" {
		scfg.StateDir = filepath.Join(cfg.StateDir, "sessions", "node")
	}
	scfg.OnLost = func(l session.LostSession) { a.lost = append(a.lost, l) }
	// A session's record stays until JetStream acknowledged its exit
	// event: one never published is reported lost by the next run.
	scfg.ConfirmExits = true
	h, err := host.NewLocal(host.Config{
		Logger:      a.log.With("component", "host"),
		Kind:        host.KindNode,
		ID:          id.NodeID,
		Session:     scfg,
		StateDir:    cfg.StateDir,
		Environ:     cfg.Environ,
		Cwd:         cfg.Cwd,
		TrustedKeys: a.keys.list,
		Ready:       a.ready,
		Confine:     cfg.Confine,
		OnExit:      a.onExit,
	})
	if err != nil {
		return nil, fmt.Errorf("nodeagent: %w", err)
	}
	h.SetSettings(host.Settings{Security: cfg.Security, Ask: cfg.Ask, Workspace: cfg.Workspace,
		AllowlistEnv: cfg.AllowlistEnv, AllowlistWrites: cfg.AllowlistWrites})
	a.host, a.mgr = h, h.Manager()
	a.instance = h.Instance()
	a.srv = hostbus.NewServer(hostbus.ServerConfig{
		Logger: a.log, Host: h, Name: "node agent " + id.NodeID, Instance: h.Instance(),
		IdempotencyTTL: cfg.IdempotencyTTL, MaxIdempotencyKeys: cfg.MaxIdempotencyKeys,
		Count: a.counters.counted,
	})
	a.pubCtx, a.cancelPub = context.WithCancel(context.Background())
	return a, nil
}

// ready refuses work until the gateway paired the node.
func (a *Agent) ready() error {
	if st := a.Pairing(); st == PairingPending || st == PairingRejected {
		return protocol.Errorf(protocol.ErrDenied, "node %s is not paired with the gateway (pairing %s); approve it with `execmesh nodes approve %s`", a.id.NodeID, st, a.id.NodeID)
	}
	return nil
}

// Host returns the agent's host pipeline (tests and `execmesh up` use it).
func (a *Agent) Host() *host.Local { return a.host }

// ID returns the node id, derived from the node's public key.
func (a *Agent) ID() string { return a.id.NodeID }

// PublicKey returns the node's nkey user public key.
func (a *Agent) PublicKey() string { return a.id.PublicKey }

// Name returns the display name.
func (a *Agent) Name() string { return a.name }

// Instance returns the id of this run of the agent; it changes on every
// start, and a gateway that sees it change knows the node lost its
// sessions.
func (a *Agent) Instance() string { return a.instance }

// Pairing returns the pairing status the gateway last reported
// (PairingPending, PairingPaired, PairingRejected), or "" before any
// answer.
func (a *Agent) Pairing() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pairing
}

// Conn returns the agent's NATS connection, nil before Start.
func (a *Agent) Conn() *nats.Conn {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.nc
}

// Ready waits until the agent is connected and the server has registered
// its endpoints, so that requests sent from now on find it. The agent
// works without it (it connects in the background); it is for callers that
// send work right after Start, such as `execmesh up` and tests.
func (a *Agent) Ready(ctx context.Context) error {
	nc := a.Conn()
	if nc == nil {
		return errors.New("nodeagent: not started")
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if nc.IsConnected() {
			if err := nc.FlushWithContext(ctx); err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nodeagent: not ready: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// Run starts the agent, serves until ctx ends, then closes it within
// closeTimeout (on a fresh context: ctx is already done by then).
func (a *Agent) Run(ctx context.Context, closeTimeout time.Duration) error {
	if err := a.Start(ctx); err != nil {
		cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		return errors.Join(err, a.Close(cctx))
	}
	var stopErr error
	select {
	case <-ctx.Done():
	case <-a.rejected:
		stopErr = ErrRejected
	}
	a.log.Info("node agent stopping")
	cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	return errors.Join(stopErr, a.Close(cctx))
}

// Start redeems the join code if one is configured, connects to NATS (it
// keeps retrying in the background when no server answers yet: a node
// may start before its gateway), registers the micro service and starts
// the heartbeats. ctx bounds the join only.
func (a *Agent) Start(ctx context.Context) error {
	if err := a.begin(false); err != nil {
		return err
	}

	cc := a.cfg.Client
	if a.cfg.Join != "" {
		code, err := DecodeJoinCode(a.cfg.Join)
		if err != nil {
			return err
		}
		if a.cfg.Name == "" && code.Name != "" {
			a.name = code.Name // the name chosen at `execmesh nodes invite --name`
		}
		jctx, cancel := context.WithTimeout(ctx, a.cfg.JoinTimeout)
		res, err := a.join(jctx, code)
		cancel()
		if err != nil {
			return err
		}
		a.log.Info("joined by code: paired with the gateway", "status", res.Status, "urls", code.URLs)
		if err := a.keys.add(code.GatewayKeys...); err != nil {
			a.log.Warn("could not save the gateway keys of the join code", "err", err)
		}
		a.setPairing(res.Status)
		if len(cc.URLs) == 0 && cc.InProcess == nil {
			cc.URLs = code.URLs
		}
		if code.Prefix != a.cfg.Prefix {
			a.cfg.Prefix = code.Prefix
			a.subj = protocol.Subjects(code.Prefix)
		}
		if err := saveJoin(a.cfg.StateDir, savedJoin{URLs: code.URLs, Prefix: code.Prefix, NodeID: a.id.NodeID, Name: code.Name, JoinedAt: time.Now().UnixMilli()}); err != nil {
			a.log.Warn("could not save the join settings; pass --nats-url next time", "err", err)
		}
	} else if len(cc.URLs) == 0 && cc.InProcess == nil {
		saved, err := loadJoin(a.cfg.StateDir)
		if err != nil {
			return err
		}
		if saved == nil {
			return ErrNoServer
		}
		cc.URLs = saved.URLs
		if a.cfg.Name == "" && saved.Name != "" {
			a.name = saved.Name
		}
		if saved.Prefix != "" && a.cfg.Prefix == protocol.DefaultSubjectPrefix {
			a.cfg.Prefix = saved.Prefix
			a.subj = protocol.Subjects(saved.Prefix)
		}
	}
	if !hasCredentials(cc) {
		cc.NKeySeed = a.id.Seed
	}
	cc.InboxPrefix = bus.InboxPrefix(a.id.NodeID)
	if cc.AuthHint == "" {
		cc.AuthHint = "the server does not know this node's credentials: for a gateway with the embedded NATS server (execmesh up or execmesh gateway), run `execmesh nodes invite` there and start this node with --join <code>; for an external NATS, give it --creds or --nkey-seed of a user in the servers' configuration (deploy/README.md)"
	}
	cc.OnAuthRefused = a.onAuthRefused
	if cc.Name == "" {
		cc.Name = "execmesh-node " + a.name
	}
	// Async: keep trying in the background; subscriptions made meanwhile
	// are sent when the connection comes up.
	cc.Async = true
	nc, err := bus.Connect(ctx, cc, a.log)
	if err != nil {
		return fmt.Errorf("nodeagent: connect: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return fmt.Errorf("nodeagent: jetstream: %w", err)
	}
	a.mu.Lock()
	a.nc, a.js = nc, js
	a.mu.Unlock()
	svc, err := a.addService(nc)
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.svc = svc
	a.mu.Unlock()

	lctx, cancel := context.WithCancel(context.Background())
	a.loopCancel = cancel
	a.loopWG.Add(1)
	go func() {
		defer a.loopWG.Done()
		a.presenceLoop(lctx)
	}()
	a.log.Info("node agent started", "name", a.name, "platform", a.platform, "group", a.subj.NodeGroup(a.id.NodeID),
		"publicKey", a.id.PublicKey, "client", cc)
	// What a crashed earlier run left was ended when the session core
	// started; each session's agent hears of it through the durable exit
	// stream, as of an exit.
	a.reportLost()
	return nil
}

// begin marks the agent started (local: without NATS), once.
func (a *Agent) begin(local bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closing {
		return ErrClosed
	}
	if a.started {
		return errors.New("nodeagent: already started")
	}
	a.started, a.local = true, local
	return nil
}

// reportLost tells what a crashed earlier run left, as exits.
func (a *Agent) reportLost() {
	for _, l := range a.lost {
		a.log.Warn("session lost by an earlier run", "sessionId", l.SessionID, "sessionKey", l.SessionKey,
			"command", l.Command, "startedAt", l.StartedAt, "ended", l.Ended, "reason", l.Reason)
		a.onExit(protocol.ExitEvent{SessionID: l.SessionID, SessionKey: l.SessionKey, Command: l.Command,
			StartedAt: l.StartedAt.UnixMilli(), Lost: l.Reason})
	}
	a.lost = nil
}

func hasCredentials(cc bus.ClientConfig) bool {
	return cc.CredsFile != "" || cc.NKeySeedFile != "" || len(cc.NKeySeed) > 0 || cc.User != "" || cc.Password != "" || cc.Token != ""
}

// addService registers the micro service execmesh-node with its
// endpoints in the group <prefix>.node.<id>.
//
// The endpoints are plain subscriptions, not micro's default queue
// group: after a partition the server may hold this node's old
// connection for minutes (a blackholed TCP connection looks open from
// its side) beside the new one, and a queue group hands each request to
// one of the two at random, so half the gateway's calls and probes
// vanished into the dead one. Delivered to both, a request reaches the
// live connection; the old one's copy dies in TCP (this process closed
// that socket). One identity runs one agent: the state directory is
// locked and its nkey is the node's own.
func (a *Agent) addService(nc *nats.Conn) (micro.Service, error) {
	svc, err := micro.AddService(nc, micro.Config{
		Name:               bus.NodeServiceName,
		Version:            a.cfg.Version,
		QueueGroupDisabled: true,
		Description:        "execmesh node agent",
		Metadata: map[string]string{
			"nodeId": a.id.NodeID, "name": a.name, "platform": a.platform, "instance": a.instance,
		},
		ErrorHandler: func(_ micro.Service, e *micro.NATSError) {
			a.log.Warn("micro service error", "subject", e.Subject, "err", e.Description)
		},
		StatsHandler: a.statsHandler(nc),
	})
	if err != nil {
		return nil, fmt.Errorf("nodeagent: micro service: %w", err)
	}
	g := svc.AddGroup(a.subj.NodeGroup(a.id.NodeID))
	if err := a.srv.AddTo(nc, g); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("nodeagent: %w", err)
	}
	endpoints := []struct {
		name, subject string
		fn            hostbus.HandlerFunc
	}{
		{"approvals-get", protocol.NodeEndpointApprovalsGet, a.handleApprovalsGet},
		{"approvals-set", protocol.NodeEndpointApprovalsSet, a.handleApprovalsSet},
		{"which", protocol.NodeEndpointWhich, a.handleWhich},
		{"pairing", protocol.NodeEndpointPairing, a.handlePairing},
	}
	for _, e := range endpoints {
		if err := g.AddEndpoint(e.name, a.srv.Endpoint(e.name, e.fn), micro.WithEndpointSubject(e.subject),
			micro.WithEndpointPendingLimits(bus.PendingMsgsLimit, bus.PendingBytesLimit)); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("nodeagent: endpoint %s: %w", e.name, err)
		}
	}
	return svc, nil
}

// Close stops the agent in order: refuse new requests and stop the micro
// service, end handler waits, end every session's process tree (the
// session core), flush the exit events still being published (bounded by
// Config.ExitFlushTimeout and ctx), then drain the NATS connection. It is
// idempotent.
func (a *Agent) Close(ctx context.Context) error {
	a.closeOnce.Do(func() {
		var errs *multierror.Error
		a.mu.Lock()
		a.closing = true
		svc, nc := a.svc, a.nc
		a.mu.Unlock()
		if a.loopCancel != nil {
			a.loopCancel()
		}
		if svc != nil {
			if err := svc.Stop(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
				errs = multierror.Append(errs, fmt.Errorf("stop micro service: %w", err))
			}
		}
		a.loopWG.Wait()
		if err := a.srv.Close(ctx); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("handlers: %w", err))
		}
		if err := a.host.Close(ctx); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("session core: %w", err))
		}
		// Exit events of sessions that ended during the close are
		// published now; after the flush time whatever is left is given up.
		fctx, cancel := context.WithTimeout(ctx, a.cfg.ExitFlushTimeout)
		if err := waitGroup(fctx, &a.pubWG); err != nil {
			a.log.Warn("exit events not flushed before shutdown", "err", err)
		}
		cancel()
		a.mu.Lock()
		a.pubClosed = true
		a.mu.Unlock()
		a.cancelPub()
		a.pubWG.Wait()
		if nc != nil {
			if err := drainConn(ctx, nc); err != nil {
				errs = multierror.Append(errs, err)
			}
		}
		a.closeErr = errs.ErrorOrNil()
		a.log.Info("node agent stopped")
	})
	return a.closeErr
}

// waitGroup waits for wg until ctx ends.
func waitGroup(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drainConn drains nc and waits until it is closed, bounded by ctx (a
// connection that is down cannot drain; it is closed instead).
func drainConn(ctx context.Context, nc *nats.Conn) error {
	if nc.IsClosed() {
		return nil
	}
	if !nc.IsConnected() {
		nc.Close()
		return nil
	}
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := nc.Drain(); err != nil {
		nc.Close()
		return nil
	}
	select {
	case <-closed:
		return nil
	case <-ctx.Done():
		nc.Close()
		return fmt.Errorf("drain nats connection: %w", ctx.Err())
	}
}

// onExit publishes a session's exit event to JetStream, retrying until
// the stream acknowledges it (the message id makes retries harmless), the
// connection permitting. It runs in the session core's goroutine and
// hands the work to a tracked one.
func (a *Agent) onExit(ev protocol.ExitEvent) {
	ev.NodeID = a.id.NodeID
	if a.cfg.OnExit != nil {
		a.cfg.OnExit(ev)
	}
	a.mu.Lock()
	if a.local {
		// No exit stream to keep the record for: the event was told.
		a.mu.Unlock()
		a.mgr.ExitStored(ev.SessionID)
		return
	}
	if a.pubClosed || a.js == nil {
		a.mu.Unlock()
		a.log.Warn("exit event dropped: agent closed", "sessionId", ev.SessionID)
		return
	}
	js := a.js
	a.pubWG.Add(1)
	a.mu.Unlock()
	go func() {
		defer a.pubWG.Done()
		ack, err := bus.PublishExitEventNotify(a.pubCtx, js, a.cfg.Prefix, ev, func(attempt int, err error) {
			// Said once and then now and then: the exit stream may be
			// lost (a wiped JetStream store) until a gateway creates it
			// again, or JetStream may be down.
			if attempt == 1 || attempt%20 == 0 {
				a.log.Warn("exit event not stored by JetStream yet; retrying until it is", "sessionId", ev.SessionID, "attempt", attempt, "err", err)
			}
		})
		if err != nil {
			a.log.Warn("exit event not published", "sessionId", ev.SessionID, "err", err)
			return
		}
		a.counters.exitEventPublished(ack)
		a.mgr.ExitStored(ev.SessionID)
		a.log.Debug("exit event published", "sessionId", ev.SessionID, "seq", ack.Sequence, "duplicate", ack.Duplicate)
	}()
}

func (a *Agent) setPairing(status string) { a.setPairingSince(^uint64(0), status) }

// setPairingSince sets the pairing status from an announcement's answer
// unless a notice came after the announcement was sent (notices counted
// notices then; ^0 sets it anyway): the notice is newer than the answer.
func (a *Agent) setPairingSince(notices uint64, status string) {
	a.mu.Lock()
	if notices != ^uint64(0) && a.notices != notices {
		a.mu.Unlock()
		a.log.Debug("pairing answer older than the gateway's notice ignored", "status", status)
		return
	}
	old := a.pairing
	a.pairing = status
	a.mu.Unlock()
	if old == status {
		return
	}
	switch status {
	case PairingPaired:
		a.log.Info("pairing: paired with the gateway")
	case PairingPending:
		a.log.Warn("pairing: pending; approve this node on the gateway", "approve", "execmesh nodes approve "+a.id.NodeID)
	case PairingRejected:
		a.log.Error("pairing: rejected by the gateway; this node gets no work and stops")
		a.markRejected()
	}
}

// markRejected records that the node is rejected (once).
func (a *Agent) markRejected() {
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.rejected:
	default:
		close(a.rejected)
	}
}

// onAuthRefused counts a (re)connection the server refused for the
// node's credentials. A node that was accepted before and is refused
// again and again had its key removed: it was rejected while it could
// not hear so.
func (a *Agent) onAuthRefused(error) {
	a.mu.Lock()
	known := a.pairing == PairingPaired || a.pairing == PairingRejected
	a.refusals++
	n := a.refusals
	a.mu.Unlock()
	if known && n == authRefusalsToStop {
		a.log.Error("the NATS server no longer accepts this node's key: it was rejected (or removed from the servers' users); stopping")
		a.markRejected()
	}
}

// Rejected is closed once the gateway rejected the node.
func (a *Agent) Rejected() <-chan struct{} { return a.rejected }

// presenceLoop publishes heartbeats every interval, and announces the
// node (a pairing request) when the connection comes up or comes back
// and, while the node is not paired, with every heartbeat. It sleeps
// between heartbeats: the connection's status events wake it (an idle
// agent wakes once per interval, not ten times a second), and every
// heartbeat looks at the connection too, in case an event was dropped.
func (a *Agent) presenceLoop(ctx context.Context) {
	hb := time.NewTicker(a.cfg.HeartbeatInterval)
	defer hb.Stop()
	nc := a.Conn()
	status := nc.StatusChanged(nats.CONNECTED, nats.RECONNECTING, nats.DISCONNECTED, nats.CLOSED)
	defer nc.RemoveStatusListener(status)
	var lastReconnects uint64
	wasConnected := false
	for {
		connected := nc.IsConnected()
		reconnects := nc.Stats().Reconnects
		if connected && (!wasConnected || reconnects != lastReconnects) {
			a.beat(nc)
			a.announce(ctx, nc)
		}
		wasConnected, lastReconnects = connected, reconnects
		select {
		case <-ctx.Done():
			return
		case <-hb.C:
			if nc.IsConnected() && nc.Stats().Reconnects == lastReconnects {
				a.mu.Lock()
				a.refusals = 0
				a.mu.Unlock()
				a.beat(nc)
				if a.Pairing() != PairingPaired {
					a.announce(ctx, nc)
				}
			}
		case _, ok := <-status:
			if !ok {
				status = nil // closed: heartbeats alone look at the connection
			}
		}
	}
}

// beat publishes one heartbeat.
func (a *Agent) beat(nc *nats.Conn) {
	now := time.Now()
	hb := Heartbeat{
		NodeID: a.id.NodeID, PublicKey: a.id.PublicKey, Name: a.name, Platform: a.platform,
		Hostname: a.hostname, Version: a.cfg.Version, Instance: a.instance,
		StartedAt: a.startedAt.UnixMilli(), Sessions: a.sessionCount(),
		Server: bus.ConnectedServer(nc), IntervalMs: a.cfg.HeartbeatInterval.Milliseconds(), TS: now.UnixMilli(),
		Containment: a.mgr.Containment().Mode,
		Confinement: a.host.Confinement().Mode, ConfinementReason: a.host.Confinement().Reason,
	}
	b, err := json.Marshal(hb)
	if err != nil {
		return
	}
	if err := nc.Publish(a.subj.PresenceOf(a.id.NodeID), b); err != nil {
		a.log.Debug("heartbeat not sent", "err", err)
	}
}

// announce asks the gateway for the node's pairing status.
func (a *Agent) announce(ctx context.Context, nc *nats.Conn) {
	req := PairRequest{
		Type: PairAnnounce, NodeID: a.id.NodeID, PublicKey: a.id.PublicKey, Name: a.name,
		Platform: a.platform, Version: a.cfg.Version, Instance: a.instance,
	}
	b, _ := json.Marshal(req)
	a.mu.Lock()
	notices := a.notices
	a.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, announceTimeout)
	defer cancel()
	m, err := bus.RequestChunked(rctx, nc, a.subj.PairRequest, b, nil)
	if err != nil {
		// No gateway yet: the next heartbeat asks again.
		a.log.Debug("pairing request unanswered", "err", err)
		return
	}
	var resp PairResponse
	if err := json.Unmarshal(m.Data, &resp); err != nil || resp.Status == "" {
		a.log.Warn("malformed pairing answer", "err", err)
		return
	}
	if resp.Error != nil {
		a.log.Warn("pairing request refused", "err", resp.Error.Message)
		return
	}
	a.setPairingSince(notices, resp.Status)
}

// sessionCount is the number of sessions the session core holds.
func (a *Agent) sessionCount() int { return a.mgr.Len() }
