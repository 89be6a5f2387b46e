package openclawnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// The plugin tools the node publishes.
const (
	// PluginID is OpenClaw's reserved plugin id of node MCP tools: the
	// gateway calls them with mcp.tools.call.v1 and reads an MCP
	// CallToolResult back.
	PluginID = "node-mcp"
	// MCPServer is the server name of the tools.
	MCPServer = "execmesh"
	// ToolExecName and ToolProcessName are the names the agent sees.
	ToolExecName    = "execmesh_exec"
	ToolProcessName = "execmesh_process"
)

// ToolDescriptor is one entry of node.pluginTools.update.
type ToolDescriptor struct {
	PluginID    string         `json:"pluginId"`
	Name        string         `json:"name"`
	Description string         `json:"description"`
	Parameters  map[string]any `json:"parameters"`
	Command     string         `json:"command"`
	MCP         ToolMCP        `json:"mcp"`
}

// ToolMCP names the MCP server and tool of a descriptor.
type ToolMCP struct {
	Server string `json:"server"`
	Tool   string `json:"tool"`
}

func prop(typ, desc string) map[string]any { return map[string]any{"type": typ, "description": desc} }

// Tools returns the descriptors of execmesh_exec and execmesh_process.
func Tools() []ToolDescriptor {
	levels := func(desc string, v ...string) map[string]any {
		return map[string]any{"type": "string", "enum": v, "description": desc}
	}
	exec := map[string]any{
		"type": "object", "required": []string{"command"},
		"properties": map[string]any{
			"command":    prop("string", "Shell command to execute on this node."),
			"workdir":    prop("string", "Working directory on the node."),
			"env":        map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}, "description": "Extra environment variables; PATH may only prepend the node's own, loader hooks such as LD_* are refused."},
			"yieldMs":    prop("number", "Milliseconds to wait before backgrounding (default 10000, clamped to 10..120000)."),
			"background": prop("boolean", "Run in the background at once; follow up with execmesh_process."),
			"timeout":    prop("number", "Timeout in seconds (default 1800; 0 disables). The whole process tree is killed on expiry."),
			"pty":        prop("boolean", "Run in a pseudo-terminal (TTY-required CLIs)."),
			"security":   levels("Exec security mode; can only tighten the node's.", "deny", "allowlist", "full"),
			"ask":        levels("Exec ask mode; can only tighten the node's.", "off", "on-miss", "always"),
		},
	}
	process := map[string]any{
		"type": "object", "required": []string{"action"},
		"properties": map[string]any{
			"action":    map[string]any{"type": "string", "enum": protocol.ProcessActions, "description": "Process action."},
			"sessionId": prop("string", "Session id (every action but list)."),
			"data":      prop("string", "Data to write to stdin (write)."),
			"keys":      map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "description": "Key tokens (send-keys): C-c, Enter, Up, …"},
			"hex":       map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "description": "Bytes as hex strings (send-keys)."},
			"literal":   prop("string", "Literal text (send-keys)."),
			"text":      prop("string", "Text to paste (paste)."),
			"bracketed": prop("boolean", "Bracketed paste (paste; default true)."),
			"eof":       prop("boolean", "Close stdin after writing (write)."),
			"offset":    prop("integer", "log: first line; list: first session of the page."),
			"limit":     prop("integer", "log: number of lines; list: page size."),
			"timeout":   prop("integer", "poll: wait up to this many milliseconds for output or the exit (at most 30000)."),
		},
	}
	return []ToolDescriptor{
		{PluginID: PluginID, Name: ToolExecName, Command: CmdMCPToolsCall, MCP: ToolMCP{Server: MCPServer, Tool: protocol.ToolExec}, Parameters: exec,
			Description: "Run a shell command on this execmesh node, under the node's own approvals and confinement. " +
				"Long work continues in the background (yieldMs/background): follow up with execmesh_process (poll, log, write, send-keys, kill)."},
		{PluginID: PluginID, Name: ToolProcessName, Command: CmdMCPToolsCall, MCP: ToolMCP{Server: MCPServer, Tool: protocol.ToolProcess}, Parameters: process,
			Description: "Manage the background sessions execmesh_exec started on this execmesh node: list, poll, log, write, send-keys, submit, paste, kill, clear, remove."},
	}
}

// publishTools sends node.pluginTools.update after hello-ok.
func (c *Client) publishTools(cn *conn) {
	if _, err := c.request(cn, "node.pluginTools.update", map[string]any{"tools": Tools()}); err != nil {
		if cn.ctx.Err() == nil {
			c.log.Warn("plugin tools not published to the OpenClaw gateway", "err", err)
		}
		return
	}
	c.log.Info("plugin tools published to the OpenClaw gateway", "tools", []string{ToolExecName, ToolProcessName})
}

