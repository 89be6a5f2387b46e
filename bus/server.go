package bus

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// DefaultListen is the embedded server's default client address (DESIGN §2,
// --nats-listen).
const DefaultListen = "127.0.0.1:4222"

// defaultReadyTimeout bounds the wait for readiness when StartServer's ctx
// has no deadline: a server that cannot start must not hang the daemon.
const defaultReadyTimeout = 30 * time.Second

// Errors returned by StartServer and the user management methods.
var (
	// ErrAuthRequired: the server would accept unauthenticated clients
	// (or routes) on a non-loopback address.
	ErrAuthRequired = errors.New("bus: authentication required when listening beyond loopback")
	// ErrAuthModeChange: a user reload would switch authentication on or
	// off. The mode is fixed when the server starts, because switching it
	// live either locks out connected clients or opens the server.
	ErrAuthModeChange = errors.New("bus: cannot switch authentication on or off after start")
	// ErrServerClosed: the server has been shut down.
	ErrServerClosed = errors.New("bus: server closed")
	// ErrInvalidConfig wraps every configuration problem StartServer finds.
	ErrInvalidConfig = errors.New("bus: invalid server config")
)

// ClusterConfig makes the embedded server one member of a NATS cluster.
type ClusterConfig struct {
	// Name is the cluster name; every member uses the same.
	Name string
	// Listen is the route address, host:port; port -1 picks a free port.
	Listen string
	// Routes are the other members' route URLs (nats-route://host:port or
	// host:port). Listing the server itself is harmless.
	Routes []string
	// Username and Password authenticate routes. Required when Listen is
	// beyond loopback; they are added to route URLs that carry none.
	Username string
	Password string
}

// User is a user/password identity on the embedded server.
type User struct {
	Name     string
	Password string
	// PasswordSHA256, instead of Password, is the hex SHA-256 of the
	// password: for high-entropy secrets a gateway shares with other
	// gateways without sharing the secret (join codes' one-time users).
	PasswordSHA256 string
	// Permissions confines the user; nil allows everything (the gateway).
	Permissions *server.Permissions
}

// LogValue keeps the password out of logs.
func (u User) LogValue() slog.Value {
	return slog.GroupValue(slog.String("name", u.Name), slog.Bool("restricted", u.Permissions != nil))
}

// NKeyUser is an nkey identity on the embedded server: clients prove they
// hold the seed of PublicKey by signing the server's nonce.
type NKeyUser struct {
	// PublicKey is the user public key ("U…").
	PublicKey string
	// Permissions confines the user; nil allows everything. Node agents
	// get NodePermissions.
	Permissions *server.Permissions
}

// ServerConfig configures the embedded NATS server. Start from
// DefaultServerConfig: the zero value has JetStream off.
type ServerConfig struct {
	// Listen is the client address, host:port. Empty means DefaultListen;
	// port -1 picks a free port (tests). Port 0 is refused: nats-server
	// would read it as 4222.
	Listen string
	// DontListen starts the server without a TCP listener; only
	// in-process clients (ClientConfig.InProcess) can connect.
	DontListen bool
	// StoreDir holds JetStream's files, normally <state-dir>/nats.
	// Required when JetStream is on.
	StoreDir string
	// JetStream enables JetStream (exit events, KV buckets).
	JetStream bool
	// ServerName names the server in logs and in a cluster (required
	// with Cluster and JetStream). Empty: nats-server uses its public key.
	ServerName string
	// Cluster joins a NATS cluster; nil runs stand-alone.
	Cluster *ClusterConfig
	// Users and NKeys are the identities the server accepts. With none the
	// server accepts anonymous clients, which StartServer allows on
	// loopback only. Both lists can be replaced later with ReloadUsers.
	Users []User
	NKeys []NKeyUser
	// TLSCertFile and TLSKeyFile enable TLS on the client listener.
	// TLSCAFile with TLSVerify requires client certificates signed by it.
	TLSCertFile string
	TLSKeyFile  string
	TLSCAFile   string
	TLSVerify   bool
	// MaxPayload is the largest message the server accepts; 0 means the
	// NATS default of 1 MB. bus chunks replies below it (ChunkSize).
	MaxPayload int
	// Logger receives the server's log; nil discards it.
	Logger *slog.Logger
}

// DefaultServerConfig returns the configuration `execmesh up` and
// `execmesh gateway` start from: loopback client address, JetStream on,
// its store under <stateDir>/nats.
func DefaultServerConfig(stateDir string) ServerConfig {
	return ServerConfig{
		Listen:    DefaultListen,
		StoreDir:  filepath.Join(stateDir, "nats"),
		JetStream: true,
	}
}

