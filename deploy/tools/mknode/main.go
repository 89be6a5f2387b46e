// Command mknode makes the NATS identity of one execmesh node agent (or of
// the gateway) for a NATS cluster run from deploy/nats/cluster: an nkey
// seed for the machine and the matching entry of the servers'
// `authorization { users = [ … ] }` list, with permissions that confine a
// node to its own subjects (bus.NodePermissions).
//
//	go run ./deploy/tools/mknode --prefix execmesh --out DIR
//
// writes DIR/node.nkey (the node's seed, mode 0600: copy it into the node's
// state dir, where `execmesh node --state-dir DIR` finds it) and
// DIR/node-user.conf (the users entry: add it to auth.conf on every server
// and reload them), and prints the node id on the first line of stdout,
// then the entry. Running it again on the same DIR keeps the key and
// rewrites the entry.
//
//	go run ./deploy/tools/mknode --gateway --out DIR
//
// does the same for the gateway: DIR/gateway.nkey (nats.nkeySeedFile) and
// DIR/gateway-user.conf (broad permissions under the prefix, the
// JetStream API, its stream and buckets, and reply inboxes).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "mknode:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mknode", flag.ContinueOnError)
	fs.SetOutput(stderr)
	prefix := fs.String("prefix", bus.DefaultPrefix, "execmesh NATS subject `prefix` (nats.prefix of the gateway)")
	out := fs.String("out", "", "output `dir`ectory (created 0700 if missing); for a node, use it as its --state-dir")
	gateway := fs.Bool("gateway", false, "make the gateway's identity instead of a node's")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *out == "" {
		return errors.New("--out DIR is required")
	}
	if err := protocol.ValidateSubjectPrefix(*prefix); err != nil {
		return fmt.Errorf("--prefix: %w", err)
	}
	if *gateway {
		return makeGateway(*prefix, *out, stdout, stderr)
	}
	return makeNode(*prefix, *out, stdout, stderr)
}

// makeNode writes (or reuses) DIR/node.nkey and writes DIR/node-user.conf.
func makeNode(prefix, dir string, stdout, stderr io.Writer) error {
	id, err := bus.LoadOrCreateNodeIdentity(dir)
	if err != nil {
		return err
	}
	u, err := bus.NodeUser(prefix, id.PublicKey)
	if err != nil {
		return err
	}
	entry := renderUser(fmt.Sprintf("execmesh node %s (prefix %s)", id.NodeID, prefix), u.PublicKey, u.Permissions)
	conf := filepath.Join(dir, "node-user.conf")
	if err := os.WriteFile(conf, []byte(entry), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\n\n%s", id.NodeID, entry)
	fmt.Fprintf(stderr, "mknode: node %s: seed in %s (secret: the node's --state-dir), users entry in %s (add to auth.conf on every server, then reload)\n",
		id.NodeID, filepath.Join(dir, bus.NodeKeyFile), conf)
	return nil
}

// makeGateway writes (or reuses) DIR/gateway.nkey and writes
// DIR/gateway-user.conf.
func makeGateway(prefix, dir string, stdout, stderr io.Writer) error {
	id, err := bus.LoadOrCreateGatewayIdentity(dir)
	if err != nil {
		return err
	}
	entry := renderUser(fmt.Sprintf("execmesh gateway (prefix %s)", prefix), id.PublicKey, bus.GatewayPermissions(prefix))
	conf := filepath.Join(dir, "gateway-user.conf")
	if err := os.WriteFile(conf, []byte(entry), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\n\n%s", id.PublicKey, entry)
	fmt.Fprintf(stderr, "mknode: gateway %s: seed in %s (secret: nats.nkeySeedFile), users entry in %s\n",
		id.PublicKey, filepath.Join(dir, bus.GatewayKeyFile), conf)
	return nil
}

// renderUser formats one element of a NATS config `users` list. Subjects
// are double-quoted (so '$' and '>' are taken literally); execmesh
// subjects never contain quotes or backslashes.
func renderUser(comment, publicKey string, p *server.Permissions) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s, made by deploy/tools/mknode\n", comment)
	b.WriteString("{\n")
	fmt.Fprintf(&b, "  nkey: %q\n", publicKey)
	if p != nil {
		b.WriteString("  permissions: {\n")
		writeSubjects(&b, "publish", p.Publish)
		writeSubjects(&b, "subscribe", p.Subscribe)
		if r := p.Response; r != nil {
			fmt.Fprintf(&b, "    allow_responses: { max: %d, expires: %q }\n", r.MaxMsgs, r.Expires.String())
		}
		b.WriteString("  }\n")
	}
	b.WriteString("}\n")
	return b.String()
}

func writeSubjects(b *strings.Builder, key string, sp *server.SubjectPermission) {
	if sp == nil {
		return
	}
	fmt.Fprintf(b, "    %s: {\n", key)
	list := func(name string, subjects []string) {
		if len(subjects) == 0 {
			return
		}
		fmt.Fprintf(b, "      %s: [\n", name)
		for _, s := range subjects {
			fmt.Fprintf(b, "        %q\n", s)
		}
		b.WriteString("      ]\n")
	}
	list("allow", sp.Allow)
	list("deny", sp.Deny)
	b.WriteString("    }\n")
}