// callResult is an MCP CallToolResult. It carries the text alone: OpenClaw
// shows a plugin tool's structuredContent to the model as JSON before the
// text, and the details repeat the output, so the model read it twice.
type callResult struct {
	Content []protocol.Content `json:"content"`
	IsError bool               `json:"isError,omitempty"`
}

func toolError(text string) outcome {
	return outcome{payload: callResult{Content: []protocol.Content{{Type: "text", Text: text}}, IsError: true}}
}

// followUp is the session core's follow-up hint, which names the process
// tool; on OpenClaw that tool is ToolProcessName (its own process tool
// does not know the node's sessions).
const followUp = "Use process ("

func toolResult(r protocol.Result) outcome {
	content := make([]protocol.Content, 0, len(r.Content))
	for _, c := range r.Content {
		c.Text = strings.Replace(c.Text, followUp, "Use "+ToolProcessName+" (", 1)
		content = append(content, c)
	}
	r.Content = content
	return outcome{payload: callResult{Content: r.Content, IsError: r.Status() == protocol.StatusFailed}}
}

// callTool serves mcp.tools.call.v1: {server, tool, arguments}.
func (c *Client) callTool(ctx context.Context, req InvokeRequest, params []byte) outcome {
	var p struct {
		Server    string          `json:"server"`
		Tool      string          `json:"tool"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return fail(CodeInvalidRequest, "INVALID_REQUEST: MCP tool params must be an object")
	}
	if p.Server != MCPServer {
		return fail("MCP_SERVER_UNAVAILABLE", "MCP server %q is not on this node (it serves %q)", p.Server, MCPServer)
	}
	args := p.Arguments
	if len(args) == 0 || string(args) == "null" {
		args = []byte("{}")
	}
	key := scopeKey(req.SessionKey)
	switch p.Tool {
	case protocol.ToolExec:
		a, err := protocol.DecodeExecArgs(args)
		if err != nil {
			return toolError(err.Error())
		}
		switch {
		case a.Host != "" && a.Host != "auto" && a.Host != "node":
			return toolError(fmt.Sprintf("exec host not allowed (%s runs on this node only)", ToolExecName))
		case a.Node != "":
			return toolError(fmt.Sprintf("exec node not allowed (%s runs on the node that published it)", ToolExecName))
		case a.Elevated != nil && *a.Elevated:
			return toolError("elevated is not available on this node")
		}
		dir, e := c.workdir(a.Workdir)
		if e != nil {
			return toolError(e.Message)
		}
		a.Workdir = dir
		security, ask := c.policyFor(a.Security, a.Ask)
		a.Host, a.Security, a.Ask, a.Elevated = "", "", "", nil
		reply, err := c.cfg.Host.Exec(ctx, protocol.ExecRequest{SessionKey: key, AgentID: agentOf(req.SessionKey),
			Target: protocol.TargetNode, Args: a, Security: security, Ask: ask})
		if err != nil {
			return toolError(refusal(err))
		}
		return toolResult(reply.Result)
	case protocol.ToolProcess:
		a, err := protocol.DecodeProcessArgs(args)
		if err != nil {
			return toolError(err.Error())
		}
		if a.Action == "list" {
			page, err := session.ListPageOf(a)
			if err != nil {
				return toolError(err.Error())
			}
			lr, err := c.cfg.Host.List(ctx, protocol.ListRequest{SessionKey: key, Limit: page.End()})
			if err != nil {
				return toolError(refusal(err))
			}
			all := make([]protocol.Details, 0, len(lr.Sessions))
			for _, s := range lr.Sessions {
				all = append(all, s.Details)
			}
			lo, hi := page.Bounds(len(all))
			return toolResult(session.PagedListResult(page, all[lo:hi], lr.Total))
		}
		reply, err := c.cfg.Host.Process(ctx, protocol.ProcessRequest{SessionKey: key, Args: a})
		if err != nil {
			return toolError(refusal(err))
		}
		return toolResult(reply.Result)
	default:
		return fail("MCP_TOOL_NOT_FOUND", "tool %q is not served by %s (exec, process)", p.Tool, MCPServer)
	}
}

// refusal is the text of a host's refusal.
func refusal(err error) string {
	if a, ok := host.AsApprovalNeeded(err); ok {
		return fmt.Sprintf("exec denied: approval required (execmesh node policy: %s). This node takes no approvals over OpenClaw: allowlist the program in its exec-approvals.json.", a.Request.Reason)
	}
	var perr *protocol.Error
	if errors.As(err, &perr) {
		return perr.Message
	}
	return err.Error()
}
