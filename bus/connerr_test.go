package bus_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/internal/testutil"
)

// TestConnectExplainsBadServerCertificate: a client that verifies
// against the deployment CA is refused by a server whose certificate has
// expired or is self-signed, and the log and the error say so, with the
// server's URL, at warn level. Without nkey authentication on the server,
// nats.go itself only reports "nkeys not supported by the server" for an
// nkey client (it stops before the TLS handshake); bus finds the
// certificate problem behind it.
func TestConnectExplainsBadServerCertificate(t *testing.T) {
	pki := writeBadPKI(t)
	node := newIdentity(t)
	for _, tc := range []struct {
		name, cert, want string
		nkeyAuth         bool // the server asks for nkeys: nats.go reaches the handshake itself
	}{
		{"expired", pki.expired, "certificate has expired", false},
		{"self-signed", pki.selfSigned, "certificate signed by unknown authority", false},
		{"expired with nkey auth", pki.expired, "certificate has expired", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := startPlainTLSServer(t, tc.cert, pki.key)
			if tc.nkeyAuth {
				url = bustest.StartServer(t, bustest.WithoutJetStream(), bustest.WithNKeys(nodeUser(t, node)),
					bustest.WithConfig(func(c *bus.ServerConfig) { c.TLSCertFile, c.TLSKeyFile = tc.cert, pki.key })).ClientURL()
			}
			var buf testutil.SyncBuffer
			log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
			ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
			defer cancel()
			_, err := bus.Connect(ctx, bus.ClientConfig{URLs: []string{url}, TLSCAFile: pki.ca, NKeySeed: node.Seed,
				InboxPrefix: bus.InboxPrefix(node.NodeID), Name: "bad-cert"}, log)
			if err == nil {
				t.Fatal("connected to a server whose certificate does not verify")
			}
			if !errors.Is(err, bus.ErrNotConnected) || !errors.Is(err, nats.ErrTLS) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Connect: %v\nwant ErrNotConnected, nats.ErrTLS and %q", err, tc.want)
			}
			if !tc.nkeyAuth && !strings.Contains(err.Error(), "server "+url) {
				t.Fatalf("Connect: %v\nwant the server's URL %s", err, url)
			}
			attempt := logLine(&buf, "level=WARN", "nats connect attempt failed", tc.want)
			if attempt == "" {
				t.Fatalf("no warning with %q:\n%s", tc.want, buf.String())
			}
			if !tc.nkeyAuth && !strings.Contains(attempt, url) {
				t.Fatalf("the warning does not name the server %s: %s", url, attempt)
			}
			waiting := logLine(&buf, "level=WARN", "waiting for NATS", "urls="+url, tc.want)
			if waiting == "" {
				t.Fatalf("no \"waiting for NATS\" with the URL and %q:\n%s", tc.want, buf.String())
			}
			// One warning per reason: the expired certificate's error
			// carries the clock, which must not count as a new reason.
			if n := strings.Count(buf.String(), "nats connect attempt failed"); n != 1 {
				t.Fatalf("%d connection warnings within 4 s, want 1:\n%s", n, buf.String())
			}
			t.Logf("%s", attempt)
		})
	}
}

// TestConnectWarnsEveryNewReason: nats.go hands bus only the first
// connection error and failed dials; bus must still warn when an attempt
// that reached a server fails for a new reason. A node starts before its
// server (connection refused); the server comes up with an expired
// certificate (TLS, during the retries), then with a good certificate but
// without the node's key (authorization); once the key is added the node
// connects. Each reason is warned once.
func TestConnectWarnsEveryNewReason(t *testing.T) {
	pki := writeBadPKI(t)
	node := newIdentity(t)
	listen := bustest.Listen(bustest.FreePort(t))
	var buf testutil.SyncBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	nc, err := bus.Connect(t.Context(), bus.ClientConfig{URLs: []string{"tls://" + listen}, TLSCAFile: pki.ca, NKeySeed: node.Seed,
		InboxPrefix: bus.InboxPrefix(node.NodeID), Async: true, Name: "early node"}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	waitWarn := func(reason string) {
		t.Helper()
		bustest.CheckFor(t, 15*time.Second, 50*time.Millisecond, func() error {
			if logLine(&buf, "level=WARN", "nats connect attempt failed", reason) == "" {
				return fmt.Errorf("no warning with %q:\n%s", reason, buf.String())
			}
			return nil
		})
	}
	waitWarn("connection refused")

	other := newIdentity(t) // the server knows someone, so it asks for nkeys
	serve := func(cert string, users ...bus.NKeyUser) *bus.Server {
		return bustest.StartServer(t, bustest.WithListen(listen), bustest.WithoutJetStream(), bustest.WithNKeys(users...),
			bustest.WithConfig(func(c *bus.ServerConfig) { c.TLSCertFile, c.TLSKeyFile = cert, pki.key }))
	}
	s := serve(pki.expired, nodeUser(t, other))
	waitWarn("certificate has expired")
	if err := s.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	s = serve(pki.good, nodeUser(t, other))
	waitWarn("authorization violation")
	if err := s.AddNKeyUser(nodeUser(t, node)); err != nil {
		t.Fatal(err)
	}
	bustest.CheckFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("status %v", nc.Status())
		}
		return nil
	})
	for _, reason := range []string{"connection refused", "certificate has expired", "authorization violation"} {
		n := 0
		for l := range strings.SplitSeq(strings.ToLower(buf.String()), "\n") {
			if strings.Contains(l, "nats connect attempt failed; retrying") && strings.Contains(l, reason) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d warnings for %q, want 1:\n%s", n, reason, buf.String())
		}
	}
}

