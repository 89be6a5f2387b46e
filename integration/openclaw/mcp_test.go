package openclaw

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/execmesh/execmesh/internal/openclawtest"
	"github.com/execmesh/execmesh/internal/testutil"
)

// TestBackgroundExitReachesModelOnce: an OpenClaw agent, configured with
// what `execmesh mcp --print-config` prints, runs a command in the
// foreground and one in the background through execmesh__exec and polls
// the background one in a later turn while it still runs. Then the
// OpenClaw session is deleted, which stops its MCP server (a stdio child
// is killed), and after the command exited the agent makes other calls in
// two turns of its new session. The exit notice reaches the model exactly
// once, on the first tool result after the exit (OpenClaw takes no log
// messages, yet answers pings; the sessionKey outlives the server), and
// the model is shown each output once (no structured content repeating
// the text). Over stdio (`execmesh mcp` against `execmesh up`) and over
// the gateway's streamable HTTP.
func TestBackgroundExitReachesModelOnce(t *testing.T) {
	in := openclawtest.Require(t)
	for _, transport := range []string{"openclaw", "openclaw-http"} {
		t.Run(transport, func(t *testing.T) {
			d := startDaemon(t)
			gate := filepath.Join(t.TempDir(), "gate")
			var mu sync.Mutex
			var id string // the background session, from the exec result
			model := openclawtest.NewModel(t, func(r openclawtest.Request) openclawtest.Reply {
				mu.Lock()
				defer mu.Unlock()
				prompt, step := r.LastUser(), r.Step()
				switch {
				case strings.Contains(prompt, "start them") && step == 0:
					return toolCall("execmesh__exec", map[string]any{"command": "echo fg-$((40+2))"})
				case strings.Contains(prompt, "start them") && step == 1:
					return toolCall("execmesh__exec", map[string]any{
						"command":    fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done; echo bg-$((6*7))", gate),
						"background": true,
					})
				case strings.Contains(prompt, "start them") && step == 2:
					for _, m := range r.ToolResults() {
						if sm := runningID.FindStringSubmatch(m.Text); sm != nil {
							id = sm[1]
						}
					}
					return openclawtest.Reply{Text: "started"}
				case strings.Contains(prompt, "poll it") && step == 0:
					return toolCall("execmesh__process", map[string]any{"action": "poll", "sessionId": id})
				case (strings.Contains(prompt, "look around") || strings.Contains(prompt, "once more")) && step == 0:
					return toolCall("execmesh__process", map[string]any{"action": "list"})
				}
				return openclawtest.Reply{Text: "ok"}
			})
			cfg := printConfig(t, transport, "--gateway", d.url, "--token", d.token)
			g := openclawtest.StartGateway(t, in, openclawtest.GatewayOptions{Model: model, Config: cfg})
			const key = "agent:main:bg"
			agentTurn(t, g, key, "start them")
			mu.Lock()
			bgID := id
			mu.Unlock()
			if bgID == "" {
				last, _ := model.Last("start them")
				t.Fatalf("the background exec did not answer with a running session:\n%s", last.Transcript())
			}
			agentTurn(t, g, key, "poll it")
			servers := testutil.StillAlive(mcpServers(binary(t)))
			if transport == "openclaw" && len(servers) == 0 {
				t.Fatal("no `execmesh mcp` process while the OpenClaw session lives")
			}
			if out, err := g.Command(t.Context(), "sessions", "delete", key, "--yes").CombinedOutput(); err != nil {
				t.Fatalf("openclaw sessions delete %s: %v\n%s", key, err, out)
			}
			for deadline := time.Now().Add(20 * time.Second); len(testutil.StillAlive(servers)) > 0; time.Sleep(100 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the stdio MCP server outlived its OpenClaw session")
				}
			}
			if err := os.WriteFile(gate, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			d.waitExited(t, "agent:main:main", bgID)
			time.Sleep(500 * time.Millisecond) // the exit event follows the exit
			agentTurn(t, g, key, "look around")
			agentTurn(t, g, key, "once more")

			notice := "Exec completed (" + bgID + ", code 0) :: bg-42"
			after, ok := model.Last("look around")
			if !ok {
				t.Fatal("no model request of the turn after the exit")
			}
			if after.Count("fg-42") != 0 {
				t.Errorf("the turn after the delete still had the old conversation:\n%s", after.Transcript())
			}
			if n := after.Count(notice); n != 1 {
				t.Errorf("the turn after the exit showed the model the notice %q %d times, want once:\n%s", notice, n, after.Transcript())
			}
			final, _ := model.Last("once more")
			polled, _ := model.Last("poll it")
			for what, n := range map[string]int{
				notice:  final.Count(notice),
				"bg-42": final.Count("bg-42"),
				"fg-42": polled.Count("fg-42"), // the conversation before the delete
			} {
				if n != 1 {
					t.Errorf("in the end the model was shown %q %d times, want once", what, n)
				}
			}
			if t.Failed() {
				t.Logf("the model's last request:\n%s", final.Transcript())
			}
		})
	}
}

