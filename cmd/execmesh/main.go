// Command execmesh is the one binary of execmesh: the daemons (up, gateway,
// node) and the client commands that talk to a gateway over its HTTP API
// (call, exec, process, session, events, nodes, approvals, admin, mcp) or
// edit the configuration file (config).
//
// The command line is a github.com/spf13/cobra tree built afresh for every
// invocation (newRootCmd), with GNU-style flags (pflag), shell completion
// (`execmesh completion bash|zsh|fish`) and man pages generated from the
// same tree (`execmesh man DIR`, `make man`).
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

	"github.com/spf13/cobra"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/confine"
)

// Exit codes decided by run. A command run by `exec` passes its own exit
// status through instead (see exitStatus).
const (
	exitOK    = 0 // success
	exitFail  = 1 // a failed call, or a tool result with status failed
	exitUsage = 2 // bad command line, found before any request was sent
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
	// A confined command's helper is this binary started again: it sets
	// up the confinement and becomes the command, before anything else.
	confine.RunHelperIfRequested()
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
	root := c.newRootCmd()
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	return c.exitCode(cmd, err)
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

// Command groups of the top-level help.
const (
	groupDaemon = "daemon"
	groupClient = "client"
	groupOther  = "other"
)

// newRootCmd builds the command tree of one invocation.
func (c *cli) newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "execmesh",
		Short: "execmesh runs shell commands for AI agents, locally or on a fleet of node agents.",
		Long: "execmesh runs shell commands for AI agents, locally or on a fleet of node agents over NATS,\n" +
			"and keeps long-running commands as pollable background sessions (OpenClaw's exec and process tools).",
		Version: buildVersion().short(),
		// "did you mean" for a command two edits away.
		SuggestionsMinimumDistance: 2,
		// Errors and usage hints are printed by exitCode, once.
		SilenceErrors: true,
		SilenceUsage:  true,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			msg := fmt.Sprintf("unknown command %q", args[0])
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += fmt.Sprintf(" (did you mean %q?)", s[0])
			}
			return usageErrorf("%s; run \"execmesh help\" for the list", msg)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			// No command: the help, on stderr, as a usage error.
			cmd.SetOut(c.stderr)
			_ = cmd.Usage()
			return errSilentUsage
		},
	}
	root.SetIn(c.stdin)
	root.SetOut(c.stdout)
	root.SetErr(c.stderr)
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &usageError{msg: err.Error()}
	})
	root.AddGroup(
		&cobra.Group{ID: groupDaemon, Title: "Daemons:"},
		&cobra.Group{ID: groupClient, Title: "Client commands (they talk to a gateway over its HTTP API):"},
		&cobra.Group{ID: groupOther, Title: "Other:"},
	)
	// Help needs no configuration file: a broken one is named, not fatal.
	help := root.HelpFunc()
	root.SetHelpFunc(func(cmd *cobra.Command, args []string) {
		c.noteIgnoredConfig(cmd)
		help(cmd, args)
	})
	root.SetHelpCommandGroupID(groupOther)
	root.SetCompletionCommandGroupID(groupOther)
	root.CompletionOptions.HiddenDefaultCmd = false

	var order []*cobra.Command
	add := func(group string, cmds ...*cobra.Command) {
		for _, cmd := range cmds {
			cmd.GroupID = group
			root.AddCommand(cmd)
			order = append(order, cmd)
		}
	}
	add(groupDaemon, c.newUpCmd(), c.newGatewayCmd(), c.newNodeCmd())
	add(groupClient, c.newExecCmd(), c.newAttachCmd(), c.newLogsCmd(), c.newCallCmd(), c.newProcessCmd(), c.newSessionCmd(), c.newEventsCmd(),
		c.newNodesCmd(), c.newGatewaysCmd(), c.newApprovalsCmd(), c.newAdminCmd(), c.newReloadCmd(), c.newMCPCmd(), c.newConfigCmd())
	add(groupOther, c.newVersionCmd())
	root.AddCommand(c.newManCmd(root))
	// cobra's completion command, made now so that it is a command like
	// the others: its own summary, and a usage error for an unknown shell.
	root.InitDefaultCompletionCmd()
	if comp, _, err := root.Find([]string{"completion"}); err == nil && comp != root {
		comp.Short = "print the shell completion script: bash, zsh, fish or powershell"
		comp.Example = "  source <(execmesh completion bash)\n  execmesh completion zsh > \"${fpath[1]}/_execmesh\"\n  execmesh completion fish > ~/.config/fish/completions/execmesh.fish"
		groupCmd(comp)
	}
	setRootUsage(root, order)
	return root
}

// usageError is a bad command line: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errSilentUsage is a usage error whose explanation was already printed.
var errSilentUsage = &usageError{}

// exitError ends the command with a specific status and no further message;
// what the user needs to read was printed already (the result text of a
// tool call, for instance).
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// exitCode turns a command's error into the process exit status, printing
// the message where there is one. It is the only place that decides exit
// codes. cmd is the command that ran (or failed to parse), for the hint
// that points at its help.
func (c *cli) exitCode(cmd *cobra.Command, err error) int {
	var ue *usageError
	var ee *exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue):
		if ue.msg != "" {
			fmt.Fprintln(c.stderr, "execmesh:", ue.msg)
			if cmd != nil && cmd.HasParent() {
				fmt.Fprintf(c.stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
			}
		}
		return exitUsage
	default:
		fmt.Fprintln(c.stderr, "execmesh:", err)
		return exitFail
	}
}

// noteIgnoredConfig says on stderr that cmd, which does not need the
// configuration file, ignores it because it is unusable (not JSON, with
// line and column, or a bad key): the commands that need it fail with the
// same message, so the user learns of it from whichever runs first.
func (c *cli) noteIgnoredConfig(cmd *cobra.Command) {
	var f configFlags
	if fl := cmd.Flags().Lookup("config"); fl != nil {
		f.path = fl.Value.String()
	}
	if fl := cmd.Flags().Lookup("state-dir"); fl != nil {
		f.stateDir = fl.Value.String()
	}
	file := f.filePath(c)
	if file == "" {
		return
	}
	if err := config.CheckFile(file); err != nil {
		fmt.Fprintf(c.stderr, "execmesh: ignoring the configuration file (%s does not need it): %v\n", cmd.CommandPath(), err)
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
