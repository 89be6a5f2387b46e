package integration

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

// TestNodeJoinByCode is the whole setup of a new machine: the gateway's
// embedded server authenticates every client; `execmesh nodes invite`
// gives a code; `execmesh node --join CODE` joins with the code's
// one-time credential, gets its own confined identity, is paired and runs
// commands; the code is refused the second time; the joined node cannot
// use another node's subjects; and it reconnects later with its own key
// and no flags but its state dir.
//
// "netns" runs the node in its own network namespace, reaching the
// gateway's server over a veth pair (10.203.x.0/30, addresses inside the
// namespaces only); it is skipped, loudly, where namespaces cannot be
// created. "loopback" runs the same scenario on 127.0.0.1.
func TestNodeJoinByCode(t *testing.T) {
	t.Run("loopback", func(t *testing.T) {
		user := bus.User{Name: "execmesh-gateway", Password: randomToken()}
		cfg := bus.ServerConfig{Listen: "127.0.0.1:-1", JetStream: true, StoreDir: filepath.Join(t.TempDir(), "nats"), Users: []bus.User{user}}
		srv := startServerIn(t, "", cfg)
		joinScenario(t, srv, user, nil)
	})
	t.Run("netns", func(t *testing.T) {
		pair := newNetnsPair(t)
		user := bus.User{Name: "execmesh-gateway", Password: randomToken()}
		cfg := bus.ServerConfig{Listen: pair.gwIP + ":-1", JetStream: true, StoreDir: filepath.Join(t.TempDir(), "nats"), Users: []bus.User{user}}
		srv := startServerIn(t, pair.gwNS, cfg)
		if u := srv.ClientURL(); !strings.Contains(u, pair.gwIP) {
			t.Fatalf("server URL %s is not on the veth address %s", u, pair.gwIP)
		}
		joinScenario(t, srv, user, []string{"ip", "netns", "exec", pair.nodeNS})
	})
}

