package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/execmesh/execmesh/protocol"
)

// MCP protocol versions this server speaks, newest first. A client asking
// for another one gets the newest, as the specification prescribes.
var mcpVersions = []string{"2025-06-18", "2025-03-26", "2024-11-05"}

// JSON-RPC error codes.
const (
	rpcParseError     = -32700
	rpcInvalidRequest = -32600
	rpcMethodNotFound = -32601
	rpcInvalidParams  = -32602
)

// runMCP is `execmesh mcp [flags]`: the exec and process tools as an MCP
// server on stdin/stdout (newline-delimited JSON-RPC 2.0), each call
// forwarded to the gateway under --session-key. It ends when stdin closes
// or ctx ends.
func runMCP(ctx context.Context, c *cli, args []string) error {
	fs := newFlagSet("mcp")
	var f clientFlags
	f.register(fs)
	pos, err := c.parseFlags(fs, "[flags]", args, true)
	if err != nil {
		return err
	}
	cl, err := f.client(c)
	if err != nil {
		return err
	}
	defer cl.close()
	if len(pos) > 0 {
		return usageErrorf("mcp: unexpected arguments %q", pos)
	}
	s := &mcpServer{cl: cl, sessionKey: f.sessionKey, out: c.stdout, calls: map[string]context.CancelFunc{}}
	return s.serve(ctx, c.stdin)
}

// mcpServer serves one MCP session. Tool calls run concurrently (a poll
// may wait 30 s); answers are written whole, one per line, under mu.
type mcpServer struct {
	cl         *client
	sessionKey string

	mu    sync.Mutex
	out   io.Writer
	calls map[string]context.CancelFunc // in-flight tools/call by request id; guarded by mu
}

// rpcMessage is a JSON-RPC request, notification or answer.
type rpcMessage struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  any             `json:"result,omitempty"`
	Error   *rpcError       `json:"error,omitempty"`
}

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// serve reads messages until r ends or ctx is cancelled, then cancels and
// waits for the calls still running.
func (s *mcpServer) serve(ctx context.Context, r io.Reader) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// At the end of stdin the calls in flight still answer; an interrupt
	// cancels them through ctx.
	var wg sync.WaitGroup
	defer wg.Wait()

	lines := make(chan []byte)
	readErr := make(chan error, 1)
	go func() {
		// This reader may outlive serve when ctx ends while stdin stays
		// open; it then ends with the process.
		br := bufio.NewReaderSize(r, 64<<10)
		for {
			line, err := br.ReadBytes('\n')
			if len(line) > 0 {
				select {
				case lines <- line:
				case <-ctx.Done():
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				readErr <- err
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-readErr:
			if err != nil {
				return fmt.Errorf("mcp: reading stdin: %w", err)
			}
			return nil
		case line := <-lines:
			s.handle(ctx, &wg, line)
		}
	}
}

// handle answers one message; tools/call runs in its own goroutine.
func (s *mcpServer) handle(ctx context.Context, wg *sync.WaitGroup, line []byte) {
	if len(bytes.TrimSpace(line)) == 0 {
		return
	}
	var m rpcMessage
	if err := json.Unmarshal(line, &m); err != nil {
		s.reply(json.RawMessage("null"), nil, &rpcError{rpcParseError, "parse error: " + err.Error()})
		return
	}
	isNotification := len(m.ID) == 0 || string(m.ID) == "null"
	if m.Method == "" {
		if !isNotification && m.Result == nil && m.Error == nil {
			s.reply(m.ID, nil, &rpcError{rpcInvalidRequest, "invalid request: no method"})
		}
		return // an answer to a request we never send
	}
	switch m.Method {
	case "initialize":
		s.reply(m.ID, s.initialize(m.Params), nil)
	case "ping":
		s.reply(m.ID, struct{}{}, nil)
	case "tools/list":
		s.reply(m.ID, map[string]any{"tools": mcpTools()}, nil)
	case "tools/call":
		callCtx, cancel := context.WithCancel(ctx)
		s.track(string(m.ID), cancel)
		wg.Go(func() {
			defer s.untrack(string(m.ID))
			res, rerr := s.callTool(callCtx, m.Params)
			s.reply(m.ID, res, rerr)
		})
	case "notifications/cancelled":
		var p struct {
			RequestID json.RawMessage `json:"requestId"`
		}
		if json.Unmarshal(m.Params, &p) == nil {
			s.cancelCall(string(p.RequestID))
		}
	default:
		if !isNotification {
			s.reply(m.ID, nil, &rpcError{rpcMethodNotFound, "method not found: " + m.Method})
		}
	}
}

func (s *mcpServer) track(id string, cancel context.CancelFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[id] = cancel
}

func (s *mcpServer) untrack(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cancel, ok := s.calls[id]; ok {
		cancel()
		delete(s.calls, id)
	}
}

func (s *mcpServer) cancelCall(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cancel, ok := s.calls[id]; ok {
		cancel()
	}
}

// initialize answers the handshake.
func (s *mcpServer) initialize(params json.RawMessage) any {
	var p struct {
		ProtocolVersion string `json:"protocolVersion"`
	}
	_ = json.Unmarshal(params, &p)
	v := mcpVersions[0]
	if slices.Contains(mcpVersions, p.ProtocolVersion) {
		v = p.ProtocolVersion
	}
	return map[string]any{
		"protocolVersion": v,
		"capabilities":    map[string]any{"tools": map[string]any{"listChanged": false}},
		"serverInfo":      map[string]any{"name": "execmesh", "version": version},
		"instructions":    "exec runs shell commands; long-running ones continue in the background and are followed up with process (poll, log, write, send-keys, kill).",
	}
}

// callTool forwards a tools/call to the gateway. What the tool raises (an
// invalid parameter, a security violation) and an unreachable gateway
// become a result with isError set, so the model reads the message.
func (s *mcpServer) callTool(ctx context.Context, params json.RawMessage) (any, *rpcError) {
	var p struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return nil, &rpcError{rpcInvalidParams, "invalid params: " + err.Error()}
	}
	if p.Name != protocol.ToolExec && p.Name != protocol.ToolProcess {
		return nil, &rpcError{rpcInvalidParams, fmt.Sprintf("unknown tool %q", p.Name)}
	}
	args := p.Arguments
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	_, ans, err := s.cl.invokeTool(ctx, p.Name, args, s.sessionKey)
	if err != nil {
		return map[string]any{
			"content": []protocol.Content{{Type: "text", Text: err.Error()}},
			"isError": true,
		}, nil
	}
	content := ans.Result.Content
	if content == nil {
		content = []protocol.Content{}
	}
	res := map[string]any{
		"content": content,
		"isError": ans.Result.Status() == protocol.StatusFailed,
	}
	if ans.Result.Details != nil {
		res["structuredContent"] = ans.Result.Details
	}
	return res, nil
}