// TestConnectNkeyNotSupportedWithGoodCertificate: when the certificate
// verifies, the server simply does not ask for nkeys, and that is what
// the error says.
func TestConnectNkeyNotSupportedWithGoodCertificate(t *testing.T) {
	ca, cert, key := writeTestPKI(t)
	url := startPlainTLSServer(t, cert, key)
	node := newIdentity(t)
	for _, cfg := range []bus.ClientConfig{
		{URLs: []string{url}, TLSCAFile: ca, NKeySeed: node.Seed},
		// The CA given as a nats option: the check uses it too.
		{URLs: []string{url}, NKeySeed: node.Seed, Options: []nats.Option{nats.RootCAs(ca)}},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_, err := bus.Connect(ctx, cfg, nil)
		cancel()
		if !errors.Is(err, nats.ErrNkeysNotSupported) || errors.Is(err, nats.ErrTLS) {
			t.Fatalf("Connect: %v, want only nats.ErrNkeysNotSupported", err)
		}
	}
}

// startPlainTLSServer starts a nats-server with TLS and nothing else, as
// a stray server would run: unlike bus.StartServer's, its INFO carries no
// nonce. It returns its URL.
func startPlainTLSServer(t *testing.T, cert, key string) string {
	t.Helper()
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cert, KeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, TLS: true, TLSConfig: tc, TLSTimeout: 2})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	return "tls://" + s.Addr().String()
}

// badPKI is a CA, a server key, and three certificates for 127.0.0.1
// with that key: one signed by the CA, one signed by the CA but expired,
// one self-signed.
type badPKI struct {
	ca, key, good, expired, selfSigned string
}

func writeBadPKI(t *testing.T) badPKI {
	t.Helper()
	dir := t.TempDir()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	create := func(tmpl, parent *x509.Certificate, pub, signer any) []byte {
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	caKey, srvKey := newKey(), newKey()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "execmesh test CA"},
		NotBefore: time.Now().Add(-72 * time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER := create(caTmpl, caTmpl, &caKey.PublicKey, caKey)
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(serial int64, notAfter time.Time) *x509.Certificate {
		return &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "127.0.0.1"},
			NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: notAfter,
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	self := leaf(3, time.Now().Add(time.Hour))
	return badPKI{
		ca:         write("ca.pem", "CERTIFICATE", caDER),
		key:        write("server-key.pem", "EC PRIVATE KEY", keyDER),
		good:       write("good.pem", "CERTIFICATE", create(leaf(4, time.Now().Add(time.Hour)), ca, &srvKey.PublicKey, caKey)),
		expired:    write("expired.pem", "CERTIFICATE", create(leaf(2, time.Now().Add(-24*time.Hour)), ca, &srvKey.PublicKey, caKey)),
		selfSigned: write("self-signed.pem", "CERTIFICATE", create(self, self, &srvKey.PublicKey, srvKey)),
	}
}

// logLine returns the first line of s containing every one of subs,
// ignoring case, or "".
func logLine(s *testutil.SyncBuffer, subs ...string) string {
	for l := range strings.SplitSeq(s.String(), "\n") {
		ok := true
		for _, sub := range subs {
			ok = ok && strings.Contains(strings.ToLower(l), strings.ToLower(sub))
		}
		if ok {
			return l
		}
	}
	return ""
}
