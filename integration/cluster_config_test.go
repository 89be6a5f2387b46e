package integration

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

// TestClusterShippedConfigs loads deploy/nats/cluster through
// server.ProcessConfigFile (rendered into a temporary copy: loopback
// ports, paths, the route secret, the keys `execmesh nodes credentials`
// made), starts a 3-server cluster from those options on loopback, waits
// for its routes and a JetStream meta leader, creates execmesh's stream
// and buckets with 3 replicas as the gateway does, and checks that the
// users work as documented: the gateway's broad permissions, a node
// confined to its own subjects (the permissions it wrote equal
// bus.NodePermissions).
func TestClusterShippedConfigs(t *testing.T) {
	if testing.Short() {
		t.Skip("3-server cluster")
	}
	tmp := t.TempDir()
	tlsDir := filepath.Join(tmp, "tls")
	clMakeTLS(t, tlsDir, "nats-1,127.0.0.1", "nats-2,127.0.0.1", "nats-3,127.0.0.1")
	gw := clCredentials(t, filepath.Join(tmp, "gw"), true)
	n1 := clCredentials(t, filepath.Join(tmp, "n1"), false)
	n2 := clCredentials(t, filepath.Join(tmp, "n2"), false)

	routes := clPortsBelowEphemeral(t, 3)
	site := clSite{
		Dir: tmp, TLSDir: tlsDir,
		NoClientAdvertise: true,
		RoutePassword:     randomToken(),
		GatewayNKey:       gw.PublicKey,
		NodeEntries:       []string{n1.Entry, n2.Entry},
	}
	for i := range 3 {
		site.ClientListen[i] = "127.0.0.1:-1"
		site.HTTPListen[i] = "127.0.0.1:-1"
		site.RouteListen[i] = "127.0.0.1:" + strconv.Itoa(routes[i])
		site.RouteAddr[i] = "127.0.0.1:" + strconv.Itoa(routes[i])
		site.StoreDir[i] = filepath.Join(tmp, fmt.Sprintf("js-%d", i+1))
	}
	confs := site.render(t)

	var opts [3]*server.Options
	for i, c := range confs {
		o, err := server.ProcessConfigFile(c)
		if err != nil {
			t.Fatalf("shipped nats-%d.conf does not load: %v", i+1, err)
		}
		opts[i] = o
	}
	// The official binary's own check (-t), which is pedantic about
	// unknown fields, must accept them too.
	nsBin, err := clNATSServerBinary()
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range confs {
		if out, err := exec.Command(nsBin, "-t", "-c", c).CombinedOutput(); err != nil {
			t.Fatalf("nats-server -t nats-%d.conf: %v\n%s", i+1, err, out)
		}
	}
	t.Run("Users", func(t *testing.T) { clCheckUsers(t, opts[0], gw, n1, n2) })
	t.Run("GatewayKeyPlaceholderRefused", func(t *testing.T) { clCheckPlaceholderRefused(t, site) })
	t.Run("GatewayConfig", func(t *testing.T) { clCheckGatewayConfig(t, tmp, gw, tlsDir) })
	t.Run("SystemdUnits", clCheckUnits)
	t.Run("ReadmeCoversPlaceholders", clCheckReadme)

	servers := clStartInProcess(t, opts)
	var urls []string
	for _, s := range servers {
		urls = append(urls, s.ClientURL())
	}
	for _, u := range urls {
		if !strings.HasPrefix(u, "tls://") {
			t.Fatalf("client URL %s: the shipped config must require TLS", u)
		}
	}
	clCheckFor(t, "routes and a JetStream meta leader", 30*time.Second, 50*time.Millisecond, func() error {
		leaders := 0
		for _, s := range servers {
			if n := s.NumRoutes(); n < 2 {
				return fmt.Errorf("%s has %d routes", s.Name(), n)
			}
			if !s.JetStreamIsClustered() {
				return fmt.Errorf("%s: JetStream not clustered", s.Name())
			}
			if s.JetStreamIsLeader() {
				leaders++
				// Only the meta leader answers; every peer must be online
				// with JetStream.
				if p := s.JetStreamClusterPeers(); len(p) != 3 {
					return fmt.Errorf("meta leader %s sees JetStream peers %v", s.Name(), p)
				}
			}
		}
		if leaders != 1 {
			return fmt.Errorf("%d JetStream meta leaders", leaders)
		}
		return nil
	})

	ca := filepath.Join(tlsDir, "ca.pem")
	gnc := clConnect(t, bus.ClientConfig{URLs: urls, NKeySeedFile: gw.SeedFile, TLSCAFile: ca, Name: "gateway"})
	js, err := jetstream.New(gnc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := clCtx(t, 60*time.Second)
	if err := bus.EnsureStreams(ctx, js, bus.DefaultPrefix, 3); err != nil {
		t.Fatalf("EnsureStreams with 3 replicas on the shipped cluster: %v", err)
	}
	names := bus.StreamNamesFor(bus.DefaultPrefix)
	streams := []string{names.Exit, names.Events}
	for _, b := range names.Buckets() {
		streams = append(streams, "KV_"+b)
	}
	for _, stream := range streams {
		clCheckFor(t, "stream "+stream+" replicated", 20*time.Second, 100*time.Millisecond, func() error {
			st, err := js.Stream(ctx, stream)
			if err != nil {
				return err
			}
			info := st.CachedInfo()
			if info.Config.Replicas != 3 {
				return fmt.Errorf("replicas %d", info.Config.Replicas)
			}
			if info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
				return fmt.Errorf("cluster %+v", info.Cluster)
			}
			for _, r := range info.Cluster.Replicas {
				if !r.Current {
					return fmt.Errorf("replica %s not current", r.Name)
				}
			}
			return nil
		})
	}

	t.Run("NodeConfined", func(t *testing.T) { clCheckNodeConfined(t, urls, ca, gnc, n1, n2) })
}

