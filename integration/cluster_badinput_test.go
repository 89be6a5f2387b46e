package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

// The bad-input tests of the cluster: wrong credentials, broken server
// certificates, a server missing. Each is a subtest of TestClusterNetns
// (they need its machines) and leaves the cluster healthy.

// clBadCredentials: a node agent whose key is not in auth.conf is refused
// by the servers, says so in its log at warn level, keeps running
// (retrying: the key may be added later), and never reaches the gateway;
// the cluster keeps working.
func clBadCredentials(t *testing.T, c *clCluster) {
	c.use(t)
	rogue := clCredentials(t, filepath.Join(t.TempDir(), "rogue"), false) // entry not added to auth.conf
	p := newClProc(t, c.node("node-b").host, "rogue-node", rogue.Dir, c.nodeProcEnv(rogue.Dir, "rogue"), c.emBin, "node", "--state-dir", rogue.Dir)
	p.start(t)
	defer func() { _ = p.stop() }()
	line := p.waitLog(6*time.Second, "authorization violation")
	if !p.running() {
		t.Fatalf("node with unknown credentials exited: %v\n%s", p.err, p.logTail(2000))
	}
	if c.listed(rogue.NodeID) {
		t.Fatal("the gateway lists a node whose credentials the servers refuse")
	}
	if r := c.mustCall("agent:badcreds:main", "exec", map[string]any{"command": "echo still-fine", "host": "node", "node": "node-a"}); !strings.Contains(r.Text(), "still-fine") {
		t.Fatalf("exec on node-a while a rogue node knocks: %q", r.Text())
	}
	if line == "" || !strings.Contains(line, "level=WARN") {
		t.Fatalf("a node whose nkey the servers refuse does not say so at warn level within 6 s (\"Authorization Violation\"); "+
			"an operator would see a silent node. Node log:\n%s", p.logTail(1500))
	}
	t.Logf("refused node logs: %s", strings.TrimSpace(line))
}

