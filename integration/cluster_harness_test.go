package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/execmesh/execmesh/bus"
)

// This file holds the helpers of the cluster tests (cluster_*_test.go):
// the deploy/ files rendered into a temporary copy, the official
// nats-server binary, `execmesh nodes credentials` and the test CA. The shipped files
// are the tested files: rendering only replaces the placeholders,
// addresses and paths the deploy README tells an operator to replace, and
// fails when one of them is missing from the shipped file.

// clNATSServerBinary builds the official nats-server from the module
// already required by go.mod (offline, from the module cache). The binary
// is kept in the user's cache directory under its module version, so
// later runs reuse it.
var clNATSServerBinary = sync.OnceValues(func() (string, error) {
	const mod = "github.com/nats-io/nats-server/v2"
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	// Test binaries carry no module list (debug.ReadBuildInfo), so ask go.
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", mod)
	cmd.Dir = root
	out, err := cmd.Output()
	version := strings.TrimSpace(string(out))
	if err != nil || version == "" {
		return "", fmt.Errorf("go list -m %s: %v", mod, err)
	}
	dir, err := clBinDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "nats-server-"+version)
	if st, err := os.Stat(bin); err == nil && st.Mode().IsRegular() {
		return bin, nil
	}
	return bin, clGoBuild(bin, mod)
})

// clBinDir is <user cache dir>/execmesh-cluster-test (testTemp, which
// TestMain removes, when there is no cache directory).
var clBinDir = sync.OnceValues(func() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return testTemp.get()
	}
	dir := filepath.Join(base, "execmesh-cluster-test")
	return dir, os.MkdirAll(dir, 0o755)
})

// clGoBuild builds pkg into bin through a temporary file renamed into
// place, so a concurrent run never executes a half-written binary.
func clGoBuild(bin, pkg string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	tmp := fmt.Sprintf("%s.tmp%d", bin, os.Getpid())
	cmd := exec.Command("go", "build", "-o", tmp, pkg)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	return os.Rename(tmp, bin)
}

// clDeployPath returns the path of a shipped file below deploy/.
func clDeployPath(t *testing.T, rel string) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "deploy", filepath.FromSlash(rel))
}

// clRender copies the shipped file src (relative to deploy/) to dst,
// replacing each old string of pairs (old1, new1, old2, new2, …)
// everywhere. A missing old string fails the test: the test and the
// shipped file have drifted apart.
func clRender(t *testing.T, src, dst string, mode os.FileMode, pairs ...string) string {
	t.Helper()
	if len(pairs)%2 != 0 {
		t.Fatalf("clRender %s: odd replacement list", src)
	}
	b, err := os.ReadFile(clDeployPath(t, src))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for i := 0; i < len(pairs); i += 2 {
		if !strings.Contains(s, pairs[i]) {
			t.Fatalf("shipped deploy/%s no longer contains %q: update the cluster tests (and deploy/README.md) with it", src, pairs[i])
		}
		s = strings.ReplaceAll(s, pairs[i], pairs[i+1])
	}
	if i := strings.Index(s, "REPLACE_WITH_"); i >= 0 {
		t.Fatalf("deploy/%s: placeholder left after rendering: %q", src, s[i:min(len(s), i+40)])
	}
	if err := os.WriteFile(dst, []byte(s), mode); err != nil {
		t.Fatal(err)
	}
	return dst
}

// clMakeTLS runs deploy/tls/make-test-ca.sh into dir with the given
// server specs (NAME[,SAN…]).
func clMakeTLS(t *testing.T, dir string, specs ...string) {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("SKIPPING: openssl is not installed; deploy/tls/make-test-ca.sh needs it")
	}
	cmd := exec.Command(clDeployPath(t, "tls/make-test-ca.sh"), append([]string{dir}, specs...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make-test-ca.sh: %v\n%s", err, out)
	}
}

// clIdentity is what `execmesh nodes credentials` made: the seed file,
// the public key and node id, and the users entry.
type clIdentity struct {
	Dir       string // --out
	SeedFile  string
	PublicKey string
	NodeID    string // "" for the gateway
	Entry     string // node-user.conf or gateway-user.conf
}

// clCredentials runs `execmesh nodes credentials --name <base of dir>
// --out dir` (with --gateway when gateway is set), the binary an operator
// has, and checks what it wrote.
func clCredentials(t *testing.T, dir string, gateway bool) clIdentity {
	t.Helper()
	args := []string{"nodes", "credentials", "--name", filepath.Base(dir), "--prefix", bus.DefaultPrefix, "--out", dir}
	if gateway {
		args = append(args, "--gateway")
	}
	r := runBinary(t, "/", nil, "", args...)
	if r.code != 0 {
		t.Fatalf("execmesh %v: exit %d\n%s", args, r.code, r.stderr)
	}
	first, _, _ := strings.Cut(r.stdout, "\n")
	id := clIdentity{Dir: dir}
	entryFile, seedFile := "node-user.conf", bus.NodeKeyFile
	if gateway {
		entryFile, seedFile = "gateway-user.conf", "gateway.nkey"
	}
	id.SeedFile = filepath.Join(dir, seedFile)
	seed, err := os.ReadFile(id.SeedFile)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(id.SeedFile); st == nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("nodes credentials: %s is not mode 0600", id.SeedFile)
	}
	ident, err := bus.IdentityFromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	id.PublicKey = ident.PublicKey
	if gateway {
		if first != ident.PublicKey {
			t.Fatalf("nodes credentials --gateway printed %q, seed has %s", first, ident.PublicKey)
		}
	} else {
		id.NodeID = ident.NodeID
		if first != ident.NodeID {
			t.Fatalf("nodes credentials printed node id %q, seed gives %s", first, ident.NodeID)
		}
	}
	entry, err := os.ReadFile(filepath.Join(dir, entryFile))
	if err != nil {
		t.Fatal(err)
	}
	id.Entry = string(entry)
	if !strings.Contains(r.stdout, id.Entry) {
		t.Fatalf("nodes credentials printed an entry different from %s", entryFile)
	}
	return id
}

