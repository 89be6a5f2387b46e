package bus_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
)

// writeTestPKI writes a CA and a server certificate for 127.0.0.1 and
// returns the file names.
func writeTestPKI(t *testing.T) (caFile, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "execmesh test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server-key.pem", "EC PRIVATE KEY", keyDER)
}

func TestTLS(t *testing.T) {
	caFile, certFile, keyFile := writeTestPKI(t)
	s := bustest.StartServer(t, bustest.WithUsers(bus.User{Name: "gateway", Password: "gw-secret"}),
		bustest.WithConfig(func(c *bus.ServerConfig) { c.TLSCertFile, c.TLSKeyFile = certFile, keyFile }))
	if url := s.ClientURL(); !strings.HasPrefix(url, "tls://127.0.0.1:") {
		t.Fatalf("ClientURL = %q", url)
	}
	nc := bustest.Connect(t, s, bus.ClientConfig{TLSCAFile: caFile, User: "gateway", Password: "gw-secret"})
	if !nc.TLSRequired() {
		t.Fatal("connection not TLS")
	}
	roundTrip(t, nc, nc)
	// Reloading users keeps the TLS setup.
	node := newIdentity(t)
	if err := s.AddNKeyUser(nodeUser(t, node)); err != nil {
		t.Fatal(err)
	}
	bustest.Connect(t, s, bus.ClientConfig{TLSCAFile: caFile, NKeySeed: node.Seed, InboxPrefix: bus.InboxPrefix(node.NodeID)})
}
