package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// TestListAnswerIsTheDecodedEncoding: a process list answered from the
// entries as their hosts encoded them (the HTTP answer) is byte for byte
// the encoding of the entries decoded (what the gateway wrote before it
// kept them, and what Invoke and the NATS API still give), text included:
// many sessions on the gateway and on two nodes, running and finished,
// with names and commands that JSON escapes, in two session keys (each
// list shows its own), whole and paged.
func TestListAnswerIsTheDecodedEncoding(t *testing.T) {
	env := startNodeGateway(t, nil, "", nil)
	alpha := env.pairAgent(testAgentConfig(t, env.srv, "alpha <&> \u2028"))
	beta := env.pairAgent(testAgentConfig(t, env.srv, "beta"))
	keys := []string{DefaultSessionKey, "agent:main:other"}
	commands := []string{
		"sleep 60", `sleep 60 # "quoted" \ back`, "sleep 60 # café \u2028 日本語", "sleep 60 # <b>&amp;</b>",
		"sleep 60 # tab\there", "exit 3", "echo done", "sleep 60 # " + strings.Repeat("long ", 40),
	}
	hosts := []map[string]any{{}, {"host": "node", "node": alpha.ID()}, {"host": "node", "node": beta.ID()}}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	perKey := make(map[string]int)
	for i := range 48 {
		key := keys[i%len(keys)]
		perKey[key]++
		args := map[string]any{"command": commands[i%len(commands)], "background": true}
		for k, v := range hosts[i%len(hosts)] {
			args[k] = v
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if res := env.invoke("exec", args, key); res.Status() != protocol.StatusRunning && res.Status() != protocol.StatusCompleted && res.Status() != protocol.StatusFailed {
				t.Errorf("exec %v: %s", args, res.Text())
			}
		})
	}
	wg.Wait()

	pages := []map[string]any{{}, {"limit": 5}, {"offset": 3, "limit": 7}, {"offset": 20}, {"offset": 100, "limit": 2}, {"limit": 1000}}
	for _, key := range keys {
		for _, page := range pages {
			args := protocol.ProcessArgs{Action: "list"}
			if v, ok := page["offset"].(int); ok {
				args.Offset = &v
			}
			if v, ok := page["limit"].(int); ok {
				args.Limit = &v
			}
			_, agentID, err := ParseSessionKey(key)
			if err != nil {
				t.Fatal(err)
			}
			c := &call{g: env.g, cfg: env.g.Config(), sessionKey: key, agentID: agentID}
			lr, err := c.listEntries(t.Context(), args)
			if err != nil {
				t.Fatalf("%s %v: %v", key, page, err)
			}
			res := lr.Result()
			if got, want := lr.AppendJSON(nil), res.AppendJSON(nil); !bytes.Equal(got, want) {
				t.Fatalf("%s %v: the answer from the entries\n%s\nthe encoding of them decoded\n%s", key, page, got, want)
			}
			// The text is the one of the decoded entries.
			sessions := res.Details.Sessions.Value()
			want := session.ListResult(sessions)
			if p, _ := session.ListPageOf(args); p.Paged {
				want = session.PagedListResult(p, sessions, res.Details.Total.Value())
			}
			if res.Text() != want.Text() {
				t.Fatalf("%s %v: text\n%s\nwant\n%s", key, page, res.Text(), want.Text())
			}
			// Each list shows its own key's sessions, all of them.
			if len(page) == 0 && len(sessions) != perKey[key] {
				t.Fatalf("%s: %d sessions listed, want %d: %s", key, len(sessions), perKey[key], res.Text())
			}
			for _, d := range sessions {
				if d.NodeID.Value() == alpha.ID() && d.NodeName.Value() != "alpha <&> \u2028" {
					t.Fatalf("%s: node session %v", key, d)
				}
			}
		}
	}

	// Once every session has finished its entries stay as they are, so
	// the HTTP answer can be compared with the one of the decoded result
	// (Invoke's, which the NATS API encodes) made later.
	for _, key := range keys {
		for _, d := range env.invoke("process", map[string]any{"action": "list"}, key).Details.Sessions.Value() {
			if d.Status.Value() == protocol.StatusRunning {
				env.invoke("process", map[string]any{"action": "kill", "sessionId": d.SessionID.Value()}, key)
			}
		}
	}
	for _, key := range keys {
		for _, page := range pages {
			args := map[string]any{"action": "list"}
			for k, v := range page {
				args[k] = v
			}
			checkFor(t, 30*time.Second, func() error {
				r := env.invokeRaw("process", args, key)
				if r.Result == nil {
					return fmt.Errorf("no result: %s", r.Raw)
				}
				if strings.Contains(r.Result.Text(), " running ") {
					return fmt.Errorf("sessions still running: %s", r.Result.Text())
				}
				body, err := json.Marshal(args)
				if err != nil {
					return err
				}
				res, err := env.g.Invoke(t.Context(), InvokeRequest{Tool: "process", Args: body, SessionKey: key})
				if err != nil {
					return err
				}
				want := append(res.AppendJSON([]byte(`{"ok":true,"result":`)), '}', '\n')
				if !bytes.Equal(r.Raw, want) {
					return fmt.Errorf("%s %v: HTTP answer\n%s\nInvoke's result encoded\n%s", key, page, r.Raw, want)
				}
				return nil
			})
		}
	}
}
