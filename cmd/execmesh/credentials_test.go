package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/execmesh/execmesh/bus"
)

// TestNodesCredentials: `nodes credentials` writes a node's seed (0600)
// and a users entry that nats-server loads with exactly
// bus.NodePermissions of the id it prints first; a gateway's with
// bus.GatewayPermissions; a second run on the same directory keeps the
// key; --out defaults to ./NAME.
func TestNodesCredentials(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		gateway bool
		prefix  string
	}{
		{name: "node", args: []string{"--name", "build-1"}, prefix: bus.DefaultPrefix},
		{name: "node with a prefix", args: []string{"--name", "build-2", "--prefix", "team_a"}, prefix: "team_a"},
		{name: "gateway", args: []string{"--name", "gw", "--gateway"}, gateway: true, prefix: bus.DefaultPrefix},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "site", "x")
			args := append([]string{"nodes", "credentials", "--out", dir}, tc.args...)
			r := runCLI(t, nil, "", args...)
			if r.code != 0 {
				t.Fatalf("exit %d: %s", r.code, r.stderr)
			}
			seedFile, entryFile := filepath.Join(dir, bus.NodeKeyFile), filepath.Join(dir, "node-user.conf")
			if tc.gateway {
				seedFile, entryFile = filepath.Join(dir, bus.GatewayKeyFile), filepath.Join(dir, "gateway-user.conf")
			}
			st, err := os.Stat(seedFile)
			if err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("seed %s: %v %v, want mode 0600", seedFile, st, err)
			}
			seed, _ := os.ReadFile(seedFile)
			id, err := bus.IdentityFromSeed(seed)
			if err != nil {
				t.Fatal(err)
			}
			first, rest, _ := strings.Cut(r.stdout, "\n")
			want := id.NodeID
			if tc.gateway {
				want = id.PublicKey
			}
			if first != want {
				t.Fatalf("first line %q, want %q", first, want)
			}
			entry, err := os.ReadFile(entryFile)
			if err != nil {
				t.Fatal(err)
			}
			if rest != "\n"+string(entry) {
				t.Fatalf("printed entry differs from %s:\n%s", entryFile, r.stdout)
			}
			wantPerms := bus.GatewayPermissions(tc.prefix)
			if !tc.gateway {
				if wantPerms, err = bus.NodePermissions(tc.prefix, id.NodeID); err != nil {
					t.Fatal(err)
				}
			}
			u := loadUsersEntry(t, string(entry))
			if u.Nkey != id.PublicKey || !reflect.DeepEqual(u.Permissions, wantPerms) {
				t.Fatalf("nats-server loads %s %+v, want %s %+v", u.Nkey, u.Permissions, id.PublicKey, wantPerms)
			}

			again := runCLI(t, nil, "", args...)
			if again.code != 0 || again.stdout != r.stdout {
				t.Fatalf("second run (exit %d) printed\n%s\nwant the same key and entry\n%s", again.code, again.stdout, r.stdout)
			}
		})
	}
}

// TestNodesCredentialsOutDefault: without --out the files go to ./NAME.
// Not parallel: it changes the working directory.
func TestNodesCredentialsOutDefault(t *testing.T) {
	wd := t.TempDir()
	t.Chdir(wd)
	r := runCLI(t, nil, "", "nodes", "credentials", "--name", "build-3")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, f := range []string{bus.NodeKeyFile, "node-user.conf"} {
		if _, err := os.Stat(filepath.Join(wd, "build-3", f)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNodesCredentialsBadInput: a bad command line is a usage error
// (exit 2) that names the flag; a directory that cannot be written is an
// error (exit 1) that names the path. Nothing is written for either.
func TestNodesCredentialsBadInput(t *testing.T) {
	t.Parallel()
	blocker := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"no name", []string{}, 2, "--name: required"},
		{"name with a slash", []string{"--name", "build/1"}, 2, "only letters, digits"},
		{"name with a space", []string{"--name", "build 1"}, 2, "only letters, digits"},
		{"name starting with a dot", []string{"--name", ".hidden"}, 2, "must not start with"},
		{"name too long", []string{"--name", strings.Repeat("n", 65)}, 2, "longer than 64"},
		{"prefix with a dot", []string{"--name", "n", "--prefix", "a.b"}, 2, "--prefix"},
		{"prefix with a wildcard", []string{"--name", "n", "--prefix", ">"}, 2, "--prefix"},
		{"extra argument", []string{"--name", "n", "extra"}, 2, "unexpected argument"},
		{"a client flag", []string{"--name", "n", "--state-dir", "/tmp/x"}, 2, "--state-dir does not apply"},
		{"client flags", []string{"--name", "n", "--token", "t", "--json"}, 2, "--json, --token does not apply"},
		{"out is a file", []string{"--name", "n", "--out", blocker}, 1, blocker},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out := filepath.Join(t.TempDir(), "out")
			args := append([]string{"nodes", "credentials"}, tc.args...)
			if !slices.Contains(tc.args, "--out") {
				args = append(args, "--out", out)
			}
			r := runCLI(t, nil, "", args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.stderr) || r.stdout != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d and %q", r.code, r.stdout, r.stderr, tc.code, tc.stderr)
			}
			if _, err := os.Stat(out); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("%s written (%v)", out, err)
			}
		})
	}
}

// TestAuthConfGatewayEntry keeps deploy/nats/cluster/auth.conf's gateway
// entry what `nodes credentials --gateway --name gw` writes: a gateway
// given fewer permissions than it needs fails on a real cluster with
// permissions violations (its session index, approvals and micro
// service).
func TestAuthConfGatewayEntry(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../deploy/nats/cluster/auth.conf")
	if err != nil {
		t.Fatal(err)
	}
	want := renderUser("execmesh gateway gw (prefix execmesh)", "REPLACE_WITH_GATEWAY_NKEY", bus.GatewayPermissions(bus.DefaultPrefix))
	var ind strings.Builder
	for l := range strings.SplitSeq(strings.TrimRight(want, "\n"), "\n") {
		ind.WriteString("    " + l + "\n")
	}
	if !strings.Contains(string(b), ind.String()) {
		t.Fatalf("auth.conf's gateway entry is not what nodes credentials --gateway writes; replace it with:\n%s", ind.String())
	}
}

// loadUsersEntry loads one users entry the way a server of
// deploy/nats/cluster does (inside authorization { users = [ … ] }).
func loadUsersEntry(t *testing.T, entry string) *server.NkeyUser {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "auth.conf")
	if err := os.WriteFile(conf, []byte("authorization {\n  users = [\n"+entry+"  ]\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("the entry does not load: %v\n%s", err, entry)
	}
	if len(o.Nkeys) != 1 {
		t.Fatalf("the entry loads %d nkey users", len(o.Nkeys))
	}
	return o.Nkeys[0]
}
