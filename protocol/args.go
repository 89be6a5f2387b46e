package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// ExecArgs are the parameters of the exec tool. Optional numbers are
// pointers so that "absent" and "zero" stay distinct.
type ExecArgs struct {
	Command string            `json:"command"`
	Workdir string            `json:"workdir,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// YieldMs is the foreground wait before backgrounding; the session
	// core clamps it to 10..120000.
	YieldMs    *float64 `json:"yieldMs,omitempty"`
	Background bool     `json:"background,omitempty"`
	// Timeout is in seconds; nil means the configured default, 0 none.
	// Decoding refuses negative values and clamps huge ones to 2^31-1.
	Timeout  *float64 `json:"timeout,omitempty"`
	PTY      bool     `json:"pty,omitempty"`
	Elevated *bool    `json:"elevated,omitempty"`
	Host     string   `json:"host,omitempty"`
	Security string   `json:"security,omitempty"`
	Ask      string   `json:"ask,omitempty"`
	Node     string   `json:"node,omitempty"`
	// Limits may only tighten the configured tools.exec.limits (see
	// Limits.Tighten); nil means the configured limits.
	Limits *Limits `json:"limits,omitempty"`
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
	kLimits
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
	case kLimits:
		return "an object (memoryMax, pidsMax, cpuMax)"
	}
	return "?"
}

var execParams = map[string]paramKind{
	"command": kString, "workdir": kString, "env": kStringMap, "yieldMs": kNumber,
	"background": kBool, "timeout": kNumber, "timeoutSeconds": kNumber, "pty": kBool,
	"elevated": kBool, "host": kString, "security": kString, "ask": kString, "node": kString,
	"limits": kLimits,
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

// maxNumber bounds every numeric parameter. A larger value (up to JSON's
// 1e308, or beyond, which parses as infinity) is clamped rather than
// refused: it means "as long as possible", and 2^31-1 seconds or
// milliseconds is that, while still converting safely to a time.Duration.
const maxNumber = math.MaxInt32

// jsonNumber parses a JSON number. Numbers too large for a float64 come
// back as ±Inf, which the caller clamps. ok is false for anything that is
// not a number, strings included.
func jsonNumber(v json.RawMessage) (f float64, ok bool) {
	v = bytes.TrimSpace(v)
	if len(v) == 0 || !(v[0] == '-' || v[0] >= '0' && v[0] <= '9') {
		return 0, false
	}
	// v is a value of a document json.Unmarshal accepted, so it is JSON
	// number syntax, which ParseFloat reads exactly.
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, false
	}
	return f, true
}

// intString parses the integer strings the process poll timeout accepts:
// optional spaces, at most one sign, decimal digits ("2000", "+2000"). Not
// "1e3", "0x10" or "2_000". Values beyond int64 are clamped.
func intString(s string) (float64, bool) {
	s = strings.TrimSpace(s)
	digits := s
	if len(s) > 0 && (s[0] == '+' || s[0] == '-') {
		digits = s[1:]
	}
	if digits == "" {
		return 0, false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(strings.TrimPrefix(s, "+"), 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, false
	}
	return float64(n), true
}

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
		f, ok := jsonNumber(v)
		if !ok {
			return typeErr(tool, name, k)
		}
		f = max(-maxNumber, min(f, maxNumber))
		*(dst.(**float64)) = &f
	case kInt, kIntOrIntString:
		f, ok := jsonNumber(v)
		if !ok {
			var s string
			if k != kIntOrIntString || json.Unmarshal(v, &s) != nil {
				return typeErr(tool, name, k)
			}
			if f, ok = intString(s); !ok {
				return typeErr(tool, name, k)
			}
		}
		if f < 0 {
			return Errorf(ErrInvalidRequest, "%s parameter %q must not be negative", tool, name)
		}
		n := int(math.Floor(min(f, maxNumber)))
		*(dst.(**int)) = &n
	case kStringMap:
		var m map[string]json.RawMessage
		if err := json.Unmarshal(v, &m); err != nil {
			return typeErr(tool, name, k)
		}
		out := make(map[string]string, len(m))
		// Sorted, so that with several bad values the error is always
		// about the same one.
		for _, key := range slices.Sorted(maps.Keys(m)) {
			raw := m[key]
			var s string
			// Unmarshal leaves s alone for null; null is not a string.
			if err := json.Unmarshal(raw, &s); err != nil || isNull(raw) {
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
			if err := json.Unmarshal(raw, &s); err != nil || isNull(raw) {
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
		case "limits":
			l, err := DecodeLimits(v, func(key string) string {
				if key == "" {
					return fmt.Sprintf("%s parameter %q", ToolExec, "limits")
				}
				return fmt.Sprintf("%s parameter %q", ToolExec, "limits."+key)
			})
			if err != nil {
				return ExecArgs{}, err
			}
			if !l.IsZero() {
				a.Limits = &l
			}
			continue
		}
		if err := decodeValue(ToolExec, name, k, v, dst); err != nil {
			return ExecArgs{}, err
		}
	}
	if a.Timeout != nil && *a.Timeout < 0 {
		name := "timeout"
		if fields["timeout"] == nil || isNull(fields["timeout"]) {
			name = "timeoutSeconds"
		}
		return ExecArgs{}, Errorf(ErrInvalidRequest, "exec parameter %q must not be negative (0 disables the timeout)", name)
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