// Server is a running embedded nats-server.
type Server struct {
	ns        *server.Server
	cfg       ServerConfig // validated; Users and NKeys are not read after start
	log       *slog.Logger
	host      string
	port      int
	tlsConfig *tls.Config
	// auth admits clients when authentication is on (nil: an open
	// server); the mode is fixed at start, see ErrAuthModeChange.
	auth *authenticator

	mu     sync.Mutex // serialises identity changes; guards users, nkeys, closed
	users  []User
	nkeys  []NKeyUser
	closed bool
}

// StartServer validates cfg, starts the server and waits until it accepts
// connections, bounded by ctx (or 30 s when ctx has no deadline). The
// server never installs signal handlers (NoSigs): the daemon decides when
// it stops, by calling Shutdown.
func StartServer(ctx context.Context, cfg ServerConfig) (*Server, error) {
	s := &Server{cfg: cfg, log: discardLogger(cfg.Logger)}
	if err := s.validate(); err != nil {
		return nil, err
	}
	if cfg.TLSCertFile != "" || cfg.TLSKeyFile != "" {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
			CertFile: cfg.TLSCertFile,
			KeyFile:  cfg.TLSKeyFile,
			CaFile:   cfg.TLSCAFile,
			Verify:   cfg.TLSVerify,
		})
		if err != nil {
			return nil, fmt.Errorf("%w: tls: %w", ErrInvalidConfig, err)
		}
		s.tlsConfig = tc
	}
	s.users = cloneUsers(cfg.Users)
	s.nkeys = cloneNKeys(cfg.NKeys)
	if len(s.users)+len(s.nkeys) > 0 {
		s.auth = &authenticator{}
		s.auth.table.Store(newAuthTable(s.users, s.nkeys))
	}

	opts, err := s.buildOptions()
	if err != nil {
		return nil, err
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	sl := newServerLogger(s.log)
	bg := context.Background()
	ns.SetLoggerV2(sl, s.log.Enabled(bg, slog.LevelDebug), s.log.Enabled(bg, LevelTrace), false)
	s.ns = ns

	// Start returns once the accept loops run; JetStream recovery happens
	// inside it. Failures are reported through Fatalf, which the adapter
	// forwards on sl.fatal.
	ns.Start()
	if err := s.waitReady(ctx, sl.fatal); err != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, err
	}
	s.log.Info("nats server ready", "url", s.ClientURL(), "name", ns.Name(), "jetstream", cfg.JetStream)
	return s, nil
}

func (s *Server) waitReady(ctx context.Context, fatal <-chan string) error {
	deadline := time.Now().Add(defaultReadyTimeout)
	if d, ok := ctx.Deadline(); ok {
		deadline = d
	}
	for {
		select {
		case msg := <-fatal:
			return fmt.Errorf("bus: start nats server: %s", msg)
		case <-ctx.Done():
			return fmt.Errorf("bus: start nats server: %w", ctx.Err())
		default:
		}
		// Short slices so a fatal error or ctx ends the wait promptly.
		if s.ns.ReadyForConnections(50 * time.Millisecond) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bus: start nats server: not ready for connections after %s", defaultReadyTimeout)
		}
	}
}

// validate checks the configuration and fills in the listen address.
func (s *Server) validate() error {
	cfg := &s.cfg
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	host, port, err := parseHostPort(cfg.Listen)
	if err != nil {
		return fmt.Errorf("%w: listen: %w", ErrInvalidConfig, err)
	}
	s.host, s.port = host, port
	if cfg.JetStream && cfg.StoreDir == "" {
		return fmt.Errorf("%w: JetStream needs a StoreDir", ErrInvalidConfig)
	}
	if cfg.MaxPayload < 0 {
		return fmt.Errorf("%w: negative MaxPayload", ErrInvalidConfig)
	}
	if err := validateUsers(cfg.Users, cfg.NKeys); err != nil {
		return err
	}
	if !cfg.DontListen && !isLoopback(host) && len(cfg.Users)+len(cfg.NKeys) == 0 {
		return fmt.Errorf("%w: client address %s", ErrAuthRequired, cfg.Listen)
	}
	if c := cfg.Cluster; c != nil {
		if c.Name == "" {
			return fmt.Errorf("%w: cluster needs a name", ErrInvalidConfig)
		}
		if cfg.JetStream && cfg.ServerName == "" {
			return fmt.Errorf("%w: a clustered JetStream server needs a ServerName", ErrInvalidConfig)
		}
		chost, _, err := parseHostPort(c.Listen)
		if err != nil {
			return fmt.Errorf("%w: cluster listen: %w", ErrInvalidConfig, err)
		}
		if !isLoopback(chost) && c.Username == "" {
			return fmt.Errorf("%w: cluster address %s needs route credentials", ErrAuthRequired, c.Listen)
		}
		if _, err := s.routeURLs(); err != nil {
			return err
		}
	}
	return nil
}

