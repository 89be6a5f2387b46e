package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/access"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/protocol"
)

// This file is the multi-host harness of the cluster tests: "machines"
// are network namespaces made by the test, each with one veth whose peer
// sits on a bridge in a "switch" namespace, addressed in a private /24 of
// 10.203.0.0/16 that exists inside these namespaces only. Daemons run in
// their machine with `ip netns exec NS …`, and every machine resolves
// nats-1, nats-2 and nats-3 through /etc/netns/NS/hosts (which ip netns
// exec binds over /etc/hosts), so the shipped configs run with their own
// host names. A link is cut by setting the machine's switch port down.
//
// The test process reaches the machines without an address of its own:
// clDialIn opens sockets from a thread that entered the machine's
// namespace (a socket keeps the namespace it was made in), so the test's
// HTTP and NATS clients talk to the gateway and the servers as a client
// on that machine would.

// clNet is the switch and the machines attached to it.
type clNet struct {
	t      *testing.T
	id     string // random hex, in every name this net creates
	subnet string // "10.203.<n>"
	sw     string // the switch namespace (bridge br0)
	hosts  map[string]*clHost
	order  []*clHost
}

// clHost is one machine.
type clHost struct {
	net  *clNet
	name string // nats-1, gw, node-a, …
	ns   string
	ip   string
	port string // its veth on the switch
}

// clNetnsSkip skips the test loudly, saying why, when network namespaces
// cannot be made here.
func clNetnsSkip(t *testing.T, why string) {
	t.Helper()
	msg := "SKIPPING MULTI-HOST CLUSTER TEST: " + why + " (needs root with CAP_SYS_ADMIN and CAP_NET_ADMIN, and iproute2)"
	t.Log(strings.Repeat("!", 72))
	t.Log(msg)
	t.Log(strings.Repeat("!", 72))
	t.Skip(msg)
}

