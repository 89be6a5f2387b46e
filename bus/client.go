package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Pending limits for subscriptions. nats.go's defaults (512k messages,
// 64 MB) drop messages of a chatty stream as "slow consumer" once the
// handler falls behind; execmesh subscriptions carry whole command outputs
// and must not lose parts. Every subscription bus creates gets these;
// other packages should call SetPendingLimits on theirs.
const (
	PendingMsgsLimit  = 1 << 20   // messages
	PendingBytesLimit = 512 << 20 // bytes
)

// Reconnect back-off: exponential from reconnectBase, capped at
// reconnectMax, plus up to reconnectJitter of random delay so a fleet of
// nodes does not reconnect in lock step after a server restart. A client
// learns that a link healed only by trying it, so the longest pause
// (2 s) plus one dial that waits out a lost SYN (nats.go's 2 s connect
// timeout) is what keeps a node reachable within 5 s of any heal
// (DESIGN §5). Refused dials to a server that is down cost it nothing.
const (
	reconnectBase   = 100 * time.Millisecond
	reconnectMax    = 1500 * time.Millisecond
	reconnectJitter = 500 * time.Millisecond
)

// Client pings: every networkPingInterval over the network, so that a
// link that stopped delivering is given up within three intervals
// (nats.go allows two pings unanswered) and a new connection made. That
// matters even after the link heals: the server's retransmissions on the
// old connection have backed off by then to tens of seconds, while a new
// connection is served at once. Every inProcessPingInterval in the same
// process, where nothing can go stale.
const (
	networkPingInterval   = 5 * time.Second
	inProcessPingInterval = 2 * time.Minute
)

// ErrNotConnected is returned by Connect when ctx ends before the first
// connection succeeded. The last connection error is wrapped too.
var ErrNotConnected = errors.New("bus: not connected")

// ClientConfig says where and how a client connects. Set at most one of
// CredsFile, NKeySeedFile, NKeySeed (optionally with UserJWT),
// User/Password and Token.
type ClientConfig struct {
	// URLs of the servers; any may be a comma-separated list. Ignored
	// when InProcess is set.
	URLs []string
	// Name is the connection name shown by the server's monitoring.
	Name string
	// CredsFile is a NATS .creds file (JWT plus seed), for external
	// servers run with NATS's account tooling.
	CredsFile string
	// NKeySeedFile names a file holding an nkey user seed.
	NKeySeedFile string
	// NKeySeed is an nkey user seed ("SU…"), e.g. Identity.Seed. With
	// UserJWT it signs for that JWT instead of a bare nkey.
	NKeySeed []byte
	UserJWT  string
	// User and Password, or Token, for plain authentication.
	User     string
	Password string
	Token    string
	// TLSCAFile verifies the server; TLSCertFile and TLSKeyFile present a
	// client certificate.
	TLSCAFile   string
	TLSCertFile string
	TLSKeyFile  string
	// InboxPrefix replaces "_INBOX" for replies to this connection's
	// requests. Node agents must use NodeInboxPrefix(id): their
	// permissions only let them subscribe under it.
	InboxPrefix string
	// InProcess connects to an embedded server in the same process,
	// without TCP.
	InProcess *Server
	// Async makes Connect return at once with a connection that keeps
	// trying in the background, instead of waiting for the first
	// connection.
	Async bool
	// AuthHint, when set, is logged with a connection attempt the server
	// refused for its credentials: what to do about it (a node: join
	// with a code).
	AuthHint string
	// OnAuthRefused, when set, is called with each (re)connection attempt
	// the server refused for the credentials.
	OnAuthRefused func(error)
	// ErrorHandler, when set, is called after bus logs an asynchronous
	// error (permissions violation, slow consumer, …).
	ErrorHandler nats.ErrHandler
	// Options are applied after bus's own. Replacing a handler set by bus
	// removes its logging; replacing the ConnectHandler also keeps a
	// non-Async Connect from noticing a delayed first connection.
	Options []nats.Option
}