// clSite says how the shipped cluster configs are rendered for a test:
// where each server listens and how the others reach it, and where
// secrets, certificates and stores are.
type clSite struct {
	Dir          string    // output directory: nats-N.conf, auth.conf
	TLSDir       string    // make-test-ca.sh output
	ClientListen [3]string // replaces 0.0.0.0:4222 ("" keeps it)
	HTTPListen   [3]string // replaces 127.0.0.1:8222 ("" keeps it)
	RouteListen  [3]string // replaces 0.0.0.0:6222 ("" keeps it)
	RouteAddr    [3]string // replaces nats-N:6222 in the routes ("" keeps it)
	StoreDir     [3]string // replaces /var/lib/nats/jetstream
	// NoClientAdvertise comments out client_advertise: a loopback cluster
	// on random ports has no name and port to advertise.
	NoClientAdvertise bool
	RoutePassword     string
	GatewayNKey       string
	NodeEntries       []string // node-user.conf contents, appended below the marker
}

// clNodeEntrySed is the sed script of deploy/README.md (step 4) that
// appends a node's users entry below the marker line of auth.conf; the
// tests run it as documented.
const clNodeEntrySed = `/^ *# --- node entries ---$/r `

// render writes the three server configs and auth.conf into s.Dir and
// returns the server config paths.
func (s clSite) render(t *testing.T) [3]string {
	t.Helper()
	auth := clRender(t, "nats/cluster/auth.conf", filepath.Join(s.Dir, "auth.conf"), 0o600,
		"REPLACE_WITH_GATEWAY_NKEY", s.GatewayNKey)
	for i, e := range s.NodeEntries {
		f := filepath.Join(s.Dir, fmt.Sprintf("node-user-%d.conf", i))
		if err := os.WriteFile(f, []byte(e), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("sed", "-i", clNodeEntrySed+f, auth).CombinedOutput(); err != nil {
			t.Fatalf("sed (deploy/README.md step 4): %v: %s", err, out)
		}
	}
	if n := len(s.NodeEntries); n > 0 {
		b, _ := os.ReadFile(auth)
		if got := strings.Count(string(b), "made by execmesh nodes credentials"); got != n+1 {
			t.Fatalf("auth.conf after the README's sed holds %d entries of nodes credentials, want %d", got, n+1)
		}
	}
	var paths [3]string
	for i := range 3 {
		name := fmt.Sprintf("nats-%d", i+1)
		pairs := []string{
			"REPLACE_WITH_ROUTE_PASSWORD", s.RoutePassword,
			"/etc/nats/tls/", s.TLSDir + "/",
			"/var/lib/nats/jetstream", s.StoreDir[i],
		}
		keep := func(old, repl string) {
			if repl != "" {
				pairs = append(pairs, old, repl)
			}
		}
		keep("0.0.0.0:4222", s.ClientListen[i])
		keep("127.0.0.1:8222", s.HTTPListen[i])
		keep("0.0.0.0:6222", s.RouteListen[i])
		if s.NoClientAdvertise {
			pairs = append(pairs, "\nclient_advertise:", "\n# client_advertise:")
		}
		for j := range 3 {
			if s.RouteAddr[j] != "" {
				pairs = append(pairs, fmt.Sprintf("@nats-%d:6222", j+1), "@"+s.RouteAddr[j])
			}
		}
		paths[i] = clRender(t, "nats/cluster/"+name+".conf", filepath.Join(s.Dir, name+".conf"), 0o600, pairs...)
	}
	return paths
}

// clEnvFile reads KEY=VALUE lines (comments and blank lines skipped), as
// systemd's EnvironmentFile= does for these simple files.
func clEnvFile(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var env []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !strings.Contains(line, "=") {
			t.Fatalf("%s: not KEY=VALUE: %q", path, line)
		}
		env = append(env, line)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return env
}

// clCheckFor retries f every interval until it returns nil, and fails
// the test with f's last error when total has passed (bustest.CheckFor
// for *testing.T users that want the what in the message).
func clCheckFor(t *testing.T, what string, total, interval time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	var err error
	for {
		if err = f(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s: %v", what, total, err)
		}
		time.Sleep(interval)
	}
}

// clCtx returns a context bounded by d and the test.
func clCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}
