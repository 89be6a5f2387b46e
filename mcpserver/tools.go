package mcpserver

import (
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/execmesh/execmesh/protocol"
)

// The tool descriptions tell a model the same facts as OpenClaw's (spec §2
// and §15.1), worded for execmesh: agents prompted for OpenClaw's exec and
// process tools find the same parameters and the same follow-up habits.
const (
	execDescription = "Execute shell commands, with background continuation for work that starts now. " +
		"Use yieldMs/background to continue later with the process tool; backgrounded commands still use the exec timeout, " +
		"so set timeout=0 for intentionally long-lived servers, agents or PTYs on the gateway, and a large positive timeout for host=node. " +
		"For long-running work started now, rely on the automatic completion notice when it is enabled and the command emits output or fails; " +
		"otherwise use process to confirm completion. Use process whenever you need logs, status, input, or intervention. " +
		"Use pty=true for TTY-required commands (terminal UIs, coding agents)."

	processDescription = "Manage exec sessions already started: list, poll, log, write, send-keys, submit, paste, kill, clear, remove. " +
		"Use poll/log when you need status, logs, quiet-success confirmation, or completion confirmation when the automatic completion notice is unavailable. " +
		"Use write/send-keys/submit/paste/kill for input or intervention."
)

// Enumerated parameter values, in the order the docs list them.
var (
	hostValues     = []string{"auto", "sandbox", "gateway", "node"}
	securityValues = []string{"deny", "allowlist", "full"}
	askValues      = []string{"off", "on-miss", "always"}
)

// Schema builders. The schemas are plain JSON objects rather than
// reflected Go types: the gateway decodes arguments strictly and owns every
// rule, so the schema only has to describe them.
func str(desc string) map[string]any { return map[string]any{"type": "string", "description": desc} }

func enum(desc string, values []string) map[string]any {
	return map[string]any{"type": "string", "enum": values, "description": desc}
}

func boolean(desc string) map[string]any {
	return map[string]any{"type": "boolean", "description": desc}
}

func number(desc string) map[string]any {
	return map[string]any{"type": "number", "minimum": 0, "description": desc}
}

func integer(desc string) map[string]any {
	return map[string]any{"type": "integer", "minimum": 0, "description": desc}
}

func stringList(desc string) map[string]any {
	return map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "description": desc}
}

// object is a tool input schema. It deliberately leaves out
// "additionalProperties": false: the gateway answers an unknown parameter
// with a hint ("use \"workdir\" instead" for cwd) and accepts the
// timeoutSeconds alias, and a client that enforced the schema itself would
// replace that hint with a bare validation failure.
func object(required string, props map[string]any) map[string]any {
	return map[string]any{"type": "object", "required": []string{required}, "properties": props}
}

func ptr[T any](v T) *T { return &v }

