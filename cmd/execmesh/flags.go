package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/access"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/execmesh/execmesh/gateway"
)

// Environment variables read by the client commands (the daemons read
// theirs through config.Load).
const (
	envGatewayURL    = "EXECMESH_GATEWAY_URL"
	envToken         = "EXECMESH_GATEWAY_TOKEN"
	envOperatorToken = "EXECMESH_OPERATOR_TOKEN"
	envStateDir      = "EXECMESH_STATE_DIR"
)

// operatorTokenFile is the file in the state dir that holds the operator
// token a token-less loopback gateway generates (mode 0600, one line).
const operatorTokenFile = "operator.token"

// listFlag is a repeatable string flag; with split set, each value is also
// split at commas (--keys C-c,Enter).
type listFlag struct {
	values []string
	split  bool
}

func (l *listFlag) String() string { return strings.Join(l.values, ",") }

// Type is the value's name in the help: "strings".
func (l *listFlag) Type() string { return "strings" }

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

func (f *configFlags) register(fs *pflag.FlagSet) {
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
	// $HOME from the invocation's environment, so that tests never see
	// the real home directory.
	return config.DefaultStateDir(c.getenv)
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
func (f *configFlags) load(c *cli) (config.Config, error) {
	return config.Load(f.filePath(c), c.env)
}

// clientOpt selects the optional client flags a command takes: only those
// that do something for it.
type clientOpt uint8

const (
	withSessionKey clientOpt = 1 << iota // --session-key
	withJSON                             // --json
	withOperator                         // --operator-token
)

// clientFlags are the flags of the commands that talk to a gateway.
type clientFlags struct {
	configFlags
	gatewayURL    string
	token         string
	operatorToken string
	sessionKey    string
	json          bool
}

func (f *clientFlags) register(fs *pflag.FlagSet, opts clientOpt) {
	f.configFlags.register(fs)
	fs.StringVar(&f.gatewayURL, "gateway", "", "gateway `URL` (default $"+envGatewayURL+", else http://<gateway.listen>)")
	fs.StringVar(&f.token, "token", "", "bearer `token` of the API (default $"+envToken+", else gateway.auth.token)")
	if opts&withOperator != 0 {
		f.registerOperator(fs)
	}
	f.sessionKey = gateway.DefaultSessionKey
	if opts&withSessionKey != 0 {
		fs.StringVar(&f.sessionKey, "session-key", gateway.DefaultSessionKey, "the caller's `sessionKey` (scope of sessions and events)")
	}
	if opts&withJSON != 0 {
		registerJSON(fs, &f.json, "print the raw JSON answer")
	}
}

// registerJSON adds --json and its alias -o/--output json (the spelling
// of kubectl and docker), which set the same value.
func registerJSON(fs *pflag.FlagSet, json *bool, usage string) {
	fs.BoolVar(json, "json", false, usage)
	fs.VarP(&outputFlag{json: json}, "output", "o", "output `format`: json (the same as --json) or text")
}

// outputFlag is -o/--output: "json" sets the --json value, "text" clears
// it; anything else is a usage error naming the formats.
type outputFlag struct{ json *bool }

func (o *outputFlag) String() string {
	if o.json != nil && *o.json {
		return "json"
	}
	return "text"
}

// Type is the value's name in the help.
func (o *outputFlag) Type() string { return "format" }

func (o *outputFlag) Set(v string) error {
	switch strings.ToLower(v) {
	case "json":
		*o.json = true
	case "text":
		*o.json = false
	default:
		return fmt.Errorf("unknown output format %q: want json or text", v)
	}
	return nil
}

// registerOperator adds --operator-token, for the commands that call
// operator endpoints (a subcommand of a group whose client flags are
// persistent).
func (f *clientFlags) registerOperator(fs *pflag.FlagSet) {
	fs.StringVar(&f.operatorToken, "operator-token", "", "operator `token` for decisions, pairing and approvals files (default $"+envOperatorToken+", else <state-dir>/"+operatorTokenFile+", else --token)")
}

// client loads the configuration (a bad one fails every command, naming
// the key) and returns a gateway client for the resolved URL and tokens.
func (f *clientFlags) client(c *cli) (*client, error) {
	cfg, err := f.load(c)
	if err != nil {
		return nil, err
	}
	return f.clientFor(c, cfg)
}

// run returns a cobra RunE that calls fn with a client for the flags (a
// bad configuration fails first, naming the key) and closes it after.
func (f *clientFlags) run(c *cli, fn func(ctx context.Context, cl *client, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		cl, err := f.client(c)
		if err != nil {
			return err
		}
		defer cl.close()
		return fn(cmd.Context(), cl, args)
	}
}

// clientFor returns the gateway client for an already loaded
// configuration.
func (f *clientFlags) clientFor(c *cli, cfg config.Config) (*client, error) {
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
	cl.operatorToken = f.resolveOperatorToken(c, cfg)
	return cl, nil
}

// resolveOperatorToken is --operator-token, else $EXECMESH_OPERATOR_TOKEN
// or gateway.auth.operatorToken (LoadConfig put the variable over the
// file), else the token the gateway generated in the state dir
// (--state-dir, $EXECMESH_STATE_DIR, ~/.execmesh, or the configuration's
// stateDir), else "" (operator calls then send the tool token).
func (f *clientFlags) resolveOperatorToken(c *cli, cfg config.Config) string {
	if f.operatorToken != "" {
		return f.operatorToken
	}
	if t := strings.TrimSpace(c.getenv(envOperatorToken)); t != "" {
		return t
	}
	if cfg.Gateway.Auth.OperatorToken != "" {
		return cfg.Gateway.Auth.OperatorToken
	}
	for _, dir := range []string{f.resolveStateDir(c), cfg.StateDir} {
		if tok, err := access.ReadOperatorTokenFile(dir); err == nil {
			return tok
		}
	}
	return ""
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
