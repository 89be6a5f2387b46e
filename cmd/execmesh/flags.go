package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/execmesh/execmesh/gateway"
)

// Environment variables read by the client commands (the daemons read
// theirs through gateway.LoadConfig).
const (
	envGatewayURL = "EXECMESH_GATEWAY_URL"
	envToken      = "EXECMESH_GATEWAY_TOKEN"
	envStateDir   = "EXECMESH_STATE_DIR"
)

// newFlagSet returns a FlagSet that reports errors to the caller instead of
// printing or exiting; usage text is printed by parseFlags.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("execmesh "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// printFlagUsage prints "usage: execmesh NAME SYNOPSIS" and the flags.
func printFlagUsage(w io.Writer, fs *flag.FlagSet, synopsis string) {
	fmt.Fprintf(w, "usage: %s %s\n", fs.Name(), synopsis)
	var any bool
	fs.VisitAll(func(*flag.Flag) { any = true })
	if !any {
		return
	}
	fmt.Fprintln(w, "\nflags:")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// parseFlags parses args with fs. When interspersed is true, flags may
// appear before, between or after positional arguments, up to a "--" that
// ends them; otherwise parsing stops at the first positional argument (exec
// needs this: everything after the command's first word is the command's).
// -h prints the usage to stdout and returns errHelp; a bad flag is a usage
// error that carries the usage text.
func (c *cli) parseFlags(fs *flag.FlagSet, synopsis string, args []string, interspersed bool) ([]string, error) {
	pos, err := parseArgs(fs, args, interspersed)
	switch {
	case errors.Is(err, flag.ErrHelp):
		printFlagUsage(c.stdout, fs, synopsis)
		return nil, errHelp
	case err != nil:
		fmt.Fprintf(c.stderr, "execmesh: %v\n", err)
		printFlagUsage(c.stderr, fs, synopsis)
		return nil, errSilentUsage
	}
	return pos, nil
}

func parseArgs(fs *flag.FlagSet, args []string, interspersed bool) ([]string, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if !interspersed {
		return fs.Args(), nil
	}
	var pos []string
	for {
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// flag.Parse consumes a "--" and stops right after it: everything
		// from there on is positional.
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
	}
}

// isSet reports whether the flag name was given on the command line, so
// that "absent" and "zero" stay distinct in tool arguments.
func isSet(fs *flag.FlagSet, name string) bool {
	var set bool
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}

// listFlag is a repeatable string flag; with split set, each value is also
// split at commas (--keys C-c,Enter).
type listFlag struct {
	values []string
	split  bool
}

func (l *listFlag) String() string { return strings.Join(l.values, ",") }

func (l *listFlag) Set(v string) error {
	if !l.split {
		l.values = append(l.values, v)
		return nil
	}
	for part := range strings.SplitSeq(v, ",") {
		if part = strings.TrimSpace(part); part != "" {
			l.values = append(l.values, part)
		}
	}
	return nil
}

// configFlags locate the configuration file.
type configFlags struct {
	path     string
	stateDir string
}

func (f *configFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.path, "config", "", "configuration `file` (default <state-dir>/config.json when it exists)")
	fs.StringVar(&f.stateDir, "state-dir", "", "state `dir`ectory (default $"+envStateDir+", else ~/.execmesh)")
}

// resolveStateDir returns the state directory from the flag, the
// environment, or ~/.execmesh.
func (f *configFlags) resolveStateDir(c *cli) string {
	if f.stateDir != "" {
		return f.stateDir
	}
	if d := c.getenv(envStateDir); d != "" {
		return d
	}
	// $HOME from the invocation's environment, as os.UserHomeDir reads
	// it, so that tests never see the real home directory.
	if home := c.getenv("HOME"); home != "" {
		return filepath.Join(home, ".execmesh")
	}
	return ".execmesh"
}

// filePath returns the configuration file to read: --config, else
// <state-dir>/config.json when it exists, else "" (defaults only).
func (f *configFlags) filePath(c *cli) string {
	if f.path != "" {
		return f.path
	}
	p := filepath.Join(f.resolveStateDir(c), "config.json")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return ""
}

// editPath returns the configuration file `config set` writes: --config,
// else <state-dir>/config.json, existing or not.
func (f *configFlags) editPath(c *cli) string {
	if f.path != "" {
		return f.path
	}
	return filepath.Join(f.resolveStateDir(c), "config.json")
}

// load reads the configuration as the daemons do (defaults, file,
// EXECMESH_* variables) and validates it. Errors name the bad key.
func (f *configFlags) load(c *cli) (gateway.Config, error) {
	return gateway.LoadConfig(f.filePath(c), c.env)
}

// clientFlags are the flags every client command takes.
type clientFlags struct {
	configFlags
	gatewayURL string
	token      string
	sessionKey string
	json       bool
}

func (f *clientFlags) register(fs *flag.FlagSet) {
	f.configFlags.register(fs)
	fs.StringVar(&f.gatewayURL, "gateway", "", "gateway `URL` (default $"+envGatewayURL+", else http://<gateway.listen>)")
	fs.StringVar(&f.token, "token", "", "bearer `token` (default $"+envToken+", else gateway.auth.token)")
	fs.StringVar(&f.sessionKey, "session-key", gateway.DefaultSessionKey, "the caller's `sessionKey` (scope of sessions and events)")
	fs.BoolVar(&f.json, "json", false, "print the raw JSON answer")
}

// parseAndConnect parses args with c.parseFlags and opens the client the
// flags describe: the preamble of every command that talks to a gateway.
// The caller closes the client.
func (f *clientFlags) parseAndConnect(c *cli, fs *flag.FlagSet, synopsis string, args []string, interspersed bool) ([]string, *client, error) {
	pos, err := c.parseFlags(fs, synopsis, args, interspersed)
	if err != nil {
		return nil, nil, err
	}
	cl, err := f.client(c)
	if err != nil {
		return nil, nil, err
	}
	return pos, cl, nil
}

// client loads the configuration (a bad one fails every command, naming
// the key) and returns a gateway client for the resolved URL and token.
func (f *clientFlags) client(c *cli) (*client, error) {
	cfg, err := f.load(c)
	if err != nil {
		return nil, err
	}
	base := f.gatewayURL
	if base == "" {
		base = c.getenv(envGatewayURL)
	}
	if base == "" {
		base = listenURL(cfg.Gateway.Listen)
	}
	u, err := normalizeURL(base)
	if err != nil {
		return nil, err
	}
	token := f.token
	if token == "" {
		// LoadConfig already put $EXECMESH_GATEWAY_TOKEN over the file's.
		token = cfg.Gateway.Auth.Token
	}
	cl := newClient(u, token)
	cl.operatorToken = f.operatorTokenFor(c, cfg)
	return cl, nil
}

// listenURL turns a listen address into a URL a client can dial: a
// wildcard or empty host means this machine.
func listenURL(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "http://" + listen
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return "http://" + net.JoinHostPort(host, port)
}

// normalizeURL accepts "host:port" as well as a full http(s) URL and drops
// a trailing slash.
func normalizeURL(s string) (string, error) {
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("invalid gateway URL %q: %w", s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("invalid gateway URL %q: want http://host:port or https://host:port", s)
	}
	return strings.TrimRight(u.String(), "/"), nil
}
