// Package mcpserver serves execmesh's exec and process tools over the Model
// Context Protocol (github.com/modelcontextprotocol/go-sdk), for MCP
// clients such as Claude Code or Cursor.
//
// New builds an *mcp.Server whose two tools carry the same descriptions and
// parameter schemas as OpenClaw's (every parameter typed and described,
// enums for host, security, ask and action), and a third, apply_patch, when
// Options.ApplyPatch says the gateway serves it
// (tools.exec.applyPatch.enabled), and forwards each call to an
// Invoker: NewHTTPInvoker talks to a running gateway over its HTTP API,
// NewGatewayInvoker (or an Embedded gateway) calls a *gateway.Gateway in
// the same process. ServeStdio serves one session on stdin/stdout, as
// `execmesh mcp` does; HTTPHandler is the streamable-HTTP transport the
// gateway mounts at /mcp.
//
// A tool result comes back as its text alone; a client that asks
// (Options.StructuredContent, `execmesh mcp --structured-content`, or over
// HTTP the X-Execmesh-Structured-Content header) gets the details object as
// structured content too. Text alone is the default because OpenClaw
// prepends structured content to the text it shows the model, which would
// read every output twice. What the gateway raises before running anything
// (wrong argument types, unknown parameters, security violations, an
// unreachable gateway) is a tool result with isError set and the message as
// text, never a protocol error: the model reads it and corrects the call.
// A failed exec is marked as an error too; a failed process action ("No
// session found for …") is a plain result, as in OpenClaw.
//
// When a background session exits, its system event ("Exec completed
// (<id>, code N) :: …") reaches the client exactly once, one of two ways.
// A client that called logging/setLevel with info or debug takes log
// messages: it gets the event as a logging notification
// (notifications/message, level info, logger "execmesh") from a goroutine
// that follows the events of its sessionKey and ends with the session.
// Each notification is followed by a ping, which the client answers after
// reading what came before; only then is the event confirmed (removed from
// the queue). One that cannot be sent (no stream connected) or is not
// answered within Options.AckTimeout stays queued for the next reader,
// such as GET /v1/events. Any other client (OpenClaw's registers no
// handler for log messages, though its SDK answers pings, so a ping never
// counts as delivery) gets the events pending at each tool call appended to
// that call's result, one text content each ("System: Exec completed …"),
// and they are confirmed as they are added. A confirmed event is gone for
// every reader, so give each MCP client its own sessionKey when several
// watch the same gateway. The server negotiates the initialize-handshake
// protocol versions, since the sessionless protocol has no sessions.
//
// # Client configuration
//
// Stdio, with a gateway already running (`execmesh up`); the gateway URL
// and token come from the flags or from EXECMESH_GATEWAY_URL and
// EXECMESH_GATEWAY_TOKEN, else http://127.0.0.1:8420 without a token:
//
//	{
//	  "mcpServers": {
//	    "execmesh": {
//	      "command": "execmesh",
//	      "args": ["mcp", "--session-key", "agent:main:main"],
//	      "env": {
//	        "EXECMESH_GATEWAY_URL": "http://127.0.0.1:8420",
//	        "EXECMESH_GATEWAY_TOKEN": "<token>"
//	      }
//	    }
//	  }
//	}
//
// Stdio with a private in-process gateway (no daemon; host=gateway only;
// with no way to answer approvals from outside, set tools.exec.security
// and ask in the --config file, or keep an allowlist under --state-dir):
//
//	{"mcpServers": {"execmesh": {"command": "execmesh", "args": ["mcp", "--embedded", "--config", "/path/to/config.json"]}}}
//
// Streamable HTTP, served by the gateway at /mcp behind its bearer token:
//
//	{
//	  "mcpServers": {
//	    "execmesh": {
//	      "type": "http",
//	      "url": "http://127.0.0.1:8420/mcp",
//	      "headers": {
//	        "Authorization": "Bearer <token>",
//	        "X-Execmesh-Session-Key": "agent:main:main"
//	      }
//	    }
//	  }
//	}
//
// For OpenClaw, `execmesh mcp --print-config openclaw` prints a tested
// configuration (docs/mcp.md): OpenClaw passes a server nothing that names
// its session, so the --session-key is one per agent.
//
// With Claude Code's CLI: `claude mcp add execmesh -- execmesh mcp`, or
// `claude mcp add --transport http execmesh http://127.0.0.1:8420/mcp
// --header "Authorization: Bearer <token>"`. The sessionKey may also be
// given as a query parameter: http://127.0.0.1:8420/mcp?sessionKey=agent:main:main.
package mcpserver