// clCheckUsers compares the users the servers load with what the code
// grants: the node entries of `nodes credentials` are
// bus.NodePermissions, and the shipped gateway entry is what `nodes
// credentials --gateway` makes.
func clCheckUsers(t *testing.T, o *server.Options, gw, n1, n2 clIdentity) {
	users := map[string]*server.NkeyUser{}
	for _, u := range o.Nkeys {
		users[u.Nkey] = u
	}
	if len(o.Users) != 0 || len(users) != 3 {
		t.Fatalf("want exactly 3 nkey users (gateway and two nodes), got %d users, %d nkeys", len(o.Users), len(o.Nkeys))
	}
	for _, n := range []clIdentity{n1, n2} {
		want, err := bus.NodePermissions(bus.DefaultPrefix, n.NodeID)
		if err != nil {
			t.Fatal(err)
		}
		u := users[n.PublicKey]
		if u == nil || !reflect.DeepEqual(u.Permissions, want) {
			t.Fatalf("node %s: loaded permissions %s, want bus.NodePermissions %s", n.NodeID, clPerms(u), clPermsOf(want))
		}
	}
	// The shipped gateway entry must be exactly what `nodes credentials
	// --gateway` writes (one source of truth for the gateway's grant).
	lone := filepath.Join(t.TempDir(), "lone.conf")
	if err := os.WriteFile(lone, []byte("authorization {\n users = [\n"+gw.Entry+"\n ]\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	lo, err := server.ProcessConfigFile(lone)
	if err != nil {
		t.Fatalf("gateway-user.conf does not load: %v", err)
	}
	if u := users[gw.PublicKey]; u == nil || len(lo.Nkeys) != 1 || !reflect.DeepEqual(u.Permissions, lo.Nkeys[0].Permissions) {
		t.Fatalf("shipped auth.conf gateway entry %s differs from nodes credentials --gateway %s", clPerms(users[gw.PublicKey]), clPerms(lo.Nkeys[0]))
	}
	if o.Cluster.Username != "route" || o.Cluster.Password == "" || o.Cluster.TLSConfig == nil ||
		o.Cluster.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Fatalf("cluster routes: want a route user and mutual TLS, got user %q, tls %v", o.Cluster.Username, o.Cluster.TLSConfig != nil)
	}
	if o.TLSConfig == nil || o.TLSVerify {
		t.Fatalf("client port: want TLS without client certificates (tls %v, verify %v)", o.TLSConfig != nil, o.TLSVerify)
	}
	if !o.JetStream || o.StoreDir == "" {
		t.Fatal("JetStream off or without a store dir")
	}
}

func clPerms(u *server.NkeyUser) string {
	if u == nil {
		return "<no such user>"
	}
	return clPermsOf(u.Permissions)
}

func clPermsOf(p *server.Permissions) string {
	if p == nil {
		return "<all>"
	}
	s := fmt.Sprintf("pub %+v sub %+v", p.Publish, p.Subscribe)
	if p.Response != nil {
		s += fmt.Sprintf(" resp %+v", *p.Response)
	}
	return s
}

// clCheckPlaceholderRefused: auth.conf as shipped (gateway key not set)
// must keep the server from starting, not run it open.
func clCheckPlaceholderRefused(t *testing.T, site clSite) {
	dir := t.TempDir()
	b, err := os.ReadFile(clDeployPath(t, "nats/cluster/auth.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "auth.conf"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	conf := clRender(t, "nats/cluster/nats-1.conf", filepath.Join(dir, "nats-1.conf"), 0o600,
		"REPLACE_WITH_ROUTE_PASSWORD", site.RoutePassword, "/etc/nats/tls/", site.TLSDir+"/",
		"/var/lib/nats/jetstream", filepath.Join(dir, "js"))
	_, err = server.ProcessConfigFile(conf)
	if err == nil || !strings.Contains(err.Error(), "nkey") {
		t.Fatalf("auth.conf with REPLACE_WITH_GATEWAY_NKEY loaded (err %v): a server must not start without its users", err)
	}
}

// clCheckGatewayConfig loads deploy/gateway.cluster.json with the
// gateway's own loader.
func clCheckGatewayConfig(t *testing.T, dir string, gw clIdentity, tlsDir string) {
	path := clRender(t, "gateway.cluster.json", filepath.Join(dir, "gateway.json"), 0o600,
		"REPLACE_WITH_GATEWAY_TOKEN", "t0ken",
		"/etc/execmesh/gateway.nkey", gw.SeedFile,
		"/etc/execmesh/tls/ca.pem", filepath.Join(tlsDir, "ca.pem"))
	cfg, err := config.Load(path, map[string]string{})
	if err != nil {
		t.Fatalf("deploy/gateway.cluster.json: %v", err)
	}
	if cfg.NATS.Replicas != 3 || len(strings.Split(cfg.NATS.URL, ",")) != 3 || cfg.NATS.NKeySeedFile == "" || cfg.NATS.TLSCAFile == "" || cfg.Gateway.Auth.Token == "" {
		t.Fatalf("gateway.cluster.json: %+v", cfg.NATS)
	}
}

// clCheckUnits checks the systemd units for what the deployment relies on,
// and that their stop timeouts exceed the daemons' own shutdown bounds.
func clCheckUnits(t *testing.T) {
	for _, unit := range []string{"execmesh-gateway.service", "execmesh-node.service"} {
		b, err := os.ReadFile(clDeployPath(t, "systemd/"+unit))
		if err != nil {
			t.Fatal(err)
		}
		kv := map[string]string{}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
				if _, seen := kv[k]; !seen {
					kv[k] = v
				}
			}
		}
		for k, want := range map[string]string{
			"Restart": "on-failure", "User": "execmesh", "KillMode": "control-group",
			"NoNewPrivileges": "yes", "Environment": "PATH=/usr/local/bin:/usr/bin:/bin",
		} {
			if kv[k] != want {
				t.Errorf("%s: %s=%q, want %q", unit, k, kv[k], want)
			}
		}
		for _, k := range []string{"RestartSec", "StateDirectory", "ExecStart"} {
			if kv[k] == "" {
				t.Errorf("%s: no %s=", unit, k)
			}
		}
		stop, err := time.ParseDuration(kv["TimeoutStopSec"])
		if err != nil {
			t.Fatalf("%s: TimeoutStopSec: %v", unit, err)
		}
		// The daemons' own bounds: the gateway drain + kill grace + 30 s
		// (cmd/execmesh serveDaemon), the node 30 s (nodeCloseTimeout).
		bound := 30 * time.Second
		if unit == "execmesh-gateway.service" {
			b, err := os.ReadFile(clDeployPath(t, "gateway.cluster.json"))
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := config.Decode([]byte(strings.ReplaceAll(string(b), "REPLACE_WITH_GATEWAY_TOKEN", "x")))
			if err != nil {
				t.Fatal(err)
			}
			bound += time.Duration(cfg.Gateway.DrainTimeoutMs+cfg.Tools.Exec.KillGraceMs) * time.Millisecond
		}
		if stop <= bound {
			t.Errorf("%s: TimeoutStopSec %s is not above the daemon's shutdown bound %s", unit, stop, bound)
		}
	}
}

