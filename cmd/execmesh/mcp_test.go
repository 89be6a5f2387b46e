package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

func TestMCPWorkdir(t *testing.T) {
	local := func(context.Context) (string, bool) { return "/client/dir", true }
	cases := []struct {
		name     string
		explicit string
		local    bool // the gateway shares this machine
		args     string
		want     string // "" = args unchanged
	}{
		{name: "client directory", local: true, args: `{"command":"pwd"}`, want: `{"command":"pwd","workdir":"/client/dir"}`},
		{name: "explicit wins", explicit: "/flag", local: true, args: `{"command":"pwd"}`, want: `{"command":"pwd","workdir":"/flag"}`},
		{name: "the call's workdir wins", explicit: "/flag", local: true, args: `{"command":"pwd","workdir":"/call"}`},
		{name: "empty workdir is none", local: true, args: `{"command":"pwd","workdir":""}`, want: `{"command":"pwd","workdir":"/client/dir"}`},
		{name: "null workdir is none", local: true, args: `{"command":"pwd","workdir":null}`, want: `{"command":"pwd","workdir":"/client/dir"}`},
		{name: "a node call gets no client directory", local: true, args: `{"command":"pwd","node":"side"}`},
		{name: "host node gets no client directory", local: true, args: `{"command":"pwd","host":" Node "}`},
		{name: "an explicit directory goes to a node too", explicit: "/flag", local: true, args: `{"command":"pwd","node":"side"}`,
			want: `{"command":"pwd","node":"side","workdir":"/flag"}`},
		{name: "remote gateway", args: `{"command":"pwd"}`},
		{name: "a workdir the gateway refuses stays", local: true, args: `{"command":"pwd","workdir":7}`},
		{name: "not an object", local: true, args: `["pwd"]`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := &workdirInvoker{explicit: c.explicit}
			if c.local {
				w.local = local
			}
			got := w.withWorkdir(t.Context(), json.RawMessage(c.args))
			want := c.want
			if want == "" {
				want = c.args
			}
			if string(got) != want {
				t.Errorf("got %s, want %s", got, want)
			}
		})
	}
}

// TestMCPPrintConfig: --print-config prints OpenClaw's configuration for
// the flags' gateway, token and sessionKey (integration/openclaw runs it
// with the real OpenClaw); an unknown client is a usage error.
func TestMCPPrintConfig(t *testing.T) {
	t.Parallel()
	tools := `"tools":{"deny":["exec","process"],"profile":"coding","toolSearch":false}`
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		want string // the servers.execmesh object, compact, without command
	}{
		{"stdio", nil, []string{"--print-config", "openclaw", "--gateway", "http://127.0.0.1:9000/", "--token", "tok", "--session-key", "agent:ops:main"}, 0,
			`{"args":["mcp","--session-key","agent:ops:main"],"env":{"EXECMESH_GATEWAY_TOKEN":"tok","EXECMESH_GATEWAY_URL":"http://127.0.0.1:9000"},"requestTimeoutMs":150000}`},
		{"stdio defaults", nil, []string{"--print-config", "openclaw"}, 0,
			`{"args":["mcp","--session-key","agent:main:main"],"env":{"EXECMESH_GATEWAY_URL":"http://127.0.0.1:8420"},"requestTimeoutMs":150000}`},
		{"token from the environment", map[string]string{envToken: "env-tok", envGatewayURL: "http://10.0.0.1:8420"}, []string{"--print-config", "openclaw-http"}, 0,
			`{"headers":{"Authorization":"Bearer env-tok","X-Execmesh-Session-Key":"agent:main:main"},"requestTimeoutMs":150000,"transport":"streamable-http","url":"http://10.0.0.1:8420/mcp"}`},
		{"unknown client", nil, []string{"--print-config", "claude"}, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, tc.env, "", append([]string{"mcp"}, tc.args...)...)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d: %s %s", r.code, tc.code, r.stdout, r.stderr)
			}
			if tc.code != 0 {
				if !strings.Contains(r.stderr, "want openclaw or openclaw-http") {
					t.Errorf("stderr %q", r.stderr)
				}
				return
			}
			var got struct {
				Tools json.RawMessage `json:"tools"`
				MCP   struct {
					Servers map[string]map[string]any `json:"servers"`
				} `json:"mcp"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatalf("%v: %s", err, r.stdout)
			}
			if b, _ := json.Marshal(map[string]json.RawMessage{"tools": got.Tools}); string(b) != "{"+tools+"}" {
				t.Errorf("tools %s", b)
			}
			srv := got.MCP.Servers["execmesh"]
			if cmd, ok := srv["command"].(string); ok {
				if cmd == "" {
					t.Errorf("empty command")
				}
				delete(srv, "command")
			}
			if b, _ := json.Marshal(srv); string(b) != tc.want {
				t.Errorf("server\n got %s\nwant %s", b, tc.want)
			}
		})
	}
}
