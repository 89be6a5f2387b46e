package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/mcpserver"
	"github.com/execmesh/execmesh/protocol"
)

// newMCPCmd is `execmesh mcp`: the exec and process tools (and apply_patch
// where the gateway serves it) as an MCP server over stdio, forwarding to
// a gateway (--gateway, --token, --session-key) or, with --embedded, to a
// private in-process gateway.
func (c *cli) newMCPCmd() *cobra.Command {
	var f clientFlags
	var embedded, structured bool
	var workdir, printConfig string
	cmd := &cobra.Command{
		Use:   "mcp [--embedded]",
		Short: "serve the exec and process tools as an MCP server on stdio",
		Long: "Serve the exec and process tools (and apply_patch when the gateway has\n" +
			"tools.exec.applyPatch.enabled) to an MCP client on stdin/stdout, forwarding every call to a\n" +
			"running gateway; with --embedded to a private in-process gateway instead (host=gateway only,\n" +
			"and nothing can answer an approval from outside). Exit notices of background sessions arrive\n" +
			"as MCP log messages.\n\n" +
			"Working directory of exec calls that name none: --workdir, else, when the gateway runs on this\n" +
			"machine and the call is not sent to a node, the directory the MCP client started execmesh in,\n" +
			"as execmesh exec does; otherwise the gateway's default. A workdir in the call wins.\n\n" +
			"A result is its text alone unless --structured-content asks for the details object as\n" +
			"structured content too. Exit notices go as log messages to a client that sets a logging level,\n" +
			"and otherwise at the end of its next tool result.\n\n" +
			"--print-config openclaw prints OpenClaw's configuration for this server (tested with OpenClaw\n" +
			"" + openclawTested + "): the gateway, token and --session-key given, OpenClaw's own exec and process\n" +
			"tools denied and Tool Search off; openclaw-http the same for the gateway's /mcp endpoint.\n" +
			"OpenClaw passes an MCP server nothing that names its session, so every session of an agent\n" +
			"shares the --session-key (agent:<agentId>:main is the stable choice: it survives OpenClaw\n" +
			"restarting the server); give each agent its own server and key.",
		Example: "  claude mcp add execmesh -- execmesh mcp\n" +
			"  execmesh mcp --print-config openclaw > execmesh-openclaw.json\n" +
			"  execmesh mcp --session-key agent:coder:main\n" +
			"  execmesh mcp --embedded --config ~/.config/execmesh-mcp.json",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if printConfig != "" {
				return c.printMCPConfig(&f, printConfig)
			}
			return c.runMCP(cmd.Context(), &f, embedded, structured, workdir)
		},
	}
	f.register(cmd.Flags(), withSessionKey)
	cmd.Flags().BoolVar(&embedded, "embedded", false, "run a private in-process gateway (host=gateway only) instead of calling one")
	cmd.Flags().StringVar(&workdir, "workdir", "", "working `dir`ectory of exec calls that name none (default: the current directory when the gateway is local, see above)")
	_ = cmd.MarkFlagDirname("workdir")
	cmd.Flags().BoolVar(&structured, "structured-content", false, "return each result's details object as structured content beside its text")
	cmd.Flags().StringVar(&printConfig, "print-config", "", "print an MCP client's configuration for this server and exit: `client` openclaw (stdio) or openclaw-http")
	return cmd
}

// openclawTested is the OpenClaw release the printed configuration was
// tested with (integration/openclaw runs it).
const openclawTested = "2026.9.6"

// openclawRequestTimeoutMs is OpenClaw's per-call limit for the server: a
// call may yield for up to 120 s before it returns, and OpenClaw's default
// (60 s) would cut it short.
const openclawRequestTimeoutMs = 150000

// printMCPConfig prints an MCP client's configuration for this server,
// with the flags' gateway URL, token and sessionKey, as JSON.
func (c *cli) printMCPConfig(f *clientFlags, client string) error {
	cl, err := f.client(c)
	if err != nil {
		return err
	}
	defer cl.close()
	var server map[string]any
	switch client {
	case "openclaw":
		env := map[string]string{envGatewayURL: cl.base}
		if cl.token != "" {
			env[envToken] = cl.token
		}
		server = map[string]any{
			"command":          c.selfCommand(),
			"args":             []string{"mcp", "--session-key", f.sessionKey},
			"env":              env,
			"requestTimeoutMs": openclawRequestTimeoutMs,
		}
	case "openclaw-http":
		headers := map[string]string{mcpserver.SessionKeyHeader: f.sessionKey}
		if cl.token != "" {
			headers["Authorization"] = "Bearer " + cl.token
		}
		server = map[string]any{
			"url":              cl.base + "/mcp",
			"transport":        "streamable-http",
			"headers":          headers,
			"requestTimeoutMs": openclawRequestTimeoutMs,
		}
	default:
		return fmt.Errorf("--print-config %q: want openclaw or openclaw-http", client)
	}
	out := map[string]any{
		// OpenClaw's own exec and process would shadow execmesh's, and its
		// Tool Search (on by default) hides MCP tools behind a search.
		"tools": map[string]any{"profile": "coding", "deny": []string{"exec", "process"}, "toolSearch": false},
		"mcp":   map[string]any{"servers": map[string]any{"execmesh": server}},
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.stdout, "%s\n", b)
	return err
}