// LogValue keeps secrets out of logs.
func (c ClientConfig) LogValue() slog.Value {
	auth := "none"
	switch {
	case c.CredsFile != "":
		auth = "creds"
	case c.NKeySeedFile != "" || len(c.NKeySeed) > 0:
		auth = "nkey"
	case c.User != "":
		auth = "user"
	case c.Token != "":
		auth = "token"
	}
	return slog.GroupValue(
		slog.String("urls", redactURLs(strings.Join(c.URLs, ","))),
		slog.String("name", c.Name),
		slog.String("auth", auth),
		slog.Bool("tls", c.TLSCAFile != "" || c.TLSCertFile != ""),
		slog.Bool("inProcess", c.InProcess != nil),
	)
}

// Connect connects to NATS with daemon settings: reconnect forever
// (MaxReconnects(-1)), retry a failed first connect, exponential back-off
// capped at 5 s with jitter, keep retrying after authentication errors
// (credentials may be added later, e.g. while a node is being paired), and
// log connection events to logger (nil discards them).
//
// A failed attempt is logged at warn level when its reason changes, and
// at most every 30 s otherwise. When nats.go's reason is misleading
// ("nkeys not supported by the server", given before the TLS handshake),
// the server certificates are checked and a verification failure is
// logged instead, with the server's URL (see tlsChecker).
//
// Unless cfg.Async is set, Connect waits for the first connection until
// ctx ends, logging "waiting for NATS" with the servers and the last
// error at warn level after waitLogAfter and then every 30 s; it then
// closes the connection and returns an error wrapping ErrNotConnected,
// ctx.Err() and the last connection error.
func Connect(ctx context.Context, cfg ClientConfig, logger *slog.Logger) (*nats.Conn, error) {
	log := discardLogger(logger)
	url, opts, err := clientOptions(cfg, log)
	if err != nil {
		return nil, err
	}
	var st connState
	st.connected = make(chan struct{})
	tlsCheck := newTLSChecker(cfg, url)
	// attemptFailed sees every failed connection attempt (see
	// watchAttempts). Refused credentials and bad certificates must reach
	// an operator at the default level, but a server that is simply down
	// would flood the log on every retry: warn when the reason changes,
	// and at most every connectWarnEvery otherwise.
	attemptFailed := func(err error) {
		if cfg.OnAuthRefused != nil && isAuthorizationError(err) {
			cfg.OnAuthRefused(err)
		}
		err = tlsCheck.explain(err, time.Now())
		if st.noteFailure(err, time.Now()) {
			attrs := []any{"err", err}
			if cfg.AuthHint != "" && isAuthorizationError(err) {
				attrs = append(attrs, "hint", cfg.AuthHint)
			}
			log.Warn("nats connect attempt failed; retrying", attrs...)
		} else {
			log.Debug("nats connect attempt failed", "err", err)
		}
	}
	opts = append(opts,
		nats.ConnectHandler(func(nc *nats.Conn) {
			log.Info("nats connected", "server", ConnectedServer(nc))
			st.markConnected()
		}),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			} else {
				log.Info("nats disconnected")
			}
			st.watch(nc, attemptFailed)
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { attemptFailed(err) }),
		nats.ErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
			st.setErr(err)
			attrs := []any{"err", err}
			if sub != nil {
				attrs = append(attrs, "subject", sub.Subject)
			}
			if sub == nil && !nc.IsConnected() {
				// A refusal while reconnecting (nats.go reports
				// authorization errors here): one more failed attempt.
				attemptFailed(err)
			} else {
				log.Warn("nats async error", attrs...)
			}
			if cfg.ErrorHandler != nil {
				cfg.ErrorHandler(nc, sub, err)
			}
		}),
	)
	opts = append(opts, cfg.Options...)

	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("bus: connect %s: %w", url, err)
	}
	if !nc.IsConnected() {
		st.watch(nc, attemptFailed)
	}
	if cfg.Async || nc.IsConnected() {
		return nc, nil
	}
	// Whoever waits here (a daemon before it serves) is doing nothing
	// else: say so, and why.
	start := time.Now()
	waitLog := time.NewTimer(waitLogAfter)
	defer waitLog.Stop()
	for {
		select {
		case <-st.connected:
			return nc, nil
		case <-ctx.Done():
			nc.Close()
			if last := st.err(); last != nil {
				return nil, fmt.Errorf("%w to %s: %w: %w", ErrNotConnected, redactURLs(url), ctx.Err(), last)
			}
			return nil, fmt.Errorf("%w to %s: %w", ErrNotConnected, redactURLs(url), ctx.Err())
		case <-waitLog.C:
			attrs := []any{"urls", redactURLs(url), "waited", time.Since(start).Round(time.Second)}
			if last := st.err(); last != nil {
				attrs = append(attrs, "err", last)
			}
			log.Warn("waiting for NATS", attrs...)
			waitLog.Reset(connectWarnEvery)
		}
	}
}

