package protocol

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

func ptr[T any](v T) *T { return &v }

// invalidRequest asserts err is an invalid_request *Error and returns its text.
func invalidRequest(t *testing.T, err error) string {
	t.Helper()
	var pe *Error
	if !errors.As(err, &pe) {
		t.Fatalf("error = %v (%T), want *Error", err, err)
	}
	if pe.Type != ErrInvalidRequest {
		t.Errorf("error type = %q, want %q", pe.Type, ErrInvalidRequest)
	}
	return pe.Message
}

func TestDecodeExecArgs(t *testing.T) {
	cases := []struct {
		name string
		raw  string
		want ExecArgs
	}{
		{"command only", `{"command":"ls -la"}`, ExecArgs{Command: "ls -la"}},
		{"every parameter", `{"command":"make","workdir":"/src","env":{"A":"1","B":""},"yieldMs":500,"background":true,
			"timeout":30,"pty":true,"elevated":false,"host":"node","security":"allowlist","ask":"off","node":"build-1"}`,
			ExecArgs{Command: "make", Workdir: "/src", Env: map[string]string{"A": "1", "B": ""}, YieldMs: ptr(500.0),
				Background: true, Timeout: ptr(30.0), PTY: true, Elevated: ptr(false), Host: "node", Security: "allowlist",
				Ask: "off", Node: "build-1"}},
		{"timeoutSeconds alias", `{"command":"x","timeoutSeconds":5}`, ExecArgs{Command: "x", Timeout: ptr(5.0)}},
		{"timeout zero disables", `{"command":"x","timeout":0}`, ExecArgs{Command: "x", Timeout: ptr(0.0)}},
		{"fractional timeout", `{"command":"x","timeout":0.5}`, ExecArgs{Command: "x", Timeout: ptr(0.5)}},
		{"null timeout with timeoutSeconds", `{"command":"x","timeout":null,"timeoutSeconds":7}`, ExecArgs{Command: "x", Timeout: ptr(7.0)}},
		{"null timeoutSeconds with timeout", `{"command":"x","timeout":7,"timeoutSeconds":null}`, ExecArgs{Command: "x", Timeout: ptr(7.0)}},
		{"null fields are ignored", `{"command":"x","workdir":null,"env":null,"yieldMs":null,"background":null,"timeout":null,
			"pty":null,"elevated":null,"host":null,"security":null,"ask":null,"node":null}`, ExecArgs{Command: "x"}},
		{"whitespace around the object", " \n{\"command\":\"x\"}\t", ExecArgs{Command: "x"}},
		{"elevated true", `{"command":"x","elevated":true}`, ExecArgs{Command: "x", Elevated: ptr(true)}},
		{"empty env", `{"command":"x","env":{}}`, ExecArgs{Command: "x", Env: map[string]string{}}},
		{"huge timeout is clamped", `{"command":"x","timeout":1e300}`, ExecArgs{Command: "x", Timeout: ptr(float64(math.MaxInt32))}},
		{"timeout beyond float64 is clamped", `{"command":"x","timeout":1e400}`, ExecArgs{Command: "x", Timeout: ptr(float64(math.MaxInt32))}},
		{"huge yieldMs is clamped", `{"command":"x","yieldMs":123456789012345}`, ExecArgs{Command: "x", YieldMs: ptr(float64(math.MaxInt32))}},
		{"negative yieldMs is left to the clamp", `{"command":"x","yieldMs":-5}`, ExecArgs{Command: "x", YieldMs: ptr(-5.0)}},
		{"hugely negative yieldMs is clamped", `{"command":"x","yieldMs":-1e999}`, ExecArgs{Command: "x", YieldMs: ptr(float64(-math.MaxInt32))}},
		{"duplicate keys: last wins", `{"command":"a","command":"b"}`, ExecArgs{Command: "b"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := DecodeExecArgs([]byte(c.raw))
			if err != nil {
				t.Fatalf("DecodeExecArgs(%s) = %v", c.raw, err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
		})
	}
}

func TestDecodeExecArgsErrors(t *testing.T) {
	cases := []struct {
		name, raw, want string
		prefix          bool // want is a prefix of the message
	}{
		{name: "cwd hint", raw: `{"command":"ls","cwd":"/"}`, want: `exec parameter "cwd" is unsupported; use "workdir" instead`},
		{name: "timeoutMs hint", raw: `{"command":"ls","timeoutMs":5}`, want: `exec parameter "timeoutMs" is unsupported; use "timeout" instead`},
		{name: "timeout_seconds hint", raw: `{"command":"ls","timeout_seconds":5}`, want: `exec parameter "timeout_seconds" is unsupported; use "timeoutSeconds" instead`},
		{name: "cmd hint", raw: `{"cmd":"ls"}`, want: `exec parameter "cmd" is unsupported; use "command" instead`},
		{name: "case-insensitive hint", raw: `{"Command":"ls"}`, want: `exec parameter "Command" is unsupported; use "command" instead`},
		{name: "unknown parameter", raw: `{"command":"ls","bogus":1}`,
			want: `exec parameter "bogus" is unsupported (known parameters: ask, background, command, elevated, env, host, limits, node, pty, security, timeout, timeoutSeconds, workdir, yieldMs)`},
		{name: "unknown even when null", raw: `{"command":"ls","cwd":null}`, want: `exec parameter "cwd" is unsupported; use "workdir" instead`},
		{name: "command number", raw: `{"command":5}`, want: `exec parameter "command" must be a string`},
		{name: "command array", raw: `{"command":["ls"]}`, want: `exec parameter "command" must be a string`},
		{name: "workdir bool", raw: `{"command":"x","workdir":true}`, want: `exec parameter "workdir" must be a string`},
		{name: "background string", raw: `{"command":"x","background":"true"}`, want: `exec parameter "background" must be a boolean`},
		{name: "pty number", raw: `{"command":"x","pty":1}`, want: `exec parameter "pty" must be a boolean`},
		{name: "elevated string", raw: `{"command":"x","elevated":"yes"}`, want: `exec parameter "elevated" must be a boolean`},
		{name: "yieldMs string", raw: `{"command":"x","yieldMs":"100"}`, want: `exec parameter "yieldMs" must be a number`},
		{name: "timeout string", raw: `{"command":"x","timeout":"5"}`, want: `exec parameter "timeout" must be a number`},
		{name: "timeoutSeconds bool", raw: `{"command":"x","timeoutSeconds":true}`, want: `exec parameter "timeoutSeconds" must be a number`},
		{name: "env array", raw: `{"command":"x","env":["A=1"]}`, want: `exec parameter "env" must be an object of string values`},
		{name: "env string", raw: `{"command":"x","env":"A=1"}`, want: `exec parameter "env" must be an object of string values`},
		{name: "env value number", raw: `{"command":"x","env":{"A":1}}`, want: `exec parameter "env": value of "A" must be a string`},
		{name: "env value null", raw: `{"command":"x","env":{"A":null}}`, want: `exec parameter "env": value of "A" must be a string`},
		{name: "host number", raw: `{"command":"x","host":1}`, want: `exec parameter "host" must be a string`},
		{name: "both timeouts", raw: `{"command":"x","timeout":5,"timeoutSeconds":5}`,
			want: `exec parameters "timeout" and "timeoutSeconds" mean the same; pass only one`},
		{name: "negative timeout", raw: `{"command":"x","timeout":-1}`, want: `exec parameter "timeout" must not be negative (0 disables the timeout)`},
		{name: "negative timeoutSeconds", raw: `{"command":"x","timeoutSeconds":-0.5}`, want: `exec parameter "timeoutSeconds" must not be negative (0 disables the timeout)`},
		{name: "hugely negative timeout", raw: `{"command":"x","timeout":-1e999}`, want: `exec parameter "timeout" must not be negative (0 disables the timeout)`},
		{name: "missing command", raw: `{}`, want: `Provide a command to start.`},
		{name: "empty command", raw: `{"command":""}`, want: `Provide a command to start.`},
		{name: "blank command", raw: `{"command":"  \n\t"}`, want: `Provide a command to start.`},
		{name: "null command", raw: `{"command":null}`, want: `Provide a command to start.`},
		{name: "null args", raw: `null`, want: `Provide a command to start.`},
		{name: "no args", raw: ``, want: `Provide a command to start.`},
		{name: "array args", raw: `["ls"]`, want: `exec arguments must be a JSON object`},
		{name: "string args", raw: `"ls"`, want: `exec arguments must be a JSON object`},
		{name: "number args", raw: `5`, want: `exec arguments must be a JSON object`},
		{name: "bool args", raw: `true`, want: `exec arguments must be a JSON object`},
		{name: "truncated JSON", raw: `{"command":"ls"`, want: `exec arguments are not valid JSON: `, prefix: true},
		{name: "trailing garbage", raw: `{"command":"ls"} x`, want: `exec arguments are not valid JSON: `, prefix: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := DecodeExecArgs([]byte(c.raw))
			if err == nil {
				t.Fatalf("DecodeExecArgs(%s) = %+v, want error %q", c.raw, got, c.want)
			}
			msg := invalidRequest(t, err)
			if c.prefix && !strings.HasPrefix(msg, c.want) || !c.prefix && msg != c.want {
				t.Errorf("message\n got %q\nwant %q", msg, c.want)
			}
			if !reflect.DeepEqual(got, ExecArgs{}) {
				t.Errorf("partial result %+v returned with an error", got)
			}
		})
	}
}

func TestDecodeProcessArgs(t *testing.T) {
	cases := []struct {
		name string
		raw  string
		want ProcessArgs
	}{
		{"list", `{"action":"list"}`, ProcessArgs{Action: "list"}},
		{"poll with timeout", `{"action":"poll","sessionId":"nimble-coral","timeout":2000}`,
			ProcessArgs{Action: "poll", SessionID: "nimble-coral", Timeout: ptr(2000)}},
		// Spec §23.3 case 27 and DESIGN.md §7: an integer string is accepted.
		{"timeout integer string", `{"action":"poll","sessionId":"s","timeout":"2000"}`, ProcessArgs{Action: "poll", SessionID: "s", Timeout: ptr(2000)}},
		{"timeout plus sign", `{"action":"poll","sessionId":"s","timeout":"+2000"}`, ProcessArgs{Action: "poll", SessionID: "s", Timeout: ptr(2000)}},
		{"timeout padded string", `{"action":"poll","sessionId":"s","timeout":" 2000 "}`, ProcessArgs{Action: "poll", SessionID: "s", Timeout: ptr(2000)}},
		{"timeout zero string", `{"action":"poll","sessionId":"s","timeout":"0"}`, ProcessArgs{Action: "poll", SessionID: "s", Timeout: ptr(0)}},
		{"timeout minus zero string", `{"action":"poll","sessionId":"s","timeout":"-0"}`, ProcessArgs{Action: "poll", SessionID: "s", Timeout: ptr(0)}},
		{"fractional timeout floored", `{"action":"poll","sessionId":"s","timeout":2000.9}`, ProcessArgs{Action: "poll", SessionID: "s", Timeout: ptr(2000)}},
		{"huge timeout clamped", `{"action":"poll","sessionId":"s","timeout":1e400}`, ProcessArgs{Action: "poll", SessionID: "s", Timeout: ptr(math.MaxInt32)}},
		{"huge timeout string clamped", `{"action":"poll","sessionId":"s","timeout":"99999999999999999999"}`, ProcessArgs{Action: "poll", SessionID: "s", Timeout: ptr(math.MaxInt32)}},
		{"log paging", `{"action":"log","sessionId":"s","offset":1,"limit":2}`, ProcessArgs{Action: "log", SessionID: "s", Offset: ptr(1), Limit: ptr(2)}},
		{"fractional offset floored", `{"action":"log","sessionId":"s","offset":1.7,"limit":0}`, ProcessArgs{Action: "log", SessionID: "s", Offset: ptr(1), Limit: ptr(0)}},
		{"huge limit clamped", `{"action":"log","sessionId":"s","limit":1e12}`, ProcessArgs{Action: "log", SessionID: "s", Limit: ptr(math.MaxInt32)}},
		{"write", `{"action":"write","sessionId":"s","data":"hi\n","eof":true}`, ProcessArgs{Action: "write", SessionID: "s", Data: ptr("hi\n"), EOF: true}},
		{"empty data kept", `{"action":"write","sessionId":"s","data":""}`, ProcessArgs{Action: "write", SessionID: "s", Data: ptr("")}},
		{"send-keys", `{"action":"send-keys","sessionId":"s","keys":["C-c","Enter"],"hex":["0x1b"],"literal":"x"}`,
			ProcessArgs{Action: "send-keys", SessionID: "s", Keys: []string{"C-c", "Enter"}, Hex: []string{"0x1b"}, Literal: ptr("x")}},
		{"paste", `{"action":"paste","sessionId":"s","text":"abc","bracketed":false}`,
			ProcessArgs{Action: "paste", SessionID: "s", Text: ptr("abc"), Bracketed: ptr(false)}},
		{"null fields are ignored", `{"action":"poll","sessionId":null,"data":null,"keys":null,"hex":null,"literal":null,"text":null,
			"bracketed":null,"eof":null,"offset":null,"limit":null,"timeout":null}`, ProcessArgs{Action: "poll"}},
		{"unknown action is left to the tool", `{"action":"frobnicate"}`, ProcessArgs{Action: "frobnicate"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := DecodeProcessArgs([]byte(c.raw))
			if err != nil {
				t.Fatalf("DecodeProcessArgs(%s) = %v", c.raw, err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
		})
	}
}

func TestDecodeProcessArgsErrors(t *testing.T) {
	const timeoutType = `process parameter "timeout" must be a non-negative integer (or an integer string)`
	cases := []struct{ name, raw, want string }{
		{"missing action", `{"sessionId":"s"}`, `process parameter "action" is required (one of: list, poll, log, write, send-keys, submit, paste, kill, clear, remove)`},
		{"empty args", `{}`, `process parameter "action" is required (one of: list, poll, log, write, send-keys, submit, paste, kill, clear, remove)`},
		{"action number", `{"action":1}`, `process parameter "action" must be a string`},
		{"session_id hint", `{"action":"poll","session_id":"s"}`, `process parameter "session_id" is unsupported; use "sessionId" instead`},
		{"timeoutMs hint", `{"action":"poll","timeoutMs":5}`, `process parameter "timeoutMs" is unsupported; use "timeout" instead`},
		{"stdin hint", `{"action":"write","stdin":"x"}`, `process parameter "stdin" is unsupported; use "data" instead`},
		{"unknown", `{"action":"list","verbose":true}`,
			`process parameter "verbose" is unsupported (known parameters: action, bracketed, data, eof, hex, keys, limit, literal, offset, sessionId, text, timeout)`},
		// Spec §23.3 case 34 says OpenClaw treats "1e3" as 0; execmesh is strict.
		{"timeout exponent string", `{"action":"poll","timeout":"1e3"}`, timeoutType},
		{"timeout hex string", `{"action":"poll","timeout":"0x10"}`, timeoutType},
		{"timeout underscore string", `{"action":"poll","timeout":"2_000"}`, timeoutType},
		{"timeout fractional string", `{"action":"poll","timeout":"1.5"}`, timeoutType},
		{"timeout two signs", `{"action":"poll","timeout":"+-1"}`, timeoutType},
		{"timeout empty string", `{"action":"poll","timeout":""}`, timeoutType},
		{"timeout sign only", `{"action":"poll","timeout":"+"}`, timeoutType},
		{"timeout bool", `{"action":"poll","timeout":true}`, timeoutType},
		{"timeout negative", `{"action":"poll","timeout":-5}`, `process parameter "timeout" must not be negative`},
		{"timeout negative string", `{"action":"poll","timeout":"-5"}`, `process parameter "timeout" must not be negative`},
		{"timeout hugely negative string", `{"action":"poll","timeout":"-99999999999999999999"}`, `process parameter "timeout" must not be negative`},
		{"offset negative", `{"action":"log","offset":-1}`, `process parameter "offset" must not be negative`},
		{"limit negative", `{"action":"log","limit":-3}`, `process parameter "limit" must not be negative`},
		{"limit hugely negative", `{"action":"log","limit":-1e400}`, `process parameter "limit" must not be negative`},
		{"offset string", `{"action":"log","offset":"1"}`, `process parameter "offset" must be a non-negative integer`},
		{"keys string", `{"action":"send-keys","keys":"Enter"}`, `process parameter "keys" must be an array of strings`},
		{"keys element", `{"action":"send-keys","keys":["Enter",1]}`, `process parameter "keys": element 1 must be a string`},
		{"hex element null", `{"action":"send-keys","hex":[null]}`, `process parameter "hex": element 0 must be a string`},
		{"data number", `{"action":"write","data":1}`, `process parameter "data" must be a string`},
		{"eof string", `{"action":"write","eof":"true"}`, `process parameter "eof" must be a boolean`},
		{"bracketed number", `{"action":"paste","bracketed":0}`, `process parameter "bracketed" must be a boolean`},
		{"array args", `[]`, `process arguments must be a JSON object`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := DecodeProcessArgs([]byte(c.raw))
			if err == nil {
				t.Fatalf("DecodeProcessArgs(%s) = %+v, want error %q", c.raw, got, c.want)
			}
			if msg := invalidRequest(t, err); msg != c.want {
				t.Errorf("message\n got %q\nwant %q", msg, c.want)
			}
		})
	}
}
