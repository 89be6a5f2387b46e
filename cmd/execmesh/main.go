// Command execmesh is the one binary of execmesh: the daemons (up, gateway,
// node) and the client commands that talk to a gateway over its HTTP API
// (call, exec, process, session, events, nodes, approvals, admin, mcp) or
// edit the configuration file (config).
//
// main only wires the process to run; run decides every exit code, so tests
// drive the whole CLI in-process with buffers.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
)

// version is the CLI version; release builds override it with
// -ldflags "-X main.version=…".
var version = "0.0.0-dev"

// Exit codes decided by run.
const (
	exitOK    = 0 // success
	exitFail  = 1 // a failed call, or a tool result with status failed
	exitUsage = 2 // bad command line
)

// maxThreads raises Go's default limit of 10 000 OS threads, which aborts
// the process when reached. Running sessions hold no thread (one reaper
// per session Manager takes every exit status, see session/wait.go), but
// a node agent meant to hold 10 000 sessions and more can still have
// thousands of threads in blocking system calls at once (reads of /proc
// and of files while it ends a large process tree), so the limit must not
// be the one thing that stops it.
const maxThreads = 100_000

func main() {
	debug.SetMaxThreads(maxThreads)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one command line with the process environment and returns
// the exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return runEnv(ctx, args, environMap(os.Environ()), stdin, stdout, stderr)
}

// runEnv is run with an explicit environment, so tests can run in parallel
// without touching the process environment.
func runEnv(ctx context.Context, args []string, environ map[string]string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr, env: environ}
	return c.exitCode(c.dispatch(ctx, args))
}

// cli is one invocation: its standard streams and environment. It holds no
// state beyond them; every command builds what it needs from its flags.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	env            map[string]string
}

// getenv returns the variable from the invocation's environment.
func (c *cli) getenv(key string) string { return c.env[key] }

// command is one entry of the command table.
type command struct {
	name    string
	args    string // synopsis after the name
	summary string
	run     func(ctx context.Context, c *cli, args []string) error
}

// commands is the read-only command table, in the order `help` lists them.
// help and version are handled by dispatch itself.
var commands = []command{
	{"up", "[flags]", "embedded NATS + gateway + a local node agent, in one process", serveCmd(serveUp)},
	{"gateway", "[flags]", "the gateway alone (embedded NATS unless --nats-url)", serveCmd(serveGateway)},
	{"node", "[flags]", "a headless node agent (--nats-url, --name, --join CODE, …)", serveCmd(serveNode)},
	{"call", "[flags] [JSON]", "one tool call; JSON from the argument or stdin; prints the JSON answer", runCall},
	{"exec", "[flags] [--] CMD…", "run a command through the exec tool", runExec},
	{"process", "ACTION [SESSION-ID] [flags]", "the process tool: " + strings.Join(processActionsList(), "|"), runProcess},
	{"session", "exec [--host H] [--security S] [--ask A] [--node N]", "show or set this sessionKey's exec defaults", runSession},
	{"events", "[--wait-ms N] [--follow]", "print queued system events (exec exits, approvals)", runEvents},
	{"nodes", "list|pending|approve ID|reject ID|invite [--name N] [--ttl D]", "node registry, pairing and join codes", runNodes},
	{"approvals", "list|resolve ID allow-once|allow-always|deny", "pending exec approvals", runApprovals},
	{"admin", "blockers", "gateway administration: sessions that block a safe restart", runAdmin},
	{"mcp", "[flags]", "serve the exec and process tools as an MCP server on stdio", runMCP},
	{"config", "get [KEYPATH] | set KEYPATH VALUE | unset KEYPATH", "read or edit the JSON config file", runConfig},
	{"version", "", "print the version", nil},
	{"help", "[COMMAND]", "show this help", nil},
}

// serveCmd adapts a daemon entry point of serve.go to the command table.
func serveCmd(f func(context.Context, []string, io.Writer, io.Writer) error) func(context.Context, *cli, []string) error {
	return func(ctx context.Context, c *cli, args []string) error {
		return f(ctx, args, c.stdout, c.stderr)
	}
}

// dispatch runs the command named by args[0].
func (c *cli) dispatch(ctx context.Context, args []string) error {
	if len(args) == 0 {
		c.usage(c.stderr)
		return errSilentUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(rest) > 0 && name == "help" {
			// `execmesh help exec` is `execmesh exec -h`.
			return c.dispatch(ctx, []string{rest[0], "-h"})
		}
		c.usage(c.stdout)
		return nil
	case "version", "-version", "--version":
		fmt.Fprintln(c.stdout, "execmesh", version)
		return nil
	}
	for _, cmd := range commands {
		if cmd.name == name && cmd.run != nil {
			return cmd.run(ctx, c, rest)
		}
	}
	return usageErrorf("unknown command %q (run \"execmesh help\" for the list)", name)
}

// usage prints the command list.
func (c *cli) usage(w io.Writer) {
	fmt.Fprintln(w, "execmesh runs shell commands for AI agents, locally or on a fleet of node agents.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: execmesh COMMAND [ARGS]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, cmd := range commands {
		syn := cmd.name
		if cmd.args != "" {
			syn += " " + cmd.args
		}
		fmt.Fprintf(w, "  %s\n      %s\n", syn, cmd.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Client flags: --gateway URL (EXECMESH_GATEWAY_URL), --token T (EXECMESH_GATEWAY_TOKEN),")
	fmt.Fprintln(w, "  --session-key K (default agent:main:main), --json, --config FILE, --state-dir DIR.")
	fmt.Fprintln(w, "Run \"execmesh COMMAND -h\" for the flags of one command.")
}

// usageError is a bad command line: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errSilentUsage is a usage error whose explanation was already printed.
var errSilentUsage = &usageError{}

// errHelp means -h was asked for and the help was printed: exit 0.
var errHelp = errors.New("help requested")

// exitError ends the command with a specific status and no further message;
// what the user needs to read was printed already (the result text of a
// tool call, for instance).
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// exitCode turns a command's error into the process exit status, printing
// the message where there is one. It is the only place that decides exit
// codes.
func (c *cli) exitCode(err error) int {
	var ue *usageError
	var ee *exitError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return exitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue):
		if ue.msg != "" {
			fmt.Fprintln(c.stderr, "execmesh:", ue.msg)
		}
		return exitUsage
	default:
		fmt.Fprintln(c.stderr, "execmesh:", err)
		return exitFail
	}
}

// environMap turns os.Environ's KEY=VALUE list into a map.
func environMap(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}