func clIP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newClNet makes the switch and one machine per name, and removes them
// (and every process left in them) at cleanup.
func newClNet(t *testing.T, names ...string) *clNet {
	t.Helper()
	if runtime.GOOS != "linux" {
		clNetnsSkip(t, "network namespaces are Linux only")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		clNetnsSkip(t, "the ip command (iproute2) is not installed")
	}
	var b [2]byte
	_, _ = rand.Read(b[:])
	n := &clNet{t: t, id: hex.EncodeToString(b[:]), subnet: fmt.Sprintf("10.203.%d", 1+int(b[0])%250), hosts: map[string]*clHost{}}
	n.sw = "emcl-" + n.id + "-sw"
	if err := clIP("netns", "add", n.sw); err != nil {
		clNetnsSkip(t, "cannot create a network namespace: "+err.Error())
	}
	t.Cleanup(n.cleanup)
	for _, args := range [][]string{
		{"-n", n.sw, "link", "set", "lo", "up"},
		{"-n", n.sw, "link", "add", "br0", "type", "bridge"},
		{"-n", n.sw, "link", "set", "br0", "up"},
	} {
		if err := clIP(args...); err != nil {
			t.Fatalf("switch setup: %v", err)
		}
	}
	for i, name := range names {
		h := &clHost{net: n, name: name, ns: "emcl-" + n.id + "-" + name,
			ip: fmt.Sprintf("%s.%d", n.subnet, 10+i), port: fmt.Sprintf("c%ss%d", n.id, i)}
		local := fmt.Sprintf("c%sh%d", n.id, i)
		if err := clIP("netns", "add", h.ns); err != nil {
			t.Fatal(err)
		}
		n.hosts[name] = h
		n.order = append(n.order, h)
		for _, args := range [][]string{
			{"link", "add", local, "netns", h.ns, "type", "veth", "peer", "name", h.port, "netns", n.sw},
			{"-n", h.ns, "link", "set", local, "name", "eth0"},
			{"-n", h.ns, "addr", "add", h.ip + "/24", "dev", "eth0"},
			{"-n", h.ns, "link", "set", "eth0", "up"},
			{"-n", h.ns, "link", "set", "lo", "up"},
			{"-n", n.sw, "link", "set", h.port, "master", "br0"},
			{"-n", n.sw, "link", "set", h.port, "up"},
		} {
			if err := clIP(args...); err != nil {
				t.Fatalf("machine %s: %v", name, err)
			}
		}
	}
	// Every machine resolves the servers by the names of the shipped
	// configs and certificates.
	var hosts strings.Builder
	hosts.WriteString("127.0.0.1 localhost\n")
	for _, h := range n.order {
		fmt.Fprintf(&hosts, "%s %s\n", h.ip, h.name)
	}
	for _, h := range n.order {
		dir := filepath.Join("/etc/netns", h.ns)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("per-namespace /etc/hosts: %v", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(hosts.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// cleanup kills whatever still runs in the machines (session processes
// of a SIGKILLed node included), then removes the namespaces.
func (n *clNet) cleanup() {
	all := append(append([]*clHost{}, n.order...), &clHost{ns: n.sw})
	for _, h := range all {
		out, _ := exec.Command("ip", "netns", "pids", h.ns).Output()
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	for _, h := range all {
		for i := 0; i < 50; i++ {
			out, _ := exec.Command("ip", "netns", "pids", h.ns).Output()
			if len(bytes.TrimSpace(out)) == 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := clIP("netns", "del", h.ns); err != nil {
			n.t.Logf("cleanup: %v", err)
		}
		if h.name != "" {
			_ = os.RemoveAll(filepath.Join("/etc/netns", h.ns))
		}
	}
}

// cut takes the machine off the switch (its own interface stays up, as
// when a cable or a switch port fails: no reset, packets just vanish).
func (h *clHost) cut() {
	h.net.t.Helper()
	if err := clIP("-n", h.net.sw, "link", "set", h.port, "down"); err != nil {
		h.net.t.Fatal(err)
	}
}

// restore puts it back.
func (h *clHost) restore() {
	h.net.t.Helper()
	if err := clIP("-n", h.net.sw, "link", "set", h.port, "up"); err != nil {
		h.net.t.Fatal(err)
	}
}

// clDialIn returns a dial function whose sockets are made inside the
// network namespace ns. The dialing goroutine locks its thread, enters
// the namespace and never leaves it: the runtime ends a thread whose
// goroutine exits locked, so no other goroutine ever runs in the wrong
// namespace (new threads are cloned from the runtime's template thread).
// Host names resolve as on that machine, through its /etc/netns/NS/hosts
// (the servers advertise themselves to clients as nats-1…3).
func clDialIn(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if host, port, err := net.SplitHostPort(addr); err == nil && net.ParseIP(host) == nil {
			if ip := clNetnsLookup(ns, host); ip != "" {
				addr = net.JoinHostPort(ip, port)
			}
		}
		var c net.Conn
		err := inNetns(ns, func() error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// inNetns runs f on a thread of its own inside the network namespace ns
// ("" = the test's own) and returns its error. The thread is locked and
// never unlocked, so the runtime ends it with its goroutine and no other
// goroutine ever runs in the namespace (new threads are cloned from the
// runtime's template thread, not from this one).
func inNetns(ns string, f func() error) error {
	done := make(chan error, 1)
	go func() {
		if ns != "" {
			runtime.LockOSThread()
			nsf, err := os.Open(filepath.Join("/var/run/netns", ns))
			if err != nil {
				done <- err
				return
			}
			err = unix.Setns(int(nsf.Fd()), unix.CLONE_NEWNET)
			nsf.Close()
			if err != nil {
				done <- fmt.Errorf("setns %s: %w", ns, err)
				return
			}
		}
		done <- f()
	}()
	return <-done
}

// clNetnsLookup returns the address of name in the machine's hosts file
// (/etc/netns/NS/hosts), or "".
func clNetnsLookup(ns, name string) string {
	b, err := os.ReadFile(filepath.Join("/etc/netns", ns, "hosts"))
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && slices.Contains(f[1:], name) {
			return f[0]
		}
	}
	return ""
}

// clNSDialer adapts clDialIn to nats.CustomDialer.
type clNSDialer struct{ ns string }

func (d clNSDialer) Dial(network, address string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return clDialIn(d.ns)(ctx, network, address)
}

// httpClient returns an HTTP client whose connections start on this
// machine.
func (h *clHost) httpClient(maxConns int) *http.Client {
	return &http.Client{
		Timeout: 90 * time.Second,
		Transport: &http.Transport{
			DialContext:         clDialIn(h.ns),
			MaxIdleConns:        maxConns,
			MaxIdleConnsPerHost: maxConns,
			IdleConnTimeout:     30 * time.Second,
		},
	}
}

// clProc is a daemon running in a machine.
type clProc struct {
	t    *testing.T
	name string
	host *clHost
	argv []string
	env  []string
	dir  string
	log  string // its stdout and stderr, appended over restarts
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// newClProc prepares a process; start runs it.
func newClProc(t *testing.T, h *clHost, name, dir string, env []string, argv ...string) *clProc {
	t.Helper()
	p := &clProc{t: t, name: name, host: h, argv: argv, env: env, dir: dir,
		log: filepath.Join(t.TempDir(), name+".log")}
	t.Cleanup(p.cleanup)
	return p
}

// start runs the process (again, after a kill or a stop); t is the
// (sub)test that wants it.
func (p *clProc) start(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(p.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "=== start %s\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command("ip", append([]string{"netns", "exec", p.host.ns}, p.argv...)...)
	cmd.Dir = p.dir
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", p.name, err)
	}
	f.Close()
	p.cmd, p.done = cmd, make(chan struct{})
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
}

func (p *clProc) running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL (ip netns exec has exec'd the daemon: same pid).
func (p *clProc) kill(t *testing.T) {
	t.Helper()
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not die on SIGKILL", p.name)
	}
}

// stop sends SIGTERM and waits (SIGKILL after 40 s).
func (p *clProc) stop() error {
	if !p.running() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(40 * time.Second):
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	return fmt.Errorf("%s did not stop on SIGTERM", p.name)
}

// logTail returns the end of the process's log.
func (p *clProc) logTail(n int) string {
	b, _ := os.ReadFile(p.log)
	if len(b) > n {
		b = append([]byte("…"), b[len(b)-n:]...)
	}
	return string(b)
}

// lastRunLog returns the log of the process's current (or last) run.
func (p *clProc) lastRunLog() string {
	b, _ := os.ReadFile(p.log)
	s := string(b)
	if i := strings.LastIndex(s, "=== start "); i >= 0 {
		s = s[i:]
	}
	return s
}

func (p *clProc) cleanup() {
	if err := p.stop(); err != nil && p.t.Failed() {
		p.t.Logf("%s: %v", p.name, err)
	}
	if p.t.Failed() {
		p.t.Logf("--- %s log (%s):\n%s", p.name, p.log, p.logTail(5000))
	}
}

// clCluster is the deployment of deploy/README.md on namespaces: three
// NATS servers from deploy/nats/cluster, the gateway from
// deploy/gateway.cluster.json, node agents started as
// deploy/systemd/execmesh-node.service starts them (its env file).
type clCluster struct {
	t       *testing.T
	net     *clNet
	dir     string
	tlsDir  string
	ca      string
	site    clSite
	confs   [3]string
	servers [3]*clProc
	gwIdent clIdentity
	gwConf  string
	gwState string
	gw      *clProc
	token   string
	gwURL   string
	http    *http.Client
	nodes   map[string]*clNode
	emBin   string   // execmesh
	nsBin   string   // nats-server
	nodeEnv []string // the node unit's env file, rendered
}

// clNode is a node agent machine.
type clNode struct {
	name  string
	host  *clHost
	ident clIdentity
	proc  *clProc
}

// clHeartbeat is the nodes' heartbeat in these tests (the env file's
// EXECMESH_NODE_HEARTBEAT_MS, lowered from 5 s): the gateway marks a node
// unreachable after three missed ones. Much lower and a node starved of
// CPU on a busy 2-core machine misses three in a row.
const clHeartbeat = time.Second

// clNodeNames are the node machines of every cluster.
var clNodeNames = []string{"node-a", "node-b"}

// newClCluster builds the machines and starts the whole deployment:
// servers, gateway, nodes (paired).
func newClCluster(t *testing.T) *clCluster {
	t.Helper()
	// bad-tls hosts servers with broken certificates (clBadTLS).
	machines := append(append([]string{"nats-1", "nats-2", "nats-3", "gw"}, clNodeNames...), "bad-tls")
	cn := newClNet(t, machines...)
	nsBin, err := clNATSServerBinary()
	if err != nil {
		t.Fatal(err)
	}
	emBin, err := execmeshBinary()
	if err != nil {
		t.Fatal(err)
	}
	c := &clCluster{t: t, net: cn, dir: t.TempDir(), token: randomToken(), nodes: map[string]*clNode{}, emBin: emBin, nsBin: nsBin}
	c.tlsDir = filepath.Join(c.dir, "tls")
	c.ca = filepath.Join(c.tlsDir, "ca.pem")
	var specs []string
	for i := 1; i <= 3; i++ {
		h := cn.hosts[fmt.Sprintf("nats-%d", i)]
		specs = append(specs, h.name+","+h.ip)
	}
	clMakeTLS(t, c.tlsDir, specs...)
	c.gwIdent = clCredentials(t, filepath.Join(c.dir, "gateway"), true)
	var entries []string
	for _, name := range clNodeNames {
		id := clCredentials(t, filepath.Join(c.dir, name), false)
		c.nodes[name] = &clNode{name: name, host: cn.hosts[name], ident: id}
		entries = append(entries, id.Entry)
	}
	c.site = clSite{Dir: c.dir, TLSDir: c.tlsDir, RoutePassword: randomToken(), GatewayNKey: c.gwIdent.PublicKey, NodeEntries: entries}
	for i := range 3 {
		c.site.StoreDir[i] = filepath.Join(c.dir, fmt.Sprintf("js-%d", i+1))
	}
	c.confs = c.site.render(t)
	for i := range 3 {
		h := cn.hosts[fmt.Sprintf("nats-%d", i+1)]
		c.servers[i] = newClProc(t, h, h.name, c.dir, []string{"PATH=/usr/local/bin:/usr/bin:/bin"}, nsBin, "-c", c.confs[i])
		c.servers[i].start(t)
	}
	c.waitServersHealthy(60 * time.Second)

	// The gateway, from the shipped config.
	gwHost := cn.hosts["gw"]
	c.gwState = filepath.Join(c.dir, "gw-state")
	c.gwConf = clRender(t, "gateway.cluster.json", filepath.Join(c.dir, "gateway.json"), 0o600,
		"REPLACE_WITH_GATEWAY_TOKEN", c.token,
		"/etc/execmesh/gateway.nkey", c.gwIdent.SeedFile,
		"/etc/execmesh/tls/ca.pem", c.ca,
		"/var/lib/execmesh", c.gwState)
	if err := os.MkdirAll(c.gwState, 0o700); err != nil {
		t.Fatal(err)
	}
	c.gw = newClProc(t, gwHost, "gateway", c.gwState,
		[]string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + c.gwState, "SHELL=/bin/sh", "LANG=C"},
		emBin, "gateway", "--config", c.gwConf, "--state-dir", c.gwState)
	c.gwURL = "http://" + gwHost.ip + ":8420"
	c.http = gwHost.httpClient(256)
	c.startGateway()

	// The nodes, as the systemd unit runs them.
	c.nodeEnv = clEnvFile(t, clRender(t, "systemd/execmesh-node.env", filepath.Join(c.dir, "node.env"), 0o600,
		"/etc/execmesh/tls/ca.pem", c.ca,
		"EXECMESH_NODE_HEARTBEAT_MS=5000", "EXECMESH_NODE_HEARTBEAT_MS="+strconv.Itoa(int(clHeartbeat.Milliseconds()))))
	for _, name := range clNodeNames {
		n := c.nodes[name]
		n.proc = newClProc(t, n.host, name, n.ident.Dir, c.nodeProcEnv(n.ident.Dir, name), emBin, "node", "--state-dir", n.ident.Dir)
		n.proc.start(t)
	}
	for _, name := range clNodeNames {
		n := c.nodes[name]
		c.waitNode(n.ident.NodeID, "connected", "pending", 30*time.Second)
		// A 503 is retryable: the pairing store's replicated stream may
		// still be electing its leader this soon after the cluster came up.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			st, raw := c.do("POST", "/v1/nodes/"+n.ident.NodeID+"/approve", nil)
			if st == 200 {
				break
			}
			if st != 503 || time.Now().After(deadline) {
				t.Fatalf("approve %s: %d %s", name, st, raw)
			}
		}
	}
	for _, name := range clNodeNames {
		c.waitNode(c.nodes[name].ident.NodeID, "connected", "paired", 30*time.Second)
	}
	return c
}

// nodeProcEnv is the environment of a node agent process named name.
func (c *clCluster) nodeProcEnv(dir, name string) []string {
	return append([]string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir, "SHELL=/bin/sh", "LANG=C", "EXECMESH_NODE_NAME=" + name}, c.nodeEnv...)
}

// startGateway starts (or restarts) the gateway and waits for /healthz.
func (c *clCluster) startGateway() {
	c.t.Helper()
	if c.http != nil {
		c.http.CloseIdleConnections() // connections to the previous run
	}
	c.gw.start(c.t)
	clCheckFor(c.t, "gateway /healthz", 60*time.Second, 100*time.Millisecond, func() error {
		if !c.gw.running() {
			c.t.Fatalf("gateway exited: %v\n%s", c.gw.err, c.gw.logTail(3000))
		}
		st, _ := c.do("GET", "/healthz", nil)
		if st != 200 {
			return fmt.Errorf("status %d", st)
		}
		return nil
	})
}

// waitServersHealthy waits until every running server answers /healthz
// (JetStream current, meta leader known) on its loopback monitor port.
func (c *clCluster) waitServersHealthy(total time.Duration) {
	c.t.Helper()
	clCheckFor(c.t, "NATS servers healthy", total, 200*time.Millisecond, func() error {
		for i, s := range c.servers {
			if !s.running() {
				if s.cmd != nil && s.err != nil {
					c.t.Fatalf("nats-%d exited: %v\n%s", i+1, s.err, s.logTail(3000))
				}
				continue
			}
			if err := c.serverHealthy(i); err != nil {
				return err
			}
		}
		return nil
	})
}

func (c *clCluster) serverHealthy(i int) error {
	h := c.net.hosts[fmt.Sprintf("nats-%d", i+1)]
	hc := h.httpClient(1)
	defer hc.CloseIdleConnections()
	res, err := hc.Get("http://127.0.0.1:8222/healthz")
	if err != nil {
		return fmt.Errorf("nats-%d: %w", i+1, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		return fmt.Errorf("nats-%d: %d %s", i+1, res.StatusCode, bytes.TrimSpace(b))
	}
	return nil
}

// clResp is a decoded gateway answer.
type clResp struct {
	Status int
	OK     bool             `json:"ok"`
	Result *protocol.Result `json:"result"`
	Error  *protocol.Error  `json:"error"`
	Raw    []byte
}

// do sends an HTTP request to the gateway with the token; body is
// marshalled as JSON. It returns the status and the raw body; a transport
// error is status 0.
func (c *clCluster) do(method, path string, body any) (int, []byte) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.gwURL+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if isOperatorPath(method, path) {
		// The operator's token, from the gateway's state dir (it
		// generates one there when gateway.auth.operatorToken is unset).
		tok, err := access.ReadOperatorTokenFile(c.gwState)
		if err != nil {
			c.t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	res, err := c.http.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	return res.StatusCode, raw
}

// isOperatorPath: the requests of these tests that need the operator
// token (pairing; tool calls keep the tool token).
func isOperatorPath(method, path string) bool {
	return method == "POST" && strings.HasPrefix(path, "/v1/nodes/")
}

// call invokes a tool under sessionKey.
func (c *clCluster) call(sessionKey, tool string, args map[string]any) clResp {
	st, raw := c.do("POST", "/tools/invoke", map[string]any{"tool": tool, "args": args, "sessionKey": sessionKey})
	r := clResp{Status: st, Raw: raw}
	if len(raw) > 0 && raw[0] == '{' {
		_ = json.Unmarshal(raw, &r)
	}
	return r
}

// callRetry is call, retried (up to 30 s) while the answer is a
// retryable error, as the API asks clients to: under CPU starvation a node
// can miss three heartbeats and be reported unreachable for a moment
// ("nothing was started").
func (c *clCluster) callRetry(sessionKey, tool string, args map[string]any) (clResp, int) {
	deadline := time.Now().Add(30 * time.Second)
	for retries := 0; ; retries++ {
		r := c.call(sessionKey, tool, args)
		if r.Error == nil || !r.Error.Retryable || time.Now().After(deadline) {
			return r, retries
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// mustCall invokes a tool and fails unless the answer is a 200 result.
func (c *clCluster) mustCall(sessionKey, tool string, args map[string]any) protocol.Result {
	c.t.Helper()
	r := c.call(sessionKey, tool, args)
	if r.Status != 200 || r.Result == nil {
		c.t.Fatalf("%s %v: %d %s", tool, args, r.Status, r.Raw)
	}
	return *r.Result
}

// nodesView returns GET /v1/nodes.
func (c *clCluster) nodesView() ([]gateway.NodeView, error) {
	st, raw := c.do("GET", "/v1/nodes", nil)
	if st != 200 {
		return nil, fmt.Errorf("GET /v1/nodes: %d %s", st, raw)
	}
	var out struct {
		Nodes []gateway.NodeView `json:"nodes"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, err
	}
	return out.Nodes, nil
}

// waitNode waits until node id is listed with status and pairing ("" =
// any).
func (c *clCluster) waitNode(id, status, pairing string, total time.Duration) {
	c.t.Helper()
	clCheckFor(c.t, "node "+id+" "+status+"/"+pairing, total, 100*time.Millisecond, func() error {
		nodes, err := c.nodesView()
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if n.ID == id {
				if n.Status == status && (pairing == "" || n.Pairing == pairing) {
					return nil
				}
				return fmt.Errorf("node %s is %s/%s", id, n.Status, n.Pairing)
			}
		}
		return fmt.Errorf("node %s not listed", id)
	})
}

// events takes the queued system events of sessionKey (long poll).
func (c *clCluster) events(sessionKey string, wait time.Duration) []protocol.SystemEvent {
	c.t.Helper()
	st, raw := c.do("GET", fmt.Sprintf("/v1/events?sessionKey=%s&waitMs=%d", sessionKey, wait.Milliseconds()), nil)
	if st == http.StatusServiceUnavailable && bytes.Contains(raw, []byte(`"retryable":true`)) {
		// The event store fails over (a stream leader is being elected):
		// a client retries, and nothing delivered is lost meanwhile.
		c.t.Logf("events: retryable %d %s", st, raw)
		time.Sleep(200 * time.Millisecond)
		return nil
	}
	if st != 200 {
		c.t.Fatalf("events: %d %s", st, raw)
	}
	var out struct {
		Events []protocol.SystemEvent `json:"events"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		c.t.Fatalf("events: %v: %s", err, raw)
	}
	return out.Events
}

// collectExitEvents reads events of sessionKey until every session of
// want (session id → text the event must contain) has its exit event,
// then listens for settle more to catch duplicates, and fails unless each
// arrived exactly once.
func (c *clCluster) collectExitEvents(sessionKey string, want map[string]string, total, settle time.Duration) {
	c.t.Helper()
	got := map[string][]string{} // session id prefix → texts
	var all []protocol.SystemEvent
	deadline := time.Now().Add(total)
	missing := func() []string {
		var m []string
		for id := range want {
			if len(got[id]) == 0 {
				m = append(m, id)
			}
		}
		return m
	}
	record := func(evs []protocol.SystemEvent) {
		for _, ev := range evs {
			all = append(all, ev)
			if ev.Kind != protocol.EventExecExit {
				continue
			}
			id := strings.TrimPrefix(ev.ContextKey, "exec:")
			got[id] = append(got[id], ev.Text)
		}
	}
	for len(missing()) > 0 && time.Now().Before(deadline) {
		record(c.events(sessionKey, time.Second))
	}
	if m := missing(); len(m) > 0 {
		c.t.Fatalf("exit events missing after %s for %d of %d sessions %v; got %d events: %+v", total, len(m), len(want), m, len(all), all)
	}
	record(c.events(sessionKey, settle))
	for id, texts := range got {
		w, ok := want[id]
		if !ok {
			c.t.Errorf("exit event of an unknown session %s: %q", id, texts)
			continue
		}
		if len(texts) != 1 {
			c.t.Errorf("session %s: %d exit events, want exactly one: %q", id, len(texts), texts)
			continue
		}
		if !strings.Contains(texts[0], w) {
			c.t.Errorf("session %s: exit event %q does not contain %q", id, texts[0], w)
		}
	}
}

// listSessions returns the process list of sessionKey by session id.
func (c *clCluster) listSessions(sessionKey string) map[string]protocol.Details {
	c.t.Helper()
	res := c.mustCall(sessionKey, "process", map[string]any{"action": "list"})
	out := map[string]protocol.Details{}
	list := res.Details.Sessions.Value()
	for _, d := range list {
		if id := d.SessionID.Value(); id != "" {
			out[id] = d
		}
	}
	return out
}

// natsConn connects the test to the cluster as a client on machine h
// would, with the given credentials; closed at cleanup.
func (c *clCluster) natsConn(h *clHost, cc bus.ClientConfig) *nats.Conn {
	c.t.Helper()
	if len(cc.URLs) == 0 {
		for i := 1; i <= 3; i++ {
			cc.URLs = append(cc.URLs, fmt.Sprintf("tls://%s:4222", c.net.hosts[fmt.Sprintf("nats-%d", i)].ip))
		}
	}
	if cc.TLSCAFile == "" {
		cc.TLSCAFile = c.ca
	}
	cc.Options = append(cc.Options, nats.SetCustomDialer(clNSDialer{ns: h.ns}))
	return clConnect(c.t, cc)
}

// gatewayConn is a NATS connection with the gateway's credentials, from
// the gateway's machine.
func (c *clCluster) gatewayConn() *nats.Conn {
	c.t.Helper()
	return c.natsConn(c.net.hosts["gw"], bus.ClientConfig{Name: "test as gateway", NKeySeedFile: c.gwIdent.SeedFile})
}

// waitNoInterest waits until none of the three servers has interest in
// subject: a request there from a client of any server gets "no
// responders" at once.
func (c *clCluster) waitNoInterest(subject string, total time.Duration) {
	c.t.Helper()
	for i := 1; i <= 3; i++ {
		server := fmt.Sprintf("nats-%d", i)
		nc := c.natsConn(c.net.hosts["gw"], bus.ClientConfig{Name: "interest probe", NKeySeedFile: c.gwIdent.SeedFile,
			URLs: []string{fmt.Sprintf("tls://%s:4222", c.net.hosts[server].ip)}})
		clCheckFor(c.t, "no interest in "+subject+" on "+server, total, 20*time.Millisecond, func() error {
			_, err := nc.Request(subject, nil, 200*time.Millisecond)
			if errors.Is(err, nats.ErrNoResponders) {
				return nil
			}
			return fmt.Errorf("request: %v", err)
		})
		nc.Close()
	}
}

// use makes t the test the cluster's helpers report to (a subtest).
// use makes t the cluster's test. When t fails, the cluster is put back
// together (every server, the gateway and the nodes running) so that the
// next subtest finds what it expects and fails for its own reasons only.
func (c *clCluster) use(t *testing.T) {
	c.t = t
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		t.Logf("restoring the cluster after a failure")
		for _, s := range c.servers {
			if !s.running() {
				s.start(t)
			}
		}
		c.waitServersHealthy(60 * time.Second)
		if !c.gw.running() {
			c.startGateway()
		}
		for _, n := range c.nodes {
			if !n.proc.running() {
				n.proc.start(t)
			}
		}
	})
}

// node returns a node machine by name.
func (c *clCluster) node(name string) *clNode {
	n := c.nodes[name]
	if n == nil {
		c.t.Fatalf("no node %s", name)
	}
	return n
}

// streamLeader returns the index (0..2) of the server leading stream.
func (c *clCluster) streamLeader(stream string) int {
	c.t.Helper()
	js, err := jetstream.New(c.gatewayConn())
	if err != nil {
		c.t.Fatal(err)
	}
	var leader string
	clCheckFor(c.t, "stream "+stream+" leader", 30*time.Second, 200*time.Millisecond, func() error {
		st, err := js.Stream(clCtx(c.t, 5*time.Second), stream)
		if err != nil {
			return err
		}
		if ci := st.CachedInfo().Cluster; ci != nil && ci.Leader != "" {
			leader = ci.Leader
			return nil
		}
		return fmt.Errorf("no leader")
	})
	for i := range 3 {
		if leader == fmt.Sprintf("nats-%d", i+1) {
			return i
		}
	}
	c.t.Fatalf("stream %s led by unknown server %q", stream, leader)
	return -1
}

// waitStreamsCurrent waits until execmesh's stream and buckets have a
// leader and two current replicas again.
func (c *clCluster) waitStreamsCurrent(total time.Duration) {
	c.t.Helper()
	js, err := jetstream.New(c.gatewayConn())
	if err != nil {
		c.t.Fatal(err)
	}
	// Every stream of the deployment: the exit and event streams and the
	// buckets the gateway created.
	var streams []string
	for name := range js.StreamNames(clCtx(c.t, 10*time.Second)).Name() {
		streams = append(streams, name)
	}
	if len(streams) < 3 {
		c.t.Fatalf("streams %v: want the exit and event streams and the buckets", streams)
	}
	for _, stream := range streams {
		clCheckFor(c.t, "stream "+stream+" fully replicated", total, 250*time.Millisecond, func() error {
			st, err := js.Stream(clCtx(c.t, 5*time.Second), stream)
			if err != nil {
				return err
			}
			ci := st.CachedInfo().Cluster
			if ci == nil || ci.Leader == "" || len(ci.Replicas) != 2 {
				return fmt.Errorf("cluster %+v", ci)
			}
			for _, r := range ci.Replicas {
				if !r.Current || r.Offline {
					return fmt.Errorf("replica %s current=%v offline=%v", r.Name, r.Current, r.Offline)
				}
			}
			return nil
		})
	}
}

// streamMsgs returns the number of messages in stream.
func (c *clCluster) streamMsgs(js jetstream.JetStream, stream string) uint64 {
	c.t.Helper()
	st, err := js.Stream(clCtx(c.t, 10*time.Second), stream)
	if err != nil {
		c.t.Fatalf("stream %s: %v", stream, err)
	}
	return st.CachedInfo().State.Msgs
}

// streamLastSeq returns the last sequence number of stream.
func (c *clCluster) streamLastSeq(js jetstream.JetStream, stream string) uint64 {
	c.t.Helper()
	st, err := js.Stream(clCtx(c.t, 10*time.Second), stream)
	if err != nil {
		c.t.Fatalf("stream %s: %v", stream, err)
	}
	return st.CachedInfo().State.LastSeq
}

// killOrphans SIGKILLs the processes of machine h whose command line
// contains marker (the sessions a SIGKILLed node agent left behind).
func (c *clCluster) killOrphans(h *clHost, marker string) {
	out, _ := exec.Command("ip", "netns", "pids", h.ns).Output()
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && strings.Contains(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})), marker) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// parallel runs f(0..n-1) on workers goroutines and fails the test with
// the first few errors. After the first error the remaining items are
// skipped: with retries inside f, a cluster that went bad would otherwise
// keep the test busy for n × the retry window.
func (c *clCluster) parallel(t *testing.T, workers, n int, f func(i int) error) {
	t.Helper()
	next := make(chan int)
	errs := make(chan error, n)
	var failed atomic.Bool
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				if failed.Load() {
					continue
				}
				if err := f(i); err != nil {
					failed.Store(true)
					errs <- err
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	var first []string
	count := 0
	for err := range errs {
		count++
		if len(first) < 5 {
			first = append(first, err.Error())
		}
	}
	if count > 0 {
		t.Fatalf("%d of %d failed; first: %q", count, n, first)
	}
}

// countProcs counts the processes of machine h whose command line
// contains marker.
func (c *clCluster) countProcs(h *clHost, marker string) int {
	out, _ := exec.Command("ip", "netns", "pids", h.ns).Output()
	n := 0
	for _, f := range strings.Fields(string(out)) {
		b, err := os.ReadFile("/proc/" + f + "/cmdline")
		if err == nil && strings.Contains(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})), marker) {
			n++
		}
	}
	return n
}

// waitLog waits until p's log contains one of subs (case-insensitive)
// and returns the matching line; "" when total passed.
func (p *clProc) waitLog(total time.Duration, subs ...string) string {
	deadline := time.Now().Add(total)
	for {
		b, _ := os.ReadFile(p.log)
		for _, line := range strings.Split(string(b), "\n") {
			l := strings.ToLower(line)
			for _, s := range subs {
				if strings.Contains(l, strings.ToLower(s)) {
					return line
				}
			}
		}
		if time.Now().After(deadline) {
			return ""
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// listed reports whether the gateway lists node id.
func (c *clCluster) listed(id string) bool {
	nodes, err := c.nodesView()
	if err != nil {
		c.t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID == id {
			return true
		}
	}
	return false
}

// clDialerOption makes a nats client dial from machine h.
func clDialerOption(h *clHost) []nats.Option {
	return []nats.Option{nats.SetCustomDialer(clNSDialer{ns: h.ns})}
}

// startGatewayAfterStop stops the gateway with SIGTERM and starts it
// again on the same state dir.
func (c *clCluster) startGatewayAfterStop() {
	c.t.Helper()
	if err := c.gw.stop(); err != nil {
		c.t.Fatalf("gateway stop: %v", err)
	}
	c.startGateway()
}

// nodeServer is the index of the server that holds n's connection, read
// from the servers' monitoring (connz names the node's nkey).
func (c *clCluster) nodeServer(t *testing.T, n *clNode) int {
	t.Helper()
	var at []int
	for i := range c.servers {
		if c.serverHolds(i, n) {
			at = append(at, i)
		}
	}
	if len(at) != 1 {
		t.Fatalf("%s is connected to servers %v, want exactly one", n.name, at)
	}
	return at[0]
}

// serverHolds reports whether server i lists an open connection of n.
func (c *clCluster) serverHolds(i int, n *clNode) bool {
	c.t.Helper()
	hc := c.net.hosts[fmt.Sprintf("nats-%d", i+1)].httpClient(1)
	defer hc.CloseIdleConnections()
	res, err := hc.Get("http://127.0.0.1:8222/connz?auth=true&limit=1000")
	if err != nil {
		c.t.Fatalf("connz of nats-%d: %v", i+1, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != 200 {
		c.t.Fatalf("connz of nats-%d: %d %v %s", i+1, res.StatusCode, err, b)
	}
	return bytes.Contains(b, []byte(n.ident.PublicKey))
}