// selfCommand is how a client should start this binary: "execmesh" when
// that is what PATH finds, else its absolute path.
func (c *cli) selfCommand() string {
	self, err := os.Executable()
	if err != nil {
		return "execmesh"
	}
	self, _ = filepath.EvalSymlinks(self)
	if found, err := exec.LookPath("execmesh"); err == nil {
		if found, _ = filepath.EvalSymlinks(found); found == self {
			return "execmesh"
		}
	}
	return self
}

func (c *cli) runMCP(ctx context.Context, f *clientFlags, embedded, structured bool, workdir string) error {
	opts := mcpserver.Options{Version: buildVersion().Version, StructuredContent: structured}
	if embedded {
		cfg, err := f.load(c)
		if err != nil {
			return err
		}
		cfg.StateDir = f.stateDir // "" = a temporary dir, removed on exit
		emb, err := mcpserver.NewEmbedded(ctx, cfg, gateway.Options{ConfigPath: f.filePath(c)})
		if err != nil {
			return err
		}
		defer emb.Close(context.WithoutCancel(ctx))
		opts.ApplyPatch = func() bool { return cfg.Tools.Exec.ApplyPatch.Enabled }
		// The in-process gateway's default directory is this process's
		// already: only an explicit --workdir needs sending.
		inv := &workdirInvoker{Invoker: emb.Invoker(f.sessionKey), explicit: workdir}
		return mcpserver.ServeStdio(ctx, inv, opts, c.stdin, c.stdout)
	}
	cfg, err := f.load(c)
	if err != nil {
		return err
	}
	cl, err := f.clientFor(c, cfg)
	if err != nil {
		return err
	}
	defer cl.close()
	opts.ApplyPatch = func() bool { return cl.servesApplyPatch(ctx, f.sessionKey) }
	inv := &workdirInvoker{Invoker: mcpserver.NewHTTPInvoker(cl.base, cl.token, f.sessionKey, cl.hc), explicit: workdir}
	if !configuredForNode(cfg, f.sessionKey) {
		inv.local = func(ctx context.Context) (string, bool) { return c.localWorkdir(ctx, cl, f.sessionKey) }
	}
	return mcpserver.ServeStdio(ctx, inv, opts, c.stdin, c.stdout)
}

// workdirInvoker gives the exec calls of an MCP client that name no
// workdir the one `execmesh exec` would send (DESIGN.md §2): explicit
// (--workdir), else the client's own directory when local says the
// gateway shares this machine's view of it. The client's directory is not
// sent with a call for a node (its node, or host node), where it means
// nothing. A workdir in the call wins over both.
type workdirInvoker struct {
	mcpserver.Invoker
	explicit string
	// local returns the directory to send, checked per call (the
	// gateway's host and the sessionKey's exec defaults may change);
	// nil when the configuration sends the agent to a node.
	local func(ctx context.Context) (string, bool)
}

// Invoke implements mcpserver.Invoker.
func (w *workdirInvoker) Invoke(ctx context.Context, tool string, args json.RawMessage) (protocol.Result, error) {
	if tool == protocol.ToolExec {
		args = w.withWorkdir(ctx, args)
	}
	return w.Invoker.Invoke(ctx, tool, args)
}

// withWorkdir returns args with the default workdir added when they have
// none ("" or null count as none). Arguments that are not a JSON object
// go as they are: the gateway refuses them with its own message.
func (w *workdirInvoker) withWorkdir(ctx context.Context, args json.RawMessage) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(args, &m) != nil || m == nil {
		return args
	}
	if v, ok := m["workdir"]; ok {
		var s *string
		if json.Unmarshal(v, &s) != nil || s != nil && *s != "" {
			return args // the call's own workdir (or a value the gateway will refuse)
		}
	}
	dir := w.explicit
	if dir == "" && w.local != nil && !forNode(m) {
		dir, _ = w.local(ctx)
	}
	if dir == "" {
		return args
	}
	m["workdir"], _ = json.Marshal(dir)
	out, err := json.Marshal(m)
	if err != nil {
		return args
	}
	return out
}

// forNode reports whether exec arguments send the call to a node: a node
// named, or host node.
func forNode(m map[string]json.RawMessage) bool {
	var node, host string
	_ = json.Unmarshal(m["node"], &node)
	_ = json.Unmarshal(m["host"], &host)
	return strings.TrimSpace(node) != "" || strings.EqualFold(strings.TrimSpace(host), "node")
}

// servesApplyPatch asks the gateway whether sessionKey may use apply_patch:
// an empty call is refused as "Tool not available" (404) when it may not,
// and as an invalid request (no patch: nothing is applied) when it may.
func (cl *client) servesApplyPatch(ctx context.Context, sessionKey string) bool {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	_, _, err := cl.invokeTool(ctx, protocol.ToolApplyPatch, struct{}{}, sessionKey)
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe.Type == protocol.ErrInvalidRequest
	}
	return err == nil
}