// waitLogAfter is how long a blocking Connect waits before it logs
// "waiting for NATS" the first time.
const waitLogAfter = 3 * time.Second

// connState is shared with the nats callbacks, which run on the
// connection's dispatcher goroutine, and with watchAttempts.
type connState struct {
	connected chan struct{}
	once      sync.Once
	mu        sync.Mutex
	last      error
	warned    string    // reason of the last warning
	warnedAt  time.Time // when it was logged
	watching  bool      // a watchAttempts goroutine runs
}

// attemptPoll is how often watchAttempts looks at a connection that is
// not connected.
const attemptPoll = 200 * time.Millisecond

// watch starts watchAttempts for nc unless one runs already.
func (s *connState) watch(nc *nats.Conn, failed func(error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watching {
		return
	}
	s.watching = true
	go s.watchAttempts(nc, failed)
}

// watchAttempts passes to failed the error of every failed connection
// attempt that nats.go reports to no handler, until nc is connected or
// closed. nats.go calls the ReconnectErrHandler only for the first
// connect and for failed dials; an attempt that reached a server and
// failed there (a certificate that does not verify, refused credentials
// before the first connection, "nkeys not supported") only sets
// nc.LastError, and nc.Stats().Reconnects counts the attempts that got
// that far.
func (s *connState) watchAttempts(nc *nats.Conn, failed func(error)) {
	t := time.NewTicker(attemptPoll)
	defer t.Stop()
	seen := nc.Stats().Reconnects
	for range t.C {
		// Decided under s.mu, so that a disconnect that watch is told
		// about meanwhile either finds this goroutine still watching
		// or starts a new one.
		s.mu.Lock()
		if st := nc.Status(); st == nats.CONNECTED || st == nats.CLOSED {
			s.watching = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		n, err := nc.Stats().Reconnects, nc.LastError()
		if n != seen && err != nil {
			seen = n
			failed(err)
		}
	}
}

// connectWarnEvery bounds how often the same connection failure is logged
// at warn level.
const connectWarnEvery = 30 * time.Second

// noteFailure records a failed connection attempt and reports whether it
// deserves a warning.
func (s *connState) noteFailure(err error, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = err
	if reason := failureReason(err); reason != s.warned || now.Sub(s.warnedAt) >= connectWarnEvery {
		s.warned, s.warnedAt = reason, now
		return true
	}
	return false
}

func (s *connState) markConnected() { s.once.Do(func() { close(s.connected) }) }

func (s *connState) setErr(err error) {
	s.mu.Lock()
	s.last = err
	s.mu.Unlock()
}

func (s *connState) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// clientOptions turns cfg into a server URL list and nats options, without
// the handlers Connect adds.
func clientOptions(cfg ClientConfig, log *slog.Logger) (string, []nats.Option, error) {
	var url string
	if cfg.InProcess == nil {
		var parts []string
		for _, u := range cfg.URLs {
			for p := range strings.SplitSeq(u, ",") {
				if p = strings.TrimSpace(p); p != "" {
					parts = append(parts, p)
				}
			}
		}
		if len(parts) == 0 {
			return "", nil, errors.New("bus: no NATS server URL")
		}
		url = strings.Join(parts, ",")
	}
	methods := 0
	for _, set := range []bool{
		cfg.CredsFile != "", cfg.NKeySeedFile != "", len(cfg.NKeySeed) > 0,
		cfg.User != "" || cfg.Password != "", cfg.Token != "",
	} {
		if set {
			methods++
		}
	}
	if methods > 1 {
		return "", nil, errors.New("bus: set only one of creds file, nkey seed file, nkey seed, user/password, token")
	}
	if cfg.UserJWT != "" && len(cfg.NKeySeed) == 0 {
		return "", nil, errors.New("bus: UserJWT needs NKeySeed")
	}

	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.IgnoreAuthErrorAbort(),
		nats.CustomReconnectDelay(reconnectDelay),
		nats.PingInterval(networkPingInterval),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "server", ConnectedServer(nc))
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			if err := nc.LastError(); err != nil {
				log.Info("nats connection closed", "err", err)
			} else {
				log.Info("nats connection closed")
			}
		}),
		nats.LameDuckModeHandler(func(nc *nats.Conn) {
			log.Warn("nats server entering lame duck mode", "server", ConnectedServer(nc))
		}),
		nats.DiscoveredServersHandler(func(nc *nats.Conn) {
			log.Debug("nats servers discovered", "servers", nc.DiscoveredServers())
		}),
	}
	if cfg.InProcess != nil {
		// Nothing can go stale between a client and a server in one
		// process: frequent client pings would only wake an idle daemon
		// (the gateway's ServerWatch still checks that the server
		// answers).
		opts = append(opts, nats.InProcessServer(cfg.InProcess), nats.PingInterval(inProcessPingInterval))
	}
	if cfg.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(cfg.InboxPrefix))
	}
	switch {
	case cfg.CredsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	case cfg.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(cfg.NKeySeedFile)
		if err != nil {
			return "", nil, fmt.Errorf("bus: nkey seed file: %w", err)
		}
		opts = append(opts, o)
	case len(cfg.NKeySeed) > 0:
		o, err := seedOption(cfg.NKeySeed, cfg.UserJWT)
		if err != nil {
			return "", nil, err
		}
		opts = append(opts, o)
	case cfg.User != "" || cfg.Password != "":
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	case cfg.Token != "":
		opts = append(opts, nats.Token(cfg.Token))
	}
	if cfg.TLSCAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.TLSCAFile))
	}
	if cfg.TLSCertFile != "" || cfg.TLSKeyFile != "" {
		opts = append(opts, nats.ClientCert(cfg.TLSCertFile, cfg.TLSKeyFile))
	}
	return url, opts, nil
}