// reply writes one answer line.
func (s *mcpServer) reply(id json.RawMessage, result any, rerr *rpcError) {
	m := rpcMessage{JSONRPC: "2.0", ID: id, Result: result, Error: rerr}
	if rerr == nil && result == nil {
		m.Result = struct{}{}
	}
	data, err := json.Marshal(m)
	if err != nil {
		data, _ = json.Marshal(rpcMessage{JSONRPC: "2.0", ID: id, Error: &rpcError{-32603, err.Error()}})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.out.Write(append(data, '\n'))
}

// mcpTools describes the two tools with JSON Schemas of their parameters.
func mcpTools() []map[string]any {
	str := func(desc string) map[string]any { return map[string]any{"type": "string", "description": desc} }
	enum := func(desc string, values ...string) map[string]any {
		return map[string]any{"type": "string", "enum": values, "description": desc}
	}
	num := func(desc string) map[string]any { return map[string]any{"type": "number", "description": desc} }
	boolean := func(desc string) map[string]any { return map[string]any{"type": "boolean", "description": desc} }
	strList := func(desc string) map[string]any {
		return map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "description": desc}
	}
	return []map[string]any{
		{
			"name":        protocol.ToolExec,
			"description": "Execute shell commands with background continuation. Use yieldMs/background to continue later via the process tool. Use pty=true for TTY-required commands (terminal UIs, coding agents).",
			"inputSchema": map[string]any{
				"type":                 "object",
				"required":             []string{"command"},
				"additionalProperties": false,
				"properties": map[string]any{
					"command":    str("Shell command to execute"),
					"workdir":    str("Working directory (defaults to cwd)"),
					"env":        map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}, "description": "Extra environment variables"},
					"yieldMs":    num("Milliseconds to wait before backgrounding (default 10000)"),
					"background": boolean("Run in background immediately"),
					"timeout":    num("Timeout in seconds (kills the process on expiry)"),
					"pty":        boolean("Run in a pseudo-terminal (PTY) when available"),
					"elevated":   boolean("Run on the host with elevated permissions (if allowed)"),
					"host":       enum("Exec host", "auto", "sandbox", "gateway", "node"),
					"security":   enum("Exec security mode", "deny", "allowlist", "full"),
					"ask":        enum("Exec ask mode", "off", "on-miss", "always"),
					"node":       str("Node id/name for host=node"),
				},
			},
		},
		{
			"name":        protocol.ToolProcess,
			"description": "Manage running exec sessions: list, poll, log, write, send-keys, submit, paste, kill, clear, remove.",
			"inputSchema": map[string]any{
				"type":                 "object",
				"required":             []string{"action"},
				"additionalProperties": false,
				"properties": map[string]any{
					"action":    enum("Process action", protocol.ProcessActions...),
					"sessionId": str("Session id for actions other than list"),
					"data":      str("Data to write for write"),
					"keys":      strList("Key tokens to send for send-keys"),
					"hex":       strList("Hex bytes to send for send-keys"),
					"literal":   str("Literal string for send-keys"),
					"text":      str("Text to paste for paste"),
					"bracketed": boolean("Wrap paste in bracketed mode"),
					"eof":       boolean("Close stdin after write"),
					"offset":    num("Log offset (lines)"),
					"limit":     num("Log length (lines)"),
					"timeout":   num("For poll: wait up to this many milliseconds before returning"),
				},
			},
		},
	}
}