func joinScenario(t *testing.T, srv *bus.Server, gwUser bus.User, nodePrefix []string) {
	ns := &nodeServer{t: t, srv: srv}
	gw := startItGateway(t, ns, "", bus.ClientConfig{InProcess: srv, User: gwUser.Name, Password: gwUser.Password})

	r := gw.do("POST", "/v1/nodes/invite", map[string]any{"name": "remote-builder", "ttlMs": 60000})
	var inv struct {
		Code, Command string
		ExpiresAtMs   int64
	}
	if r.Status != 200 || json.Unmarshal(r.Raw, &inv) != nil || inv.Command != "execmesh node --join "+inv.Code {
		t.Fatalf("invite: %d %s", r.Status, r.Raw)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(inv.Code)
	var code struct {
		URLs []string `json:"urls"`
		User string   `json:"user"`
	}
	if err := json.Unmarshal(raw, &code); err != nil || len(code.URLs) == 0 || code.User == "" || code.URLs[0] != srv.ClientURL() {
		t.Fatalf("code content: %s (%v)", raw, err)
	}

	np := newNodeProc(t, "", "--join", inv.Code)
	np.prefix = nodePrefix
	np.start()
	v := gw.waitNode(np.id, "connected", "paired")
	if v.Name != "remote-builder" || !v.Joined || !strings.HasPrefix(v.Server, srv.ClientURL()) {
		t.Fatalf("joined node: %+v", v)
	}
	res := gw.invoke("exec", map[string]any{"command": "echo joined-and-running; echo $HOME", "host": "node"})
	if !hasAll(res.Text(), "joined-and-running", np.stateDir) {
		t.Fatalf("exec on the joined node: %s", res.Text())
	}

	// The same code a second time: refused with a clear error.
	np2 := newNodeProc(t, "", "--join", inv.Code)
	np2.prefix = nodePrefix
	np2.start()
	err, exited := np2.wait(40 * time.Second)
	if !exited || err == nil || !strings.Contains(np2.out.String(), "join refused") {
		t.Fatalf("second use of the code: exited %v err %v, output:\n%s", exited, err, np2.out.String())
	}
	for _, n := range gw.nodes() {
		if n.ID == np2.id && n.Paired {
			t.Fatal("the second node was paired")
		}
	}

	// The joined node's credentials: its own subjects only.
	id, err := bus.LoadOrCreateNodeIdentity(np.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	violations := make(chan error, 8)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := bus.Connect(ctx, bus.ClientConfig{InProcess: srv, NKeySeed: id.Seed, InboxPrefix: bus.InboxPrefix(id.NodeID),
		ErrorHandler: func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }}, nil)
	if err != nil {
		t.Fatalf("connect with the node's key: %v", err)
	}
	defer nc.Close()
	subj := protocol.Subjects("execmesh")
	other := strings.Repeat("z", 16)
	for _, s := range []string{subj.Node(other, "exec"), subj.PresenceOf(other), subj.ExitEventsOf(other), "execmesh.gw.invoke"} {
		_ = nc.Publish(s, []byte(`{}`))
	}
	if _, err := nc.SubscribeSync(subj.NodeAll(other)); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	for range 5 {
		select {
		case err := <-violations:
			if !errors.Is(err, nats.ErrPermissionViolation) {
				t.Fatalf("want a permissions violation, got %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("missing permissions violation")
		}
	}
	// Its own subjects work.
	if err := nc.Publish(subj.PresenceOf(id.NodeID), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case err := <-violations:
		t.Fatalf("own presence subject refused: %v", err)
	case <-time.After(300 * time.Millisecond):
	}

	// Restart the node with only its state dir: it reconnects with its
	// own key to the servers saved at join.
	if err := np.stop(); err != nil {
		t.Fatalf("stop: %v\n%s", err, np.out.String())
	}
	gw.waitNode(np.id, "unreachable", "paired")
	i := slices.Index(np.args, "--join")
	np.args = slices.Delete(np.args, i, i+2)
	np.start()
	gw.waitNode(np.id, "connected", "paired")
	if res := gw.invoke("exec", map[string]any{"command": "echo rejoined", "host": "node"}); !strings.Contains(res.Text(), "rejoined") {
		t.Fatalf("exec after restart: %s", res.Text())
	}
}

// startServerIn starts an embedded server whose client listener is
// created inside the network namespace netns ("" = the test's own), by
// StartServer running on the namespace's thread (inNetns).
func startServerIn(t *testing.T, netns string, cfg bus.ServerConfig) *bus.Server {
	t.Helper()
	var srv *bus.Server
	err := inNetns(netns, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		srv, err = bus.StartServer(ctx, cfg)
		return err
	})
	if err != nil {
		t.Fatalf("start nats in namespace %q: %v", netns, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("nats shutdown: %v", err)
		}
	})
	return srv
}

// netnsPair is two network namespaces joined by a veth pair.
type netnsPair struct {
	gwNS, nodeNS string
	gwIP, nodeIP string
}

// newNetnsPair creates the namespaces and the veth pair, with
// 10.203.<n>.1/30 on the gateway side and .2/30 on the node side, and
// removes them at cleanup. Where namespaces cannot be created it skips
// the test, saying why.
func newNetnsPair(t *testing.T) *netnsPair {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("SKIPPING join across network namespaces: the ip command (iproute2) is not installed")
	}
	var b [2]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	octet := int(b[0])
	p := &netnsPair{
		gwNS: "emgw-" + suffix, nodeNS: "emnode-" + suffix,
		gwIP: fmt.Sprintf("10.203.%d.1", octet), nodeIP: fmt.Sprintf("10.203.%d.2", octet),
	}
	vethGW, vethNode := "emg"+suffix, "emn"+suffix
	ip := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if err := ip("netns", "add", p.gwNS); err != nil {
		t.Skipf("SKIPPING join across network namespaces: cannot create a network namespace here (needs root / CAP_SYS_ADMIN+CAP_NET_ADMIN): %v", err)
	}
	t.Cleanup(func() { _ = ip("netns", "del", p.gwNS) })
	if err := ip("netns", "add", p.nodeNS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ip("netns", "del", p.nodeNS) })
	for _, args := range [][]string{
		{"link", "add", vethGW, "netns", p.gwNS, "type", "veth", "peer", "name", vethNode, "netns", p.nodeNS},
		{"-n", p.gwNS, "addr", "add", p.gwIP + "/30", "dev", vethGW},
		{"-n", p.nodeNS, "addr", "add", p.nodeIP + "/30", "dev", vethNode},
		{"-n", p.gwNS, "link", "set", vethGW, "up"},
		{"-n", p.nodeNS, "link", "set", vethNode, "up"},
		{"-n", p.gwNS, "link", "set", "lo", "up"},
		{"-n", p.nodeNS, "link", "set", "lo", "up"},
	} {
		if err := ip(args...); err != nil {
			t.Fatalf("network namespace setup: %v", err)
		}
	}
	return p
}

func randomToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