// execTool describes the exec tool (protocol.ExecArgs).
func execTool() *mcp.Tool {
	return &mcp.Tool{
		Name:        protocol.ToolExec,
		Title:       "Run a shell command",
		Description: execDescription,
		Annotations: &mcp.ToolAnnotations{Title: "Run a shell command", DestructiveHint: ptr(true), OpenWorldHint: ptr(true)},
		InputSchema: object("command", map[string]any{
			"command": str("Shell command to execute."),
			"workdir": str("Working directory (defaults to the host's working directory)."),
			"env": map[string]any{
				"type":                 "object",
				"additionalProperties": map[string]any{"type": "string"},
				"description":          "Extra environment variables (string values). PATH and loader or interpreter hooks such as LD_* are refused on the gateway and node hosts.",
			},
			"yieldMs":    number("Milliseconds to wait before backgrounding (default 10000, clamped to 10..120000)."),
			"background": boolean("Run in the background immediately."),
			"timeout":    number("Timeout in seconds (default 1800; 0 disables the timeout on the gateway or in the sandbox; use a large positive timeout for host=node). The whole process tree is killed on expiry."),
			"pty":        boolean("Run in a pseudo-terminal (PTY) when available (TTY-required CLIs, coding agents); ignored in the sandbox."),
			"elevated":   boolean("Run on the host with elevated permissions, outside the sandbox (if allowed)."),
			"host":       enum("Exec host/target (auto|sandbox|gateway|node). May differ from the configured host only when that is auto.", hostValues),
			"security":   enum("Exec security mode (deny|allowlist|full); can only tighten the configured mode.", securityValues),
			"ask":        enum("Exec ask mode (off|on-miss|always); can only tighten the configured mode.", askValues),
			"node":       str("Node id/name for host=node."),
			"limits": map[string]any{
				"type":        "object",
				"description": "Resource limits of this command's cgroup; each may only tighten the configured limit, and they are refused where the host lacks the cgroup controllers.",
				"properties": map[string]any{
					"memoryMax": map[string]any{"type": []string{"integer", "string"}, "description": "Memory limit in bytes, or with a suffix: \"512M\", \"2G\"."},
					"pidsMax":   map[string]any{"type": "integer", "minimum": 1, "description": "Most processes and threads at once."},
					"cpuMax":    map[string]any{"type": "number", "minimum": 0.01, "description": "CPU limit in CPUs (0.5 = half of one)."},
				},
			},
		}),
	}
}

// processTool describes the process tool (protocol.ProcessArgs).
func processTool() *mcp.Tool {
	return &mcp.Tool{
		Name:        protocol.ToolProcess,
		Title:       "Manage background exec sessions",
		Description: processDescription,
		Annotations: &mcp.ToolAnnotations{Title: "Manage background exec sessions", DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
		InputSchema: object("action", map[string]any{
			"action":    enum("Process action.", protocol.ProcessActions),
			"sessionId": str("Session id (required for every action but list)."),
			"data":      str("Data to write to stdin (write)."),
			"keys":      stringList("Key tokens to send (send-keys), such as C-c, Enter, Up, M-x, S-Tab, F5."),
			"hex":       stringList("Bytes to send, as hex strings (send-keys)."),
			"literal":   str("Literal text to send (send-keys)."),
			"text":      str("Text to paste (paste)."),
			"bracketed": boolean("Wrap the paste in bracketed-paste markers (paste; default true)."),
			"eof":       boolean("Close stdin after writing (write)."),
			"offset":    integer("log: first line to return. list: first session of the page (newest first)."),
			"limit":     integer("log: number of lines to return (without offset and limit the last 200 lines). list: page size; without offset and limit every session is listed."),
			"timeout":   integer("For poll: wait up to this many milliseconds for new output or the exit before returning (capped at 30000)."),
		}),
	}
}

// applyPatchDescription tells a model what apply_patch takes: the Codex
// patch format that OpenClaw's apply_patch reads.
const applyPatchDescription = "Apply a patch to files under workdir, in the Codex patch format: " +
	"\"*** Begin Patch\", then \"*** Add File: <path>\" (lines prefixed with +), \"*** Delete File: <path>\" or " +
	"\"*** Update File: <path>\" (optionally \"*** Move to: <path>\", then @@ hunks with space, - and + lines), then \"*** End Patch\". " +
	"Paths are relative to workdir and may not leave it; a patch that fails changes nothing."

// applyPatchTool describes the apply_patch tool (protocol.ApplyPatchArgs),
// offered only where the gateway serves it.
func applyPatchTool() *mcp.Tool {
	return &mcp.Tool{
		Name:        protocol.ToolApplyPatch,
		Title:       "Apply a patch",
		Description: applyPatchDescription,
		Annotations: &mcp.ToolAnnotations{Title: "Apply a patch", DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
		InputSchema: object("input", map[string]any{
			"input":   str("The whole patch, from *** Begin Patch to *** End Patch."),
			"workdir": str("Directory the patch's paths are relative to (defaults to the host's working directory)."),
			"host":    enum("Where to apply it (auto|sandbox|gateway|node), as for exec.", hostValues),
			"node":    str("Node id/name for host=node."),
		}),
	}
}
