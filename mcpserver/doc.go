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
// A tool result comes back as the result text plus the details object as
// structured content. What the gateway raises before running anything
// (wrong argument types, unknown parameters, security violations, an
// unreachable gateway) is a tool result with isError set and the message as
// text, never a protocol error: the model reads it and corrects the call.
// A failed exec is marked as an error too; a failed process action ("No
// session found for …") is a plain result, as in OpenClaw.
//
// When a background session exits, its system event ("Exec completed
// (<id>, code N) :: …") is sent to the client as a logging notification
// (notifications/message, level info, logger "execmesh"); each MCP session
// follows the events of its sessionKey in a goroutine that ends with the
// session. The server negotiates the initialize-handshake protocol
// versions, since the sessionless protocol has no server-pushed messages.
// An event is confirmed (removed from the queue) only once the client has
// it: each notification is followed by a ping, which the client answers
// after reading what came before. One that cannot be sent (no stream
// connected, a logging level above info) or is not answered within
// Options.AckTimeout (the client went away without closing its session)
// stays queued for the next reader, such as GET /v1/events. A confirmed
// event is gone for every reader, so give each MCP client its own
// sessionKey when several watch the same gateway.
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
// With Claude Code's CLI: `claude mcp add execmesh -- execmesh mcp`, or
// `claude mcp add --transport http execmesh http://127.0.0.1:8420/mcp
// --header "Authorization: Bearer <token>"`. The sessionKey may also be
// given as a query parameter: http://127.0.0.1:8420/mcp?sessionKey=agent:main:main.
package mcpserver
