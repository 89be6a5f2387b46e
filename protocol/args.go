package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// ExecArgs are the parameters of the exec tool. Optional numbers are
// pointers so that "absent" and "zero" stay distinct.
type ExecArgs struct {
	Command    string            `json:"command"`
	Workdir    string            `json:"workdir,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	YieldMs    *float64          `json:"yieldMs,omitempty"`
	Background bool              `json:"background,omitempty"`
	// Timeout is in seconds; nil means the configured default, 0 none.
	Timeout  *float64 `json:"timeout,omitempty"`
	PTY      bool     `json:"pty,omitempty"`
	Elevated *bool    `json:"elevated,omitempty"`
	Host     string   `json:"host,omitempty"`
	Security string   `json:"security,omitempty"`
	Ask      string   `json:"ask,omitempty"`
	Node     string   `json:"node,omitempty"`
}

// Process actions, in the order OpenClaw lists them.
var ProcessActions = []string{"list", "poll", "log", "write", "send-keys", "submit", "paste", "kill", "clear", "remove"}

// ProcessArgs are the parameters of the process tool.
type ProcessArgs struct {
	Action    string   `json:"action"`
	SessionID string   `json:"sessionId,omitempty"`
	Data      *string  `json:"data,omitempty"`
	Keys      []string `json:"keys,omitempty"`
	Hex       []string `json:"hex,omitempty"`
	Literal   *string  `json:"literal,omitempty"`
	Text      *string  `json:"text,omitempty"`
	Bracketed *bool    `json:"bracketed,omitempty"`
	EOF       bool     `json:"eof,omitempty"`
	Offset    *int     `json:"offset,omitempty"`
	Limit     *int     `json:"limit,omitempty"`
	// Timeout is the poll wait in milliseconds.
	Timeout *int `json:"timeout,omitempty"`
}

// paramKind is the JSON type a parameter accepts.
type paramKind int

const (
	kString paramKind = iota
	kNumber
	kInt
	kBool
	kStringMap
	kStringList
	kIntOrIntString
)

func (k paramKind) String() string {
	switch k {
	case kString:
		return "a string"
	case kNumber:
		return "a number"
	case kInt:
		return "a non-negative integer"
	case kBool:
		return "a boolean"
	case kStringMap:
		return "an object of string values"
	case kStringList:
		return "an array of strings"
	case kIntOrIntString:
		return "a non-negative integer (or an integer string)"
	}
	return "?"
}

var execParams = map[string]paramKind{
	"command": kString, "workdir": kString, "env": kStringMap, "yieldMs": kNumber,
	"background": kBool, "timeout": kNumber, "timeoutSeconds": kNumber, "pty": kBool,
	"elevated": kBool, "host": kString, "security": kString, "ask": kString, "node": kString,
}

var processParams = map[string]paramKind{
	"action": kString, "sessionId": kString, "data": kString, "keys": kStringList,
	"hex": kStringList, "literal": kString, "text": kString, "bracketed": kBool,
	"eof": kBool, "offset": kInt, "limit": kInt, "timeout": kIntOrIntString,
}

// paramHints name the parameter a caller probably meant.
var paramHints = map[string]string{
	"cwd": "workdir", "dir": "workdir", "directory": "workdir", "workDir": "workdir", "working_dir": "workdir",
	"cmd": "command", "script": "command", "shell": "command",
	"environment": "env", "yield_ms": "yieldMs", "yield": "yieldMs",
	"timeoutMs": "timeout", "timeout_ms": "timeout", "timeout_seconds": "timeoutSeconds",
	"session": "sessionId", "session_id": "sessionId", "id": "sessionId", "sessionID": "sessionId",
	"input": "data", "stdin": "data", "key": "keys",
}

func unknownParam(tool, name string, known map[string]paramKind) *Error {
	if hint, ok := paramHints[name]; ok {
		if _, exists := known[hint]; exists {
			return Errorf(ErrInvalidRequest, "%s parameter %q is unsupported; use %q instead", tool, name, hint)
		}
	}
	for k := range known {
		if strings.EqualFold(k, name) {
			return Errorf(ErrInvalidRequest, "%s parameter %q is unsupported; use %q instead", tool, name, k)
		}
	}
	names := make([]string, 0, len(known))
	for k := range known {
		names = append(names, k)
	}
	sort.Strings(names)
	return Errorf(ErrInvalidRequest, "%s parameter %q is unsupported (known parameters: %s)", tool, name, strings.Join(names, ", "))
}

// splitObject decodes raw into its top-level fields, rejecting anything but
// a JSON object (null and absent count as an empty object).
func splitObject(tool string, raw []byte) (map[string]json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return map[string]json.RawMessage{}, nil
	}
	if raw[0] != '{' {
		return nil, Errorf(ErrInvalidRequest, "%s arguments must be a JSON object", tool)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, Errorf(ErrInvalidRequest, "%s arguments are not valid JSON: %v", tool, err)
	}
	return fields, nil
}

func isNull(v json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(v), []byte("null")) }

func typeErr(tool, name string, k paramKind) *Error {
	return Errorf(ErrInvalidRequest, "%s parameter %q must be %s", tool, name, k)
}

// decodeValue decodes one field strictly into dst according to its kind.
func decodeValue(tool, name string, k paramKind, v json.RawMessage, dst any) error {
	switch k {
	case kString:
		p := dst.(*string)
		if err := json.Unmarshal(v, p); err != nil {
			return typeErr(tool, name, k)
		}
	case kBool:
		p := dst.(*bool)
		if err := json.Unmarshal(v, p); err != nil {
			return typeErr(tool, name, k)
		}
	case kNumber:
		var f float64
		if err := json.Unmarshal(v, &f); err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return typeErr(tool, name, k)
		}
		*(dst.(**float64)) = &f
	case kInt, kIntOrIntString:
		var f float64
		if err := json.Unmarshal(v, &f); err != nil {
			var s string
			if k != kIntOrIntString || json.Unmarshal(v, &s) != nil {
				return typeErr(tool, name, k)
			}
			s = strings.TrimSpace(s)
			n, perr := strconv.ParseInt(strings.TrimPrefix(s, "+"), 10, 64)
			if perr != nil || strings.HasPrefix(s, "+-") {
				return typeErr(tool, name, k)
			}
			f = float64(n)
		}
		if f < 0 {
			return Errorf(ErrInvalidRequest, "%s parameter %q must not be negative", tool, name)
		}
		if f > math.MaxInt32 {
			f = math.MaxInt32
		}
		n := int(math.Floor(f))
		*(dst.(**int)) = &n
	case kStringMap:
		var m map[string]json.RawMessage
		if err := json.Unmarshal(v, &m); err != nil {
			return typeErr(tool, name, k)
		}
		out := make(map[string]string, len(m))
		for key, raw := range m {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return Errorf(ErrInvalidRequest, "%s parameter %q: value of %q must be a string", tool, name, key)
			}
			out[key] = s
		}
		*(dst.(*map[string]string)) = out
	case kStringList:
		var l []json.RawMessage
		if err := json.Unmarshal(v, &l); err != nil {
			return typeErr(tool, name, k)
		}
		out := make([]string, 0, len(l))
		for i, raw := range l {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return Errorf(ErrInvalidRequest, "%s parameter %q: element %d must be a string", tool, name, i)
			}
			out = append(out, s)
		}
		*(dst.(*[]string)) = out
	}
	return nil
}

// DecodeExecArgs decodes exec arguments strictly: unknown parameters are
// rejected with a hint, wrong types name the parameter, and timeoutSeconds
// is accepted as an alias of timeout. A missing or empty command is the
// error "Provide a command to start.".
func DecodeExecArgs(raw []byte) (ExecArgs, error) {
	var a ExecArgs
	fields, err := splitObject(ToolExec, raw)
	if err != nil {
		return a, err
	}
	for _, name := range sortedKeys(fields) {
		v := fields[name]
		k, ok := execParams[name]
		if !ok {
			return ExecArgs{}, unknownParam(ToolExec, name, execParams)
		}
		if isNull(v) {
			continue
		}
		var dst any
		switch name {
		case "command":
			dst = &a.Command
		case "workdir":
			dst = &a.Workdir
		case "env":
			dst = &a.Env
		case "yieldMs":
			dst = &a.YieldMs
		case "background":
			dst = &a.Background
		case "timeout", "timeoutSeconds":
			if name == "timeoutSeconds" && !isNull(fields["timeout"]) && fields["timeout"] != nil {
				return ExecArgs{}, Errorf(ErrInvalidRequest, "exec parameters \"timeout\" and \"timeoutSeconds\" mean the same; pass only one")
			}
			dst = &a.Timeout
		case "pty":
			dst = &a.PTY
		case "elevated":
			var b bool
			if err := decodeValue(ToolExec, name, k, v, &b); err != nil {
				return ExecArgs{}, err
			}
			a.Elevated = &b
			continue
		case "host":
			dst = &a.Host
		case "security":
			dst = &a.Security
		case "ask":
			dst = &a.Ask
		case "node":
			dst = &a.Node
		}
		if err := decodeValue(ToolExec, name, k, v, dst); err != nil {
			return ExecArgs{}, err
		}
	}
	if strings.TrimSpace(a.Command) == "" {
		return ExecArgs{}, Errorf(ErrInvalidRequest, "Provide a command to start.")
	}
	return a, nil
}

// DecodeProcessArgs decodes process arguments strictly. The poll timeout
// (milliseconds) also accepts an integer string such as "2000" (DESIGN.md
// §7). An unknown action is left for the process tool to answer.
func DecodeProcessArgs(raw []byte) (ProcessArgs, error) {
	var a ProcessArgs
	fields, err := splitObject(ToolProcess, raw)
	if err != nil {
		return a, err
	}
	for _, name := range sortedKeys(fields) {
		v := fields[name]
		k, ok := processParams[name]
		if !ok {
			return ProcessArgs{}, unknownParam(ToolProcess, name, processParams)
		}
		if isNull(v) {
			continue
		}
		var dst any
		switch name {
		case "action":
			dst = &a.Action
		case "sessionId":
			dst = &a.SessionID
		case "data", "literal", "text":
			var s string
			if err := decodeValue(ToolProcess, name, k, v, &s); err != nil {
				return ProcessArgs{}, err
			}
			switch name {
			case "data":
				a.Data = &s
			case "literal":
				a.Literal = &s
			default:
				a.Text = &s
			}
			continue
		case "keys":
			dst = &a.Keys
		case "hex":
			dst = &a.Hex
		case "bracketed":
			var b bool
			if err := decodeValue(ToolProcess, name, k, v, &b); err != nil {
				return ProcessArgs{}, err
			}
			a.Bracketed = &b
			continue
		case "eof":
			dst = &a.EOF
		case "offset":
			dst = &a.Offset
		case "limit":
			dst = &a.Limit
		case "timeout":
			dst = &a.Timeout
		}
		if err := decodeValue(ToolProcess, name, k, v, dst); err != nil {
			return ProcessArgs{}, err
		}
	}
	if strings.TrimSpace(a.Action) == "" {
		return ProcessArgs{}, Errorf(ErrInvalidRequest, "process parameter \"action\" is required (one of: %s)", strings.Join(ProcessActions, ", "))
	}
	return a, nil
}

func sortedKeys(m map[string]json.RawMessage) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// String renders the args for logs without env values.
func (a ExecArgs) String() string {
	return fmt.Sprintf("exec{command=%q workdir=%q host=%q pty=%v background=%v}", a.Command, a.Workdir, a.Host, a.PTY, a.Background)
}