func validateUsers(users []User, nk []NKeyUser) error {
	seen := make(map[string]bool, len(users))
	for _, u := range users {
		if u.Name == "" || (u.Password == "") == (u.PasswordSHA256 == "") {
			return fmt.Errorf("%w: user needs a name and a password (or its SHA-256, not both)", ErrInvalidConfig)
		}
		if seen[u.Name] {
			return fmt.Errorf("%w: duplicate user %q", ErrInvalidConfig, u.Name)
		}
		seen[u.Name] = true
	}
	seenKey := make(map[string]bool, len(nk))
	for _, u := range nk {
		if !nkeys.IsValidPublicUserKey(u.PublicKey) {
			return fmt.Errorf("%w: %q is not an nkey user public key", ErrInvalidConfig, u.PublicKey)
		}
		if seenKey[u.PublicKey] {
			return fmt.Errorf("%w: duplicate nkey user %s", ErrInvalidConfig, u.PublicKey)
		}
		seenKey[u.PublicKey] = true
	}
	return nil
}

// parseHostPort splits host:port; port -1 is nats-server's RANDOM_PORT.
func parseHostPort(hp string) (string, int, error) {
	host, ps, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %w", ps, err)
	}
	switch {
	case port == -1:
		port = server.RANDOM_PORT
	case port == 0:
		// nats-server reads 0 as "default port", which surprises anyone
		// used to net.Listen.
		return "", 0, fmt.Errorf("port 0 in %q: use -1 for a random port", hp)
	case port < 0 || port > 65535:
		return "", 0, fmt.Errorf("port %d out of range", port)
	}
	return host, port, nil
}

// isLoopback reports whether host only accepts local connections. An empty
// host means every interface.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (s *Server) routeURLs() ([]*url.URL, error) {
	c := s.cfg.Cluster
	out := make([]*url.URL, 0, len(c.Routes))
	for _, r := range c.Routes {
		raw := r
		if u, err := url.Parse(r); err != nil || u.Scheme == "" || u.Host == "" {
			raw = "nats-route://" + r
		}
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("%w: route %q", ErrInvalidConfig, r)
		}
		if u.User == nil && c.Username != "" {
			u.User = url.UserPassword(c.Username, c.Password)
		}
		out = append(out, u)
	}
	return out, nil
}

// buildOptions returns the server options. Identities are not among them:
// s.auth admits clients, so they change without a configuration reload.
func (s *Server) buildOptions() (*server.Options, error) {
	cfg := s.cfg
	o := &server.Options{
		ServerName:             cfg.ServerName,
		Host:                   s.host,
		Port:                   s.port,
		DontListen:             cfg.DontListen,
		NoSigs:                 true,
		JetStream:              cfg.JetStream,
		StoreDir:               cfg.StoreDir,
		DisableJetStreamBanner: true,
		TLSConfig:              s.tlsConfig,
	}
	// Always send a nonce: an nkey client (a node agent uses its key
	// everywhere) then connects to an open loopback server too, gets a
	// clean authorization error rather than "nkeys not supported" where
	// its key is unknown, and s.auth can check the signature of any key.
	o.AlwaysEnableNonce = true
	if s.auth != nil {
		o.CustomClientAuthentication = s.auth
	}
	if s.tlsConfig != nil {
		o.TLS = true
		o.TLSVerify = cfg.TLSVerify
	}
	if cfg.MaxPayload > 0 {
		o.MaxPayload = int32(cfg.MaxPayload)
		// The server refuses max_payload above max_pending (64 MB).
		if int64(cfg.MaxPayload) > server.MAX_PENDING_SIZE {
			o.MaxPending = int64(cfg.MaxPayload)
		}
	}
	if c := cfg.Cluster; c != nil {
		host, port, err := parseHostPort(c.Listen)
		if err != nil {
			return nil, fmt.Errorf("%w: cluster listen: %w", ErrInvalidConfig, err)
		}
		routes, err := s.routeURLs()
		if err != nil {
			return nil, err
		}
		o.Cluster = server.ClusterOpts{
			Name:     c.Name,
			Host:     host,
			Port:     port,
			Username: c.Username,
			Password: c.Password,
		}
		o.Routes = routes
	}
	return o, nil
}

