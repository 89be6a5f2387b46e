package integration

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// joinLocalNode joins a second node named name to a running `execmesh up`
// as the README says (`execmesh nodes invite --local`, then `execmesh
// node --join CODE`) and waits until it is connected and paired.
func joinLocalNode(t *testing.T, d *bareDaemon, name string) *nodeProc {
	t.Helper()
	r := d.cli(t.TempDir(), "nodes", "invite", "--local", "--name", name)
	code, ok := strings.CutPrefix(strings.TrimSpace(r.stdout), "execmesh node --join ")
	if r.code != 0 || !ok {
		t.Fatalf("nodes invite: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	np := newNodeProc(t, "", "--join", code)
	np.start()
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, n := range httpGetJSON(t, d.url+"/v1/nodes")["nodes"].([]any) {
			n := n.(map[string]any)
			if n["name"] == name && n["status"] == "connected" && n["paired"] == true {
				return np
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s did not join:\n%s", name, np.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// postInvoke posts body to /tools/invoke as curl would and returns the
// status and the decoded answer.
func postInvoke(t *testing.T, url, body string) (int, map[string]any) {
	t.Helper()
	res, err := http.Post(url+"/tools/invoke", "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, out
}

// TestNodeRouting: a call that names a node runs on that node or nowhere
// (DESIGN.md §3.3), through the CLI and the HTTP API alike. The second
// node runs on this machine too; its HOME (its state dir, which only its
// process has) tells where a command ran.
func TestNodeRouting(t *testing.T) {
	d := trustedUp(t, t.TempDir())
	local := waitLocalNode(t, d)
	side := joinLocalNode(t, d, "side")
	caller := t.TempDir()

	// --node with host auto: host=node, on that node.
	if r := d.cli(caller, "exec", "--node", "side", `echo "home=$HOME"`); r.code != 0 || r.stdout != "home="+side.stateDir+"\n" {
		t.Fatalf("exec --node side: exit %d, stdout %q, stderr %q (the node's HOME is %s)", r.code, r.stdout, r.stderr, side.stateDir)
	}
	status, ans := postInvoke(t, d.url, `{"tool":"exec","command":"echo \"home=$HOME\"","node":"side"}`)
	if text := resultText(ans); status != 200 || strings.TrimSpace(text) != "home="+side.stateDir {
		t.Fatalf("HTTP node side: %d %v", status, ans)
	}

	// Refused calls run nothing: the command would create the marker.
	marker := filepath.Join(t.TempDir(), "ran")
	refused := []struct {
		name string
		args []string
		want []string // in stderr
	}{
		{"typo", []string{"exec", "--node", "sidee", "touch " + marker},
			[]string{`node "sidee" is unknown`, "side", local, "did you mean --node side?"}},
		{"unknown", []string{"exec", "--node", "nosuch", "touch " + marker},
			[]string{`node "nosuch" is unknown`, "side", local}},
		{"host gateway", []string{"exec", "--node", "side", "--host", "gateway", "touch " + marker},
			[]string{`exec host not allowed (node "side" given, but host resolves to gateway)`}},
		{"background", []string{"exec", "--background", "--node", "sidee", "touch " + marker},
			[]string{`node "sidee" is unknown`}},
	}
	for _, c := range refused {
		t.Run(c.name, func(t *testing.T) {
			r := d.cli(caller, c.args...)
			if r.code == 0 {
				t.Errorf("exit 0, stdout %q, stderr %q", r.stdout, r.stderr)
			}
			for _, w := range c.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr %q lacks %q", r.stderr, w)
				}
			}
			mustNotExist(t, marker, "a refused call's command")
		})
	}
	if r := d.cli(caller, "exec", "--node", "nosuch", "true"); strings.Contains(r.stderr, "did you mean") {
		t.Errorf("a suggestion for a name near none: %q", r.stderr)
	}

	// HTTP, the flat form of the docs' curl examples.
	status, ans = postInvoke(t, d.url, `{"tool":"exec","command":"touch `+marker+`","node":"nosuch"}`)
	msg := errorMessage(ans)
	if status != 400 || !strings.Contains(msg, `node "nosuch" is unknown`) || !strings.Contains(msg, "side") || !strings.Contains(msg, local) {
		t.Errorf("HTTP unknown node: %d %v", status, ans)
	}
	status, ans = postInvoke(t, d.url, `{"tool":"exec","command":"touch `+marker+`","node":"side","host":"gateway"}`)
	if msg := errorMessage(ans); status != 400 || msg != `exec host not allowed (node "side" given, but host resolves to gateway)` {
		t.Errorf("HTTP node with host gateway: %d %v", status, ans)
	}
	mustNotExist(t, marker, "a refused HTTP call's command")
}

// resultText is the text of a tool answer.
func resultText(ans map[string]any) string {
	res, _ := ans["result"].(map[string]any)
	content, _ := res["content"].([]any)
	var b strings.Builder
	for _, c := range content {
		if m, ok := c.(map[string]any); ok {
			s, _ := m["text"].(string)
			b.WriteString(s)
		}
	}
	return b.String()
}

// errorMessage is the message of a refused tool call.
func errorMessage(ans map[string]any) string {
	e, _ := ans["error"].(map[string]any)
	s, _ := e["message"].(string)
	return s
}

// TestMCPSendsClientDirectory: `execmesh mcp` in gateway mode runs exec
// calls in the MCP client's working directory (its own cwd) as `execmesh
// exec` does; --workdir wins over it, a workdir in the call over both,
// and a call for a node gets no directory from this machine.
func TestMCPSendsClientDirectory(t *testing.T) {
	daemonDir, clientDir, flagDir, callDir := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	d := trustedUp(t, daemonDir)
	local := waitLocalNode(t, d)
	bin, err := execmeshBinary()
	if err != nil {
		t.Fatal(err)
	}
	connect := func(extra ...string) *mcp.ClientSession {
		t.Helper()
		// --structured-content: the details object (its cwd) comes
		// only to a client that asks for it.
		cmd := exec.Command(bin, append([]string{"mcp", "--structured-content"}, extra...)...)
		cmd.Dir = clientDir
		cmd.Env = cleanEnv(map[string]string{"HOME": d.home, "EXECMESH_GATEWAY_URL": d.url, "EXECMESH_STATE_DIR": d.stateDir})
		client := mcp.NewClient(&mcp.Implementation{Name: "execmesh-integration", Version: "1"}, nil)
		cs, err := client.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatalf("connect to execmesh mcp: %v", err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		return cs
	}
	cwdOf := func(cs *mcp.ClientSession, args map[string]any) string {
		t.Helper()
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "exec", Arguments: args})
		if err != nil {
			t.Fatalf("exec %v: %v", args, err)
		}
		var text strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				text.WriteString(tc.Text)
			}
		}
		details, _ := res.StructuredContent.(map[string]any)
		cwd, _ := details["cwd"].(string)
		if res.IsError || cwd == "" || strings.TrimSpace(text.String()) != cwd {
			t.Fatalf("exec %v: isError %v, text %q, details %v", args, res.IsError, text.String(), res.StructuredContent)
		}
		return cwd
	}

	cs := connect()
	if got := cwdOf(cs, map[string]any{"command": "pwd"}); got != clientDir {
		t.Errorf("exec pwd: details.cwd %q, want the client's directory %q (the daemon's is %q)", got, clientDir, daemonDir)
	}
	if got := cwdOf(cs, map[string]any{"command": "pwd", "workdir": callDir}); got != callDir {
		t.Errorf("workdir in the call: details.cwd %q, want %q", got, callDir)
	}
	// The local node runs in its own default directory (the daemon's).
	if got := cwdOf(cs, map[string]any{"command": "pwd", "node": local}); got != daemonDir {
		t.Errorf("node call: details.cwd %q, want the node's default %q", got, daemonDir)
	}

	cs = connect("--workdir", flagDir)
	if got := cwdOf(cs, map[string]any{"command": "pwd"}); got != flagDir {
		t.Errorf("--workdir: details.cwd %q, want %q", got, flagDir)
	}
	if got := cwdOf(cs, map[string]any{"command": "pwd", "workdir": callDir}); got != callDir {
		t.Errorf("--workdir and a workdir in the call: details.cwd %q, want %q", got, callDir)
	}
}
