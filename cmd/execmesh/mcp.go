package main

import (
	"context"

	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/mcpserver"
)

// runMCP runs `execmesh mcp`: the exec and process tools as an MCP server
// over stdio, forwarding to a gateway (--gateway, --token, --session-key)
// or, with --embedded, to a private in-process gateway.
func runMCP(ctx context.Context, c *cli, args []string) error {
	fs := newFlagSet("mcp")
	var f clientFlags
	f.register(fs)
	embedded := fs.Bool("embedded", false, "run a private in-process gateway (host=gateway only) instead of calling one")
	pos, err := c.parseFlags(fs, "[flags]", args, true)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("mcp: unexpected arguments %q", pos)
	}
	opts := mcpserver.Options{Version: version}
	if *embedded {
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
		return mcpserver.ServeStdio(ctx, emb.Invoker(f.sessionKey), opts, c.stdin, c.stdout)
	}
	cl, err := f.client(c)
	if err != nil {
		return err
	}
	defer cl.close()
	return mcpserver.ServeStdio(ctx, mcpserver.NewHTTPInvoker(cl.base, cl.token, f.sessionKey, cl.hc), opts, c.stdin, c.stdout)
}