// TestAgentsDoNotShareSessions: OpenClaw passes an MCP server nothing that
// names its session, so the key is per agent (--session-key
// agent:<id>:main, one server per agent, each agent denied the other's).
// Two OpenClaw sessions of two agents each start a background command,
// list, try to kill the other's and kill their own: neither sees or
// reaches the other's.
func TestAgentsDoNotShareSessions(t *testing.T) {
	in := openclawtest.Require(t)
	d := startDaemon(t)
	main := printConfig(t, "openclaw", "--gateway", d.url, "--token", d.token, "--session-key", "agent:main:main")
	ops := printConfig(t, "openclaw", "--gateway", d.url, "--token", d.token, "--session-key", "agent:ops:main")
	servers := main["mcp"].(map[string]any)["servers"].(map[string]any)
	servers["execmesh_ops"] = ops["mcp"].(map[string]any)["servers"].(map[string]any)["execmesh"]
	main["agents"] = map[string]any{"entries": map[string]any{
		"main": map[string]any{"tools": map[string]any{"deny": []any{"exec", "process", "execmesh_ops__*"}}},
		"ops":  map[string]any{"tools": map[string]any{"deny": []any{"exec", "process", "execmesh__*"}}},
	}}
	prefix := map[string]string{"main": "execmesh__", "ops": "execmesh_ops__"}
	others := map[string]string{"main": "ops", "ops": "main"}
	var mu sync.Mutex
	ids := map[string]string{}
	model := openclawtest.NewModel(t, func(r openclawtest.Request) openclawtest.Reply {
		mu.Lock()
		defer mu.Unlock()
		prompt, step := r.LastUser(), r.Step()
		agent := "main"
		if strings.Contains(prompt, "(ops)") {
			agent = "ops"
		}
		switch {
		case strings.Contains(prompt, "start mine") && step == 0:
			return toolCall(prefix[agent]+"exec", map[string]any{"command": "sleep 300", "background": true})
		case strings.Contains(prompt, "list mine") && step == 0:
			return toolCall(prefix[agent]+"process", map[string]any{"action": "list"})
		case strings.Contains(prompt, "list mine") && step == 1:
			return toolCall(prefix[agent]+"process", map[string]any{"action": "kill", "sessionId": ids[others[agent]]})
		case strings.Contains(prompt, "list mine") && step == 2:
			return toolCall(prefix[agent]+"process", map[string]any{"action": "kill", "sessionId": ids[agent]})
		}
		return openclawtest.Reply{Text: "ok"}
	})
	g := openclawtest.StartGateway(t, in, openclawtest.GatewayOptions{Model: model, Config: main})
	for _, agent := range []string{"main", "ops"} {
		agentTurn(t, g, "agent:"+agent+":iso", "start mine ("+agent+")")
		r, _ := model.Last("start mine (" + agent + ")")
		mu.Lock()
		for _, m := range r.ToolResults() {
			if sm := runningID.FindStringSubmatch(m.Text); sm != nil {
				ids[agent] = sm[1]
			}
		}
		mu.Unlock()
		if ids[agent] == "" {
			t.Fatalf("%s's background exec did not answer with a running session:\n%s", agent, r.Transcript())
		}
	}
	for _, agent := range []string{"main", "ops"} {
		agentTurn(t, g, "agent:"+agent+":iso", "list mine ("+agent+")")
	}
	for agent, other := range others {
		r, ok := model.Last("list mine (" + agent + ")")
		if !ok || r.Step() != 3 {
			t.Fatalf("%s: no model request after its list and kills", agent)
		}
		if !strings.Contains(strings.Join(r.Tools, " "), prefix[agent]+"exec") || strings.Contains(strings.Join(r.Tools, " "), prefix[other]+"exec") {
			t.Errorf("%s was offered %v", agent, r.Tools)
		}
		res := r.ToolResults()
		if len(res) != 3 {
			t.Fatalf("%s: %d tool results, want 3:\n%s", agent, len(res), r.Transcript())
		}
		if !strings.Contains(res[0].Text, ids[agent]) || strings.Contains(res[0].Text, ids[other]) {
			t.Errorf("%s's list, want its own session %s and not %s's %s:\n%s", agent, ids[agent], other, ids[other], r.Transcript())
		}
		if !strings.Contains(res[1].Text, "No active session found for "+ids[other]) {
			t.Errorf("%s killing %s's session %s: %q, want No active session found", agent, other, ids[other], res[1].Text)
		}
		if !strings.Contains(res[2].Text, "Termination requested for session "+ids[agent]) {
			t.Errorf("%s killing its own session: %q", agent, res[2].Text)
		}
		d.waitExited(t, "agent:"+agent+":main", ids[agent])
	}
}

// mcpServers lists the `execmesh mcp` processes of the binary bin.
func mcpServers(bin string) []testutil.Proc {
	mcp := testutil.ProcsWith("mcp")
	var out []testutil.Proc
	for _, p := range testutil.ProcsWith(bin) {
		if slices.Contains(mcp, p) {
			out = append(out, p)
		}
	}
	return out
}
