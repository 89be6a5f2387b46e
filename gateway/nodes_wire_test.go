package gateway

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/execmesh/execmesh/nodeagent"
	"github.com/execmesh/execmesh/protocol"
)

// TestNodeWireMatchesNodeAgent keeps the gateway's copies of the node
// messages in step with nodeagent's: every field, name and type.
func TestNodeWireMatchesNodeAgent(t *testing.T) {
	args := json.RawMessage(`{"command":"true"}`)
	pe := &protocol.Error{Type: protocol.ErrConflict, Message: "m"}
	pairs := []struct {
		name    string
		gateway any
		agent   any
	}{
		{"exec", &nodeExecWire{SessionKey: "k", AgentID: "a", Args: args, Security: "full", Ask: "off", Warnings: []string{"w"}, Sync: true, Approval: &nodeExecApprovalWire{ID: "i", Decision: "allow-once"}},
			&nodeagent.ExecRequest{SessionKey: "k", AgentID: "a", Args: args, Security: "full", Ask: "off", Warnings: []string{"w"}, Sync: true, Approval: &nodeagent.ExecApproval{ID: "i", Decision: "allow-once"}}},
		{"approval required", &nodeApprovalRequiredWire{Command: "c", Cwd: "/", AllowAlways: true, AskFallback: "deny", FallbackAllows: true, Reason: "r"},
			&nodeagent.ApprovalRequired{Command: "c", Cwd: "/", AllowAlways: true, AskFallback: "deny", FallbackAllows: true, Reason: "r"}},
		{"applypatch", &nodeApplyPatchWire{SessionKey: "k", AgentID: "a", Args: args, Security: "full"},
			&nodeagent.ApplyPatchRequest{SessionKey: "k", AgentID: "a", Args: args, Security: "full"}},
		{"process", &nodeProcessWire{SessionKey: "k", Args: args}, &nodeagent.ProcessRequest{SessionKey: "k", Args: args}},
		{"list", &nodeListWire{SessionKey: "k", All: true, Limit: 3}, &nodeagent.ListRequest{SessionKey: "k", All: true, Limit: 3}},
		{"pairing", &pairingNoticeWire{Status: "paired"}, &nodeagent.PairingNotice{Status: "paired"}},
		{"heartbeat", &heartbeatWire{NodeID: "n", PublicKey: "p", Name: "x", Platform: "linux", Hostname: "h", Version: "v", Instance: "i", StartedAt: 1, Sessions: 2, Server: "s", IntervalMs: 3, TS: 4},
			&nodeagent.Heartbeat{NodeID: "n", PublicKey: "p", Name: "x", Platform: "linux", Hostname: "h", Version: "v", Instance: "i", StartedAt: 1, Sessions: 2, Server: "s", IntervalMs: 3, TS: 4}},
		{"pair request", &pairRequestWire{Type: "join", NodeID: "n", PublicKey: "p", Name: "x", Platform: "l", Version: "v", Instance: "i", JoinUser: "u", JoinSecret: "s", Signature: "g"},
			&nodeagent.PairRequest{Type: "join", NodeID: "n", PublicKey: "p", Name: "x", Platform: "l", Version: "v", Instance: "i", JoinUser: "u", JoinSecret: "s", Signature: "g"}},
		{"pair reply", &pairReplyWire{Status: "paired", NodeID: "n", Message: "m", Error: pe}, &nodeagent.PairResponse{Status: "paired", NodeID: "n", Message: "m", Error: pe}},
		{"join code", &joinCodeWire{V: 1, URLs: []string{"nats://x:1"}, Prefix: "p", User: "u", Secret: "s", Name: "n", ExpiresAt: 5},
			&nodeagent.JoinCode{V: 1, URLs: []string{"nats://x:1"}, Prefix: "p", User: "u", Secret: "s", Name: "n", ExpiresAt: 5}},
	}
	for _, p := range pairs {
		// Every field set: a field missing on one side would be zero there.
		for _, v := range []any{p.gateway, p.agent} {
			rv := reflect.ValueOf(v).Elem()
			for i := range rv.NumField() {
				if rv.Field(i).IsZero() {
					t.Fatalf("%s: field %s of %T not set in the test", p.name, rv.Type().Field(i).Name, v)
				}
			}
		}
		g, _ := json.Marshal(p.gateway)
		a, _ := json.Marshal(p.agent)
		if !bytes.Equal(g, a) {
			t.Errorf("%s:\n gateway %s\n agent   %s", p.name, g, a)
		}
		// Each side decodes the other's message strictly.
		for _, c := range []struct {
			data []byte
			into any
		}{{g, reflect.New(reflect.TypeOf(p.agent).Elem()).Interface()}, {a, reflect.New(reflect.TypeOf(p.gateway).Elem()).Interface()}} {
			dec := json.NewDecoder(bytes.NewReader(c.data))
			dec.DisallowUnknownFields()
			if err := dec.Decode(c.into); err != nil {
				t.Errorf("%s: %v", p.name, err)
			}
		}
	}
	lr := nodeagent.ListResponse{NodeID: "n", Instance: "i", Sessions: []nodeagent.ListedSession{{SessionKey: "k", Details: protocol.Details{"sessionId": "s"}}}, Total: 7, Partial: true}
	b, _ := json.Marshal(lr)
	var glr nodeListReplyWire
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&glr); err != nil || glr.Sessions[0].SessionKey != "k" || glr.Instance != "i" || glr.Total != 7 || !glr.Partial {
		t.Fatalf("list reply: %+v %v", glr, err)
	}
	if nodeHeaderIdempotencyKey != nodeagent.HeaderIdempotencyKey || nodeHeaderSession != nodeagent.HeaderSession ||
		nodeHeaderInstance != nodeagent.HeaderInstance || nodeEndpointList != nodeagent.EndpointList ||
		nodeEndpointPairing != nodeagent.EndpointPairing || nodeEndpointApplyPatch != nodeagent.EndpointApplyPatch || pairingPaired != nodeagent.PairingPaired ||
		pairingPending != nodeagent.PairingPending || pairingRejected != nodeagent.PairingRejected ||
		pairJoin != nodeagent.PairJoin || nodeErrApprovalRequired != nodeagent.ErrApprovalRequired || nodeDecisionTimeout != nodeagent.DecisionTimeout ||
		DecisionAllowOnce != nodeagent.DecisionAllowOnce || DecisionAllowAlways != nodeagent.DecisionAllowAlways || pairAnnounce != nodeagent.PairAnnounce || "gone" != nodeagent.SessionGone {
		t.Fatal("header, endpoint or status names differ")
	}
	if string(joinSignedText("s", "p")) != string(nodeagent.JoinSignedText("s", "p")) {
		t.Fatal("join signature texts differ")
	}
}