// ClientURL returns the URL other processes connect to: nats://host:port
// (tls:// with TLS), with a loopback address when the server listens on
// every interface, and "" with DontListen.
func (s *Server) ClientURL() string {
	addr, ok := s.ns.Addr().(*net.TCPAddr)
	if !ok || addr == nil {
		return ""
	}
	ip := addr.IP
	if ip.IsUnspecified() {
		// Go reports a dual-stack wildcard as [::] even for 0.0.0.0, so
		// go by the configured host.
		ip = net.IPv4(127, 0, 0, 1)
		if h := net.ParseIP(s.host); h != nil && h.To4() == nil {
			ip = net.IPv6loopback
		}
	}
	scheme := "nats"
	if s.tlsConfig != nil {
		scheme = "tls"
	}
	return scheme + "://" + net.JoinHostPort(ip.String(), strconv.Itoa(addr.Port))
}

// ListenAddr returns the address the server takes client connections on
// as configured, with the port it got: "0.0.0.0:4222" for every IPv4
// interface, "[::]:4222" for every interface, "127.0.0.1:4222" for
// loopback; "" with DontListen.
func (s *Server) ListenAddr() string {
	addr, ok := s.ns.Addr().(*net.TCPAddr)
	if !ok || addr == nil {
		return ""
	}
	host := s.host
	if host == "" {
		host = addr.IP.String()
	}
	return net.JoinHostPort(host, strconv.Itoa(addr.Port))
}

// ListensOnLoopback reports whether the server takes client connections
// on a loopback address only, where no other machine reaches it.
func (s *Server) ListensOnLoopback() bool {
	addr, ok := s.ns.Addr().(*net.TCPAddr)
	return ok && addr != nil && addr.IP.IsLoopback()
}

// InProcessConn returns a connection to the server that bypasses TCP. It
// makes *Server a nats.InProcessConnProvider, so
// nats.InProcessServer(s) (or ClientConfig.InProcess) works.
func (s *Server) InProcessConn() (net.Conn, error) {
	return s.ns.InProcessConn()
}

// NATSServer returns the underlying nats-server, for monitoring and tests.
// Do not shut it down directly; use Shutdown.
func (s *Server) NATSServer() *server.Server { return s.ns }

// Shutdown stops the server and waits until it has released its port,
// store and goroutines, or until ctx ends. It is safe to call more than
// once and from several goroutines.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()

	done := make(chan struct{})
	go func() {
		// Shutdown is idempotent in nats-server; WaitForShutdown covers
		// a concurrent caller that arrived second.
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("bus: shutdown nats server: %w", ctx.Err())
	}
}

// Users returns copies of the identities the server currently accepts.
func (s *Server) Users() ([]User, []NKeyUser) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return cloneUsers(s.users), cloneNKeys(s.nkeys)
}

// ReloadUsers replaces every identity. Clients of removed or changed
// identities are disconnected; connected clients of kept identities stay. It fails with ErrAuthModeChange when it would
// switch authentication on or off.
func (s *Server) ReloadUsers(users []User, nk []NKeyUser) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applyLocked(cloneUsers(users), cloneNKeys(nk))
}

// AddNKeyUser adds an nkey identity, or replaces the permissions of an
// existing one (its clients are then disconnected). Join-by-code uses it
// to admit a node with NodeUser.
func (s *Server) AddNKeyUser(u NKeyUser) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	nk := cloneNKeys(s.nkeys)
	replaced := false
	for i := range nk {
		if nk[i].PublicKey == u.PublicKey {
			nk[i] = cloneNKeys([]NKeyUser{u})[0]
			replaced = true
		}
	}
	if !replaced {
		nk = append(nk, cloneNKeys([]NKeyUser{u})[0])
	}
	return s.applyLocked(cloneUsers(s.users), nk)
}

// RemoveNKeyUser removes an nkey identity; its connections are closed.
// Removing an unknown key is not an error.
func (s *Server) RemoveNKeyUser(publicKey string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	nk := make([]NKeyUser, 0, len(s.nkeys))
	for _, u := range s.nkeys {
		if u.PublicKey != publicKey {
			nk = append(nk, u)
		}
	}
	if len(nk) == len(s.nkeys) {
		return nil
	}
	return s.applyLocked(cloneUsers(s.users), cloneNKeys(nk))
}

