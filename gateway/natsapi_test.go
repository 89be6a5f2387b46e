package gateway

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/nats-io/nats.go"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/protocol"
)

// TestNATSInvokeMatchesHTTP: the same JSON as a NATS request on
// <prefix>.gw.invoke gives the same answer as POST /tools/invoke, with the
// token in an Authorization header; system events are published on NATS.
func TestNATSInvokeMatchesHTTP(t *testing.T) {
	srv := bustest.StartServer(t)
	tg := startGateway(t, func(c *config.Config, o *Options) {
		onServer(t, srv, t.TempDir())(c, o)
		c.Gateway.Auth.Token = "tok"
	})
	client := bustest.Connect(t, srv, bus.ClientConfig{})
	request := func(body string, token string) (map[string]any, string) {
		t.Helper()
		msg := nats.NewMsg(InvokeSubject("execmesh"))
		msg.Data = []byte(body)
		if token != "" {
			msg.Header.Set("Authorization", "Bearer "+token)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		reply, err := client.RequestMsgWithContext(ctx, msg)
		if err != nil {
			t.Fatal(err)
		}
		var out map[string]any
		if err := json.Unmarshal(reply.Data, &out); err != nil {
			t.Fatalf("%s: %v", reply.Data, err)
		}
		return out, reply.Header.Get("Status")
	}
	body := `{"tool":"exec","args":{"command":"echo over-nats; exit 2"}}`
	viaNATS, status := request(body, "tok")
	viaHTTP := tg.do("POST", "/tools/invoke", []byte(body), tg.asAgent())
	if status != "200" || viaNATS["ok"] != true {
		t.Fatalf("NATS answer %s: %v", status, viaNATS)
	}
	natsRes := viaNATS["result"].(map[string]any)
	if natsRes["content"].([]any)[0].(map[string]any)["text"] != viaHTTP.Result.Text() {
		t.Fatalf("NATS %v vs HTTP %q", natsRes, viaHTTP.Result.Text())
	}
	var httpDetails map[string]any
	hb, _ := json.Marshal(viaHTTP.Result.Details)
	_ = json.Unmarshal(hb, &httpDetails)
	for _, k := range []string{"status", "exitCode", "aggregated"} {
		if natsRes["details"].(map[string]any)[k] != httpDetails[k] {
			t.Fatalf("details.%s: NATS %v, HTTP %v", k, natsRes["details"].(map[string]any)[k], httpDetails[k])
		}
	}
	// Errors carry the same status and message.
	bad, status := request(`{"tool":"exec","args":{"command":"pwd","cwd":"/"}}`, "tok")
	if status != "400" || !strings.Contains(bad["error"].(map[string]any)["message"].(string), `use "workdir" instead`) {
		t.Fatalf("bad request over NATS: %s %v", status, bad)
	}
	if _, status := request(body, "wrong"); status != "401" {
		t.Fatalf("wrong token over NATS: %s", status)
	}
	if _, status := request(body, tg.g.operatorToken()); status != "200" {
		t.Fatalf("the operator token over NATS: %s", status)
	}
	if _, status := request(`{"tool":`, "tok"); status != "400" {
		t.Fatalf("malformed JSON over NATS: %s", status)
	}

	// Exit notifications are published on <prefix>.gw.events.<key token>.
	sub, err := client.SubscribeSync(EventSubject("execmesh", DefaultSessionKey))
	if err != nil {
		t.Fatal(err)
	}
	res := tg.invoke("exec", map[string]any{"command": "echo published", "background": true}, "")
	msg, err := sub.NextMsg(15 * time.Second)
	if err != nil {
		t.Fatalf("no event on NATS: %v", err)
	}
	var ev protocol.SystemEvent
	if err := json.Unmarshal(msg.Data, &ev); err != nil || ev.Text != "Exec completed ("+res.SessionID()+", code 0) :: published" {
		t.Fatalf("event %+v %v", ev, err)
	}
}

// TestAgentToolsDeny: agents.list[].tools.deny removes a tool for one agent.
func TestAgentToolsDeny(t *testing.T) {
	tg := startGateway(t, func(c *config.Config, _ *Options) {
		c.Agents.List = []config.Agent{{ID: "restricted", Tools: config.AgentTools{Deny: []string{"exec"}}}}
	})
	if r := tg.invokeRaw("exec", map[string]any{"command": "echo"}, "agent:restricted:main"); r.Status != 404 {
		t.Fatalf("denied agent: %d %s", r.Status, r.Raw)
	}
	if res := tg.invoke("exec", map[string]any{"command": "echo free"}, "agent:other:main"); res.Text() != "free" {
		t.Fatalf("other agent: %q", res.Text())
	}
}