// clBadTLS: servers that present an expired certificate, or a
// self-signed one, are refused by node agents and by the gateway (which
// verify against the deployment CA), and both say why at warn level, with
// the server's URL: the x509 reason, although nats.go itself only reports
// "nkeys not supported by the server" (the stray server asks for no nkey,
// and nats.go gives up before the TLS handshake; bus checks the
// certificate behind that). The node keeps retrying; the gateway, which
// serves nothing before its first connection, logs "waiting for NATS"
// with the URL and that reason. The cluster keeps working meanwhile.
func clBadTLS(t *testing.T, c *clCluster) {
	c.use(t)
	h := c.net.hosts["bad-tls"]
	for _, kind := range []string{"expired", "self-signed"} {
		t.Run(kind, func(t *testing.T) {
			c.use(t)
			dir := t.TempDir()
			cert, key := clBadServerCert(t, dir, kind, c.tlsDir, h.name, h.ip)
			conf := filepath.Join(dir, "bad.conf")
			if err := os.WriteFile(conf, []byte(fmt.Sprintf("listen: 0.0.0.0:4222\ntls {\n  cert_file: %q\n  key_file: %q\n  timeout: 3\n}\n", cert, key)), 0o600); err != nil {
				t.Fatal(err)
			}
			srv := newClProc(t, h, "bad-tls-"+kind, dir, []string{"PATH=/usr/local/bin:/usr/bin:/bin"}, c.nsBin, "-c", conf)
			srv.start(t)
			defer func() { _ = srv.stop() }()
			clCheckFor(t, "server with the "+kind+" certificate listening", 20*time.Second, 100*time.Millisecond, func() error {
				conn, err := clDialIn(h.ns)(t.Context(), "tcp", "127.0.0.1:4222")
				if err != nil {
					return err
				}
				return conn.Close()
			})
			want := map[string]string{"expired": "certificate has expired", "self-signed": "certificate signed by unknown authority"}[kind]
			url := "tls://" + h.name + ":4222"

			// The library's own error, as any client sees it (the test
			// resolves no machine names: it dials the address).
			ctx := clCtx(t, 3*time.Second)
			_, err := bus.Connect(ctx, bus.ClientConfig{URLs: []string{"tls://" + h.ip + ":4222"}, TLSCAFile: c.ca, Name: "probe",
				Options: clDialerOption(c.node("node-b").host)}, nil)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("connect to a server with a %s certificate: %v, want %q", kind, err, want)
			}

			stateDir := t.TempDir()
			node := newClProc(t, c.node("node-b").host, "node-"+kind, stateDir, c.nodeProcEnv(stateDir, "tls-"+kind), c.emBin,
				"node", "--state-dir", stateDir, "--nats-url", url)
			node.start(t)
			defer func() { _ = node.stop() }()
			gwState := t.TempDir()
			gw := newClProc(t, h, "gateway-"+kind, gwState, []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + gwState},
				c.emBin, "gateway", "--config", c.gwConf, "--state-dir", gwState, "--nats-url", url, "--listen", "127.0.0.1:8421")
			gw.start(t)
			defer func() { _ = gw.stop() }()

			// A warning that names the server and the x509 reason.
			clearLine := func(p *clProc, msg string, total time.Duration) string {
				t.Helper()
				deadline := time.Now().Add(total)
				for {
					for l := range strings.SplitSeq(p.lastRunLog(), "\n") {
						if strings.Contains(l, "level=WARN") && strings.Contains(l, msg) && strings.Contains(l, want) && strings.Contains(l, url) {
							return l
						}
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s: no warning %q naming %s and %q within %s:\n%s", p.name, msg, url, want, total, p.logTail(2000))
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			nodeLine := clearLine(node, "nats connect attempt failed", 6*time.Second)
			gwLine := clearLine(gw, "nats connect attempt failed", 6*time.Second)
			// bus.Connect says "waiting for NATS" after 3 s.
			gwWait := clearLine(gw, "waiting for NATS", 10*time.Second)
			if !node.running() {
				t.Fatalf("node exited instead of retrying: %v\n%s", node.err, node.logTail(1500))
			}
			if !gw.running() {
				t.Fatalf("gateway exited instead of waiting for NATS: %v\n%s", gw.err, gw.logTail(1500))
			}
			if strings.Contains(gw.lastRunLog(), "level=ERROR") || strings.Contains(node.lastRunLog(), "level=ERROR") {
				t.Fatalf("errors besides the refused certificate:\nnode:\n%s\ngateway:\n%s", node.logTail(1500), gw.logTail(1500))
			}
			t.Logf("node: %s", strings.TrimSpace(nodeLine))
			t.Logf("gateway: %s", strings.TrimSpace(gwLine))
			t.Logf("gateway: %s", strings.TrimSpace(gwWait))

			// The cluster does not notice.
			r := c.mustCall("agent:badtls:main", "exec", map[string]any{"command": "echo tls-" + kind + "-fine", "host": "node", "node": "node-b"})
			if !strings.Contains(r.Text(), "tls-"+kind+"-fine") {
				t.Fatalf("exec on node-b while a node and a gateway knock on a server with a %s certificate: %q", kind, r.Text())
			}
		})
	}
	c.use(t)
}

// clBadServerCert writes a server certificate for name/ip that is
// expired (signed by the test CA, validity ended yesterday) or
// self-signed, and returns the cert and key paths.
func clBadServerCert(t *testing.T, dir, kind, caDir, name, ip string) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{Organization: []string{"execmesh test"}, CommonName: name},
		DNSNames:     []string{name},
		IPAddresses:  []net.IP{net.ParseIP(ip)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		NotBefore:    time.Now().Add(-48 * time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
	}
	parent, signer := tmpl, any(key)
	switch kind {
	case "expired":
		tmpl.NotAfter = time.Now().Add(-24 * time.Hour)
		caPEM, err := os.ReadFile(filepath.Join(caDir, "ca.pem"))
		if err != nil {
			t.Fatal(err)
		}
		caKeyPEM, err := os.ReadFile(filepath.Join(caDir, "ca-key.pem"))
		if err != nil {
			t.Fatal(err)
		}
		cb, _ := pem.Decode(caPEM)
		kb, _ := pem.Decode(caKeyPEM)
		if cb == nil || kb == nil {
			t.Fatal("test CA: bad PEM")
		}
		if parent, err = x509.ParseCertificate(cb.Bytes); err != nil {
			t.Fatal(err)
		}
		if signer, err = x509.ParsePKCS8PrivateKey(kb.Bytes); err != nil {
			t.Fatal(err)
		}
	case "self-signed":
	default:
		t.Fatalf("unknown kind %q", kind)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath := filepath.Join(dir, kind+".pem"), filepath.Join(dir, kind+"-key.pem")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath
}

// clServerMissing: with nats-3 stopped (not restarted), the rest keeps
// working: the gateway restarts (its stream and buckets keep 3 replicas
// and their quorum), a node whose URL list names nats-3 first connects
// through another server, exec and exit events work on both nodes, and a
// client given only nats-3 gets a clear error. Then nats-3 comes back and
// catches up.
func clServerMissing(t *testing.T, c *clCluster) {
	c.use(t)
	const key = "agent:servermissing:main"
	if err := c.servers[2].stop(); err != nil {
		t.Fatalf("stop nats-3: %v", err)
	}
	c.startGatewayAfterStop()
	b := c.node("node-b")
	if err := b.proc.stop(); err != nil {
		t.Fatalf("stop node-b: %v", err)
	}
	alt := newClProc(t, b.host, "node-b-nats3-first", b.ident.Dir, c.nodeProcEnv(b.ident.Dir, b.name), c.emBin,
		"node", "--state-dir", b.ident.Dir, "--nats-url", "tls://nats-3:4222,tls://nats-1:4222")
	alt.start(t)
	for _, name := range clNodeNames {
		c.waitNode(c.node(name).ident.NodeID, "connected", "paired", 30*time.Second)
	}
	want := map[string]string{}
	for _, name := range clNodeNames {
		r := c.mustCall(key, "exec", map[string]any{"command": "sleep 0.3; echo missing-ok-" + name, "host": "node", "node": name, "background": true})
		if r.Status() != protocol.StatusRunning {
			t.Fatalf("exec on %s with nats-3 down: %s %q", name, r.Status(), r.Text())
		}
		want[r.SessionID()] = "missing-ok-" + name
	}
	c.collectExitEvents(key, want, 30*time.Second, time.Second)
	_, err := bus.Connect(clCtx(t, 3*time.Second), bus.ClientConfig{URLs: []string{"tls://" + c.net.hosts["nats-3"].ip + ":4222"}, TLSCAFile: c.ca, Name: "probe",
		Options: clDialerOption(b.host)}, nil)
	if err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("connect to the missing server only: %v, want a connection refused error", err)
	}
	t.Logf("client given only the missing server: %v", err)

	if err := alt.stop(); err != nil {
		t.Fatalf("stop node-b (nats-3 first): %v", err)
	}
	c.servers[2].start(t)
	c.waitServersHealthy(60 * time.Second)
	c.waitStreamsCurrent(60 * time.Second)
	b.proc.start(t)
	c.waitNode(b.ident.NodeID, "connected", "paired", 30*time.Second)
}