// clCheckReadme: the walkthrough replaces every placeholder of the
// shipped files, and appends node entries with the sed command the tests
// run (clNodeEntrySed).
func clCheckReadme(t *testing.T) {
	b, err := os.ReadFile(clDeployPath(t, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"s/REPLACE_WITH_ROUTE_PASSWORD/", "s/REPLACE_WITH_GATEWAY_NKEY/", "s/REPLACE_WITH_GATEWAY_TOKEN/",
		"sed -i '" + clNodeEntrySed, "deploy/tls/make-test-ca.sh", "execmesh nodes credentials --gateway",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("deploy/README.md does not contain %q", want)
		}
	}
}

// clCheckNodeConfined connects as node n1 and checks what its shipped
// permissions allow: its own endpoints, heartbeats and exit events (a
// JetStream publish acknowledged through its inbox) — and nothing of n2's
// or of the gateway's.
func clCheckNodeConfined(t *testing.T, urls []string, ca string, gnc *nats.Conn, n1, n2 clIdentity) {
	var mu sync.Mutex
	var violations []string
	nc := clConnect(t, bus.ClientConfig{
		URLs: urls, NKeySeedFile: n1.SeedFile, TLSCAFile: ca, Name: "node n1",
		InboxPrefix: bus.InboxPrefix(n1.NodeID),
		ErrorHandler: func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			violations = append(violations, err.Error())
			mu.Unlock()
		},
	})
	subj := protocol.Subjects(bus.DefaultPrefix)
	own, err := nc.SubscribeSync(subj.Node(n1.NodeID, protocol.NodeEndpointExec))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The gateway may be on another server of the cluster, which learns
	// of the subscription through its route a moment after the node's
	// Flush: publish until a message gets through.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := gnc.Publish(subj.Node(n1.NodeID, protocol.NodeEndpointExec), []byte("hi")); err != nil {
			t.Fatal(err)
		}
		_, err := own.NextMsg(200 * time.Millisecond)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node does not receive its own endpoint's messages: %v", err)
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := bus.PublishExitEvent(clCtx(t, 20*time.Second), js, bus.DefaultPrefix, protocol.ExitEvent{NodeID: n1.NodeID, SessionID: "cl-probe", StartedAt: 1})
	if err != nil || ack.Stream != bus.StreamNamesFor(bus.DefaultPrefix).Exit {
		t.Fatalf("node's exit event not stored with the shipped permissions: %v", err)
	}

	// Everything below must be refused by the servers.
	refused := []struct{ what, subject string }{
		{"subscribe to another node's endpoints", subj.NodeAll(n2.NodeID)},
		{"subscribe to the tool API", subj.Invoke},
		{"subscribe to the gateway's inboxes", "_INBOX.>"},
	}
	for _, r := range refused {
		if _, err := nc.SubscribeSync(r.subject); err != nil {
			t.Fatal(err)
		}
	}
	pubs := []string{subj.PresenceOf(n2.NodeID), subj.ExitEventsOf(n2.NodeID), subj.Invoke, subj.Node(n2.NodeID, protocol.NodeEndpointExec), "$JS.API.STREAM.DELETE." + bus.StreamNamesFor(bus.DefaultPrefix).Exit}
	for _, p := range pubs {
		if err := nc.Publish(p, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	_ = nc.Flush()
	clCheckFor(t, "permission violations reported", 10*time.Second, 50*time.Millisecond, func() error {
		mu.Lock()
		got := strings.Join(violations, "\n")
		mu.Unlock()
		for _, r := range refused {
			if !strings.Contains(got, "Subscription to \""+r.subject+"\"") {
				return fmt.Errorf("no violation for %s (%s); got:\n%s", r.what, r.subject, got)
			}
		}
		for _, p := range pubs {
			if !strings.Contains(got, "Publish to \""+p+"\"") {
				return fmt.Errorf("no violation for publishing to %s; got:\n%s", p, got)
			}
		}
		return nil
	})
	if _, err := js.Stream(clCtx(t, time.Second), bus.StreamNamesFor(bus.DefaultPrefix).Exit); err == nil {
		t.Fatal("a node can read the exit stream's info through the JetStream API")
	}
}

// clStartInProcess starts servers from options and stops them at cleanup.
func clStartInProcess(t *testing.T, opts [3]*server.Options) [3]*server.Server {
	t.Helper()
	var out [3]*server.Server
	for i, o := range opts {
		o.NoSigs = true
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatalf("nats-%d: %v", i+1, err)
		}
		t.Cleanup(func() {
			s.Shutdown()
			s.WaitForShutdown()
		})
		go s.Start()
		out[i] = s
	}
	for i, s := range out {
		if !s.ReadyForConnections(20 * time.Second) {
			t.Fatalf("nats-%d not ready for connections", i+1)
		}
	}
	return out
}

// clConnect connects with bus.Connect and closes the connection at
// cleanup.
func clConnect(t *testing.T, cc bus.ClientConfig) *nats.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nc, err := bus.Connect(ctx, cc, nil)
	if err != nil {
		t.Fatalf("connect %s: %v", cc.Name, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// clPortsBelowEphemeral returns n distinct loopback TCP ports that were
// free a moment ago, chosen from 20000–32767: below Linux's ephemeral
// range (32768–60999), so no outgoing connection takes one between the
// choice and the server's bind (STYLE §7).
func clPortsBelowEphemeral(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	seen := map[int]bool{}
	for tries := 0; len(out) < n && tries < 1000; tries++ {
		p := 20000 + rand.IntN(12768)
		if seen[p] {
			continue
		}
		seen[p] = true
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			continue
		}
		out = append(out, p)
	}
	if len(out) < n {
		t.Fatalf("no %d free ports below the ephemeral range", n)
	}
	return out
}