// seedOption signs the server's nonce with an in-memory seed. The key pair
// is rebuilt for every signature so the decoded private key does not live
// on in memory between connects.
func seedOption(seed []byte, userJWT string) (nats.Option, error) {
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("bus: nkey seed: %w", err)
	}
	pub, err := kp.PublicKey()
	kp.Wipe()
	if err != nil {
		return nil, fmt.Errorf("bus: nkey seed: %w", err)
	}
	if !nkeys.IsValidPublicUserKey(pub) {
		return nil, errors.New("bus: nkey seed is not a user seed")
	}
	seed = append([]byte(nil), seed...)
	sign := func(nonce []byte) ([]byte, error) {
		kp, err := nkeys.FromSeed(seed)
		if err != nil {
			return nil, err
		}
		defer kp.Wipe()
		return kp.Sign(nonce)
	}
	if userJWT != "" {
		return nats.UserJWT(func() (string, error) { return userJWT, nil }, sign), nil
	}
	return nats.Nkey(pub, sign), nil
}

// reconnectDelay is called after every server in the pool failed once.
func reconnectDelay(attempts int) time.Duration {
	d := reconnectMax
	if attempts < 16 { // avoid overflowing the shift
		d = min(reconnectBase<<max(attempts-1, 0), reconnectMax)
	}
	return d + rand.N(reconnectJitter)
}

// ConnectedServer describes the server nc is connected to, as
// "nats://host:port (server-name)" with credentials redacted ("in-process,
// embedded server on 0.0.0.0:4222 (server-name)" for an in-process
// connection), or "" when it is not connected.
func ConnectedServer(nc *nats.Conn) string {
	if nc == nil || !nc.IsConnected() {
		return ""
	}
	u := nc.ConnectedUrlRedacted()
	if s, ok := nc.Opts.InProcessServer.(*Server); ok && s != nil {
		// nats.go reports its default URL (nats://127.0.0.1:4222) for an
		// in-process connection: say which server it really is.
		u = "in-process, embedded server on " + s.ListenAddr()
	}
	if name := nc.ConnectedServerName(); name != "" {
		return u + " (" + name + ")"
	}
	return u
}

// SetPendingLimits gives sub the bus pending limits (PendingMsgsLimit,
// PendingBytesLimit).
func SetPendingLimits(sub *nats.Subscription) error {
	if err := sub.SetPendingLimits(PendingMsgsLimit, PendingBytesLimit); err != nil {
		return fmt.Errorf("bus: set pending limits on %s: %w", sub.Subject, err)
	}
	return nil
}
