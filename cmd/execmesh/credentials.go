package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

// credentialsMark ends the comment line of every users entry that
// `nodes credentials` writes, so an operator (and the cluster tests) can
// tell them from hand-written ones in auth.conf.
const credentialsMark = "made by execmesh nodes credentials"

// maxCredentialsName bounds --name: it becomes a directory name and a
// comment in the servers' configuration.
const maxCredentialsName = 64

// localFlagsUsage is cobra's usage text without the inherited flags, for
// a command of a client group that uses none of them.
const localFlagsUsage = `Usage:
  {{.UseLine}}{{if .HasExample}}

Examples:
{{.Example}}{{end}}{{if .HasAvailableLocalFlags}}

Flags:
{{.LocalFlags.FlagUsages | trimTrailingWhitespaces}}{{end}}
`

// credentialsFlags are the flags of `execmesh nodes credentials`.
type credentialsFlags struct {
	name, out, prefix string
	gateway           bool
}

// newCredentialsCmd is `execmesh nodes credentials`: the NATS identity of
// a node (or a gateway) of an external cluster, made by the binary the
// operator already has, so deploy/ needs no Go toolchain.
func (c *cli) newCredentialsCmd() *cobra.Command {
	var f credentialsFlags
	cmd := &cobra.Command{
		Use:   "credentials --name N [--out DIR] [--prefix P] [--gateway]",
		Short: "make a node's (or a gateway's) nkey and its auth.conf users entry for an external NATS cluster",
		Long: "Make the NATS identity of one node agent for a NATS cluster of your own (deploy/nats/cluster):\n" +
			"DIR/node.nkey, the node's secret seed (mode 0600; DIR is then the node's --state-dir, or copy the\n" +
			"file into it), and DIR/node-user.conf, the node's entry of the servers' authorization users list,\n" +
			"whose permissions confine it to its own subjects. Add the entry to auth.conf on every server and\n" +
			"reload them. The node id (derived from the key) is the first line printed, the entry follows.\n" +
			"With --gateway: DIR/gateway.nkey (the gateway's nats.nkeySeedFile) and DIR/gateway-user.conf,\n" +
			"with the permissions a gateway needs; the first line printed is its public key.\n" +
			"Running it again on the same DIR keeps the key and writes the entry again. Works offline: it\n" +
			"talks to no gateway and no server.",
		Example: "  execmesh nodes credentials --name build-1 --out site/build-1\n" +
			"  NODE_ID=$(execmesh nodes credentials --name build-1 --out site/build-1 | head -n1)\n" +
			"  execmesh nodes credentials --gateway --name gw --out site/gateway",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The nodes group's client flags (--state-dir, --token, …)
			// reach this command too, but it talks to no gateway.
			var unused []string
			cmd.InheritedFlags().VisitAll(func(fl *pflag.Flag) {
				if fl.Changed {
					unused = append(unused, "--"+fl.Name)
				}
			})
			if len(unused) > 0 {
				return usageErrorf("nodes credentials: %s does not apply: it talks to no gateway and writes to --out", strings.Join(unused, ", "))
			}
			return writeCredentials(f, c.stdout, c.stderr)
		},
	}
	cmd.SetUsageTemplate(localFlagsUsage)
	fs := cmd.Flags()
	fs.StringVar(&f.name, "name", "", "`name` of the node (or gateway): the comment of its users entry, and the default --out")
	fs.StringVar(&f.out, "out", "", "output `dir`ectory, created 0700 when missing (default ./NAME); a node's is its --state-dir")
	fs.StringVar(&f.prefix, "prefix", bus.DefaultPrefix, "NATS subject `prefix` (the gateway's nats.prefix)")
	// Shadows the group's --gateway URL: this command talks to no gateway.
	fs.BoolVar(&f.gateway, "gateway", false, "make a gateway's identity instead of a node's")
	_ = cmd.MarkFlagDirname("out")
	return cmd
}

// writeCredentials checks the flags, then writes (or reuses) the seed and
// writes the users entry.
func writeCredentials(f credentialsFlags, stdout, stderr io.Writer) error {
	if err := validCredentialsName(f.name); err != nil {
		return usageErrorf("nodes credentials: --name: %v", err)
	}
	if err := protocol.ValidateSubjectPrefix(f.prefix); err != nil {
		return usageErrorf("nodes credentials: --prefix: %v", err)
	}
	dir := f.out
	if dir == "" {
		dir = f.name
	}
	if f.gateway {
		id, err := bus.LoadOrCreateGatewayIdentity(dir)
		if err != nil {
			return fmt.Errorf("nodes credentials: %w", err)
		}
		entry := renderUser(fmt.Sprintf("execmesh gateway %s (prefix %s)", f.name, f.prefix), id.PublicKey, bus.GatewayPermissions(f.prefix))
		conf := filepath.Join(dir, "gateway-user.conf")
		if err := os.WriteFile(conf, []byte(entry), 0o644); err != nil {
			return fmt.Errorf("nodes credentials: %w", err)
		}
		fmt.Fprintf(stdout, "%s\n\n%s", id.PublicKey, entry)
		fmt.Fprintf(stderr, "gateway %s (%s): seed in %s (secret: the gateway's nats.nkeySeedFile), users entry in %s (add to auth.conf on every server, then reload)\n",
			f.name, id.PublicKey, filepath.Join(dir, bus.GatewayKeyFile), conf)
		return nil
	}
	id, err := bus.LoadOrCreateNodeIdentity(dir)
	if err != nil {
		return fmt.Errorf("nodes credentials: %w", err)
	}
	u, err := bus.NodeUser(f.prefix, id.PublicKey)
	if err != nil {
		return fmt.Errorf("nodes credentials: %w", err)
	}
	entry := renderUser(fmt.Sprintf("execmesh node %s, id %s (prefix %s)", f.name, id.NodeID, f.prefix), u.PublicKey, u.Permissions)
	conf := filepath.Join(dir, "node-user.conf")
	if err := os.WriteFile(conf, []byte(entry), 0o644); err != nil {
		return fmt.Errorf("nodes credentials: %w", err)
	}
	fmt.Fprintf(stdout, "%s\n\n%s", id.NodeID, entry)
	fmt.Fprintf(stderr, "node %s (id %s): seed in %s (secret: use %s as the node's --state-dir, or copy the file into it), users entry in %s (add to auth.conf on every server, then reload)\n",
		f.name, id.NodeID, filepath.Join(dir, bus.NodeKeyFile), dir, conf)
	return nil
}

// validCredentialsName accepts what is safe both as a directory name
// (the default --out) and on the comment line of a users entry.
func validCredentialsName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("required (the node's name, such as build-1)")
	case len(name) > maxCredentialsName:
		return fmt.Errorf("%q is longer than %d characters", name, maxCredentialsName)
	case name[0] == '.' || name[0] == '-':
		return fmt.Errorf("%q must not start with %q", name, name[:1])
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("%q: only letters, digits, '-', '_' and '.' are allowed, not %q", name, r)
		}
	}
	return nil
}

// renderUser formats one element of a NATS config `users` list. Subjects
// are double-quoted (so '$' and '>' are taken literally); execmesh
// subjects never contain quotes or backslashes.
func renderUser(comment, publicKey string, p *server.Permissions) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s, %s\n", comment, credentialsMark)
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

// writeSubjects writes the allow and deny lists of one direction.
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