// AddUser adds a user/password identity, or replaces an existing one of
// the same name (for example the one-time user of a join code, see
// JoinPermissions).
func (s *Server) AddUser(u User) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	users := cloneUsers(s.users)
	replaced := false
	for i := range users {
		if users[i].Name == u.Name {
			users[i] = cloneUsers([]User{u})[0]
			replaced = true
		}
	}
	if !replaced {
		users = append(users, cloneUsers([]User{u})[0])
	}
	return s.applyLocked(users, cloneNKeys(s.nkeys))
}

// RemoveUser removes a user/password identity; its connections are
// closed. Removing an unknown name is not an error.
func (s *Server) RemoveUser(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	users := make([]User, 0, len(s.users))
	for _, u := range s.users {
		if u.Name != name {
			users = append(users, u)
		}
	}
	if len(users) == len(s.users) {
		return nil
	}
	return s.applyLocked(cloneUsers(users), cloneNKeys(s.nkeys))
}

// applyLocked makes users and nk the server's identities; s.mu is held.
// The new lists are the caller's fresh copies and become the server's
// state only when they are valid. Clients whose identity was removed or
// changed are disconnected, so changed permissions apply when they
// reconnect and a removed node cannot keep a connection it no longer has
// a right to.
func (s *Server) applyLocked(users []User, nk []NKeyUser) error {
	if s.closed {
		return ErrServerClosed
	}
	if err := validateUsers(users, nk); err != nil {
		return err
	}
	if on := len(users)+len(nk) > 0; on != (s.auth != nil) {
		return ErrAuthModeChange
	}
	if s.auth == nil {
		return nil // open server, nothing was and nothing is configured
	}
	next := newAuthTable(users, nk)
	// Swap first, then look for clients: one that authenticates from
	// here on sees next, and one that already sent its CONNECT is in
	// Connz under the name it gave.
	old := s.auth.table.Swap(next)
	s.users, s.nkeys = users, nk
	kicked := 0
	for _, name := range changedIdentities(old, next) {
		kicked += s.disconnectUser(name)
	}
	s.log.Info("nats identities changed", "users", len(users), "nkeys", len(nk), "disconnected", kicked)
	return nil
}

// disconnectUser closes every client connected as name (a user name or
// an nkey) and returns how many it closed.
func (s *Server) disconnectUser(name string) int {
	var cids []uint64
	for offset := 0; ; {
		cz, err := s.ns.Connz(&server.ConnzOptions{User: name, Offset: offset, Limit: connzPage})
		if err != nil {
			s.log.Warn("nats: list connections", "user", name, "err", err)
			break
		}
		for _, ci := range cz.Conns {
			cids = append(cids, ci.Cid)
		}
		offset += len(cz.Conns)
		if len(cz.Conns) < connzPage {
			break
		}
	}
	n := 0
	for _, cid := range cids {
		if s.ns.DisconnectClientByID(cid) == nil {
			n++
		}
	}
	return n
}

// connzPage is the page size of the connection listing disconnectUser
// walks.
const connzPage = 1024

func cloneUsers(in []User) []User {
	if in == nil {
		return nil
	}
	out := make([]User, len(in))
	for i, u := range in {
		u.Permissions = clonePermissions(u.Permissions)
		out[i] = u
	}
	return out
}

func cloneNKeys(in []NKeyUser) []NKeyUser {
	if in == nil {
		return nil
	}
	out := make([]NKeyUser, len(in))
	for i, u := range in {
		u.Permissions = clonePermissions(u.Permissions)
		out[i] = u
	}
	return out
}

func clonePermissions(p *server.Permissions) *server.Permissions {
	if p == nil {
		return nil
	}
	c := &server.Permissions{
		Publish:   cloneSubjectPermission(p.Publish),
		Subscribe: cloneSubjectPermission(p.Subscribe),
	}
	if p.Response != nil {
		r := *p.Response
		c.Response = &r
	}
	return c
}

func cloneSubjectPermission(p *server.SubjectPermission) *server.SubjectPermission {
	if p == nil {
		return nil
	}
	c := &server.SubjectPermission{}
	if p.Allow != nil {
		c.Allow = append([]string{}, p.Allow...)
	}
	if p.Deny != nil {
		c.Deny = append([]string{}, p.Deny...)
	}
	return c
}
