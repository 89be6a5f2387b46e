package protocol

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// TestNodeWireNames pins the JSON of every node message: a value with all
// fields set must encode to exactly its golden JSON and decode back from it,
// strictly, to the same value. Running nodes and gateways of other versions
// speak this format, so renaming a tag (or adding a field without adding it
// here) fails this test.
func TestNodeWireNames(t *testing.T) {
	args := json.RawMessage(`{"command":"true"}`)
	tests := []struct {
		name   string
		value  any // a pointer to a value with every field set
		golden string
	}{
		{"exec request", &NodeExecRequest{SessionKey: "k", AgentID: "a", Args: args, Security: "full", Ask: "off", Warnings: []string{"w"}, Sync: true, Approval: &NodeExecApproval{ID: "i", Decision: NodeDecisionAllowOnce}, Limits: &Limits{MemoryMax: 1 << 30, PidsMax: 64, CPUMax: 1.5}},
			`{"sessionKey":"k","agentId":"a","args":{"command":"true"},"security":"full","ask":"off","warnings":["w"],"sync":true,"approval":{"id":"i","decision":"allow-once"},"limits":{"memoryMax":1073741824,"pidsMax":64,"cpuMax":1.5}}`},
		{"exec approval", &NodeExecApproval{ID: "i", Decision: NodeDecisionTimeout},
			`{"id":"i","decision":"timeout"}`},
		{"approval required", &NodeApprovalRequired{Command: "c", Cwd: "/", AllowAlways: true, AskFallback: "deny", FallbackAllows: true, Reason: "r"},
			`{"command":"c","cwd":"/","allowAlways":true,"askFallback":"deny","fallbackAllows":true,"reason":"r"}`},
		{"applypatch request", &NodeApplyPatchRequest{SessionKey: "k", AgentID: "a", Args: args, Security: "full"},
			`{"sessionKey":"k","agentId":"a","args":{"command":"true"},"security":"full"}`},
		{"process request", &NodeProcessRequest{SessionKey: "k", Args: args},
			`{"sessionKey":"k","args":{"command":"true"}}`},
		{"list request", &NodeListRequest{SessionKey: "k", All: true, Limit: 3},
			`{"sessionKey":"k","all":true,"limit":3}`},
		{"list response", &NodeListResponse{NodeID: "n", Instance: "i", Sessions: []NodeListedSession{{SessionKey: "k", Details: Details{"sessionId": "s"}}}, Total: 7, Partial: true},
			`{"nodeId":"n","instance":"i","sessions":[{"sessionKey":"k","details":{"sessionId":"s"}}],"total":7,"partial":true}`},
		{"listed session", &NodeListedSession{SessionKey: "k", Details: Details{"sessionId": "s"}},
			`{"sessionKey":"k","details":{"sessionId":"s"}}`},
		{"which request", &NodeWhichRequest{Bins: []string{"git"}},
			`{"bins":["git"]}`},
		{"which response", &NodeWhichResponse{Bins: map[string]string{"git": "/usr/bin/git"}},
			`{"bins":{"git":"/usr/bin/git"}}`},
		{"pairing notice", &NodePairingNotice{Status: NodePairingPaired},
			`{"status":"paired"}`},
		{"heartbeat", &NodeHeartbeat{NodeID: "n", PublicKey: "p", Name: "x", Platform: "linux", Hostname: "h", Version: "v", Instance: "i", StartedAt: 1, Sessions: 2, Server: "s", IntervalMs: 3, TS: 4, Containment: "cgroup"},
			`{"nodeId":"n","publicKey":"p","name":"x","platform":"linux","hostname":"h","version":"v","instance":"i","startedAt":1,"sessions":2,"server":"s","intervalMs":3,"ts":4,"containment":"cgroup"}`},
		{"pair request", &NodePairRequest{Type: NodePairJoin, NodeID: "n", PublicKey: "p", Name: "x", Platform: "l", Version: "v", Instance: "i", JoinUser: "u", JoinSecret: "s", Signature: "g"},
			`{"type":"join","nodeId":"n","publicKey":"p","name":"x","platform":"l","version":"v","instance":"i","joinUser":"u","joinSecret":"s","signature":"g"}`},
		{"pair response", &NodePairResponse{Status: NodePairingRejected, NodeID: "n", Message: "m", Error: &Error{Type: ErrConflict, Message: "e", Retryable: true}},
			`{"status":"rejected","nodeId":"n","message":"m","error":{"type":"conflict","message":"e","retryable":true}}`},
		{"join code", &JoinCode{V: 1, URLs: []string{"nats://x:1"}, Prefix: "p", User: "u", Secret: "s", Name: "n", ExpiresAt: 5},
			`{"v":1,"urls":["nats://x:1"],"prefix":"p","user":"u","secret":"s","name":"n","expiresAt":5}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Every field set, so that each one's name shows in the golden.
			rv := reflect.ValueOf(tc.value).Elem()
			for i := range rv.NumField() {
				if rv.Field(i).IsZero() {
					t.Fatalf("field %s of %T not set in the test", rv.Type().Field(i).Name, tc.value)
				}
			}
			got, err := json.Marshal(tc.value)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.golden {
				t.Errorf("encoded\n got  %s\n want %s", got, tc.golden)
			}
			back := reflect.New(rv.Type())
			dec := json.NewDecoder(bytes.NewReader([]byte(tc.golden)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(back.Interface()); err != nil {
				t.Fatalf("decode golden: %v", err)
			}
			if !reflect.DeepEqual(back.Interface(), tc.value) {
				t.Errorf("round trip\n got  %+v\n want %+v", back.Elem().Interface(), rv.Interface())
			}
		})
	}
}

// TestNodeWireConstants pins the header, endpoint, state and error names
// of the node protocol, which are on the wire too.
func TestNodeWireConstants(t *testing.T) {
	checks := []struct{ got, want string }{
		{NodeHeaderIdempotencyKey, "Execmesh-Idempotency-Key"},
		{NodeHeaderSession, "Execmesh-Session"},
		{NodeSessionGone, "gone"},
		{NodeHeaderInstance, "Execmesh-Instance"},
		{NodeEndpointList, "list"},
		{NodeEndpointPairing, "pairing"},
		{NodeEndpointApplyPatch, "applypatch"},
		{NodePairingPending, "pending"},
		{NodePairingPaired, "paired"},
		{NodePairingRejected, "rejected"},
		{NodePairAnnounce, "announce"},
		{NodePairJoin, "join"},
		{NodeDecisionAllowOnce, "allow-once"},
		{NodeDecisionAllowAlways, "allow-always"},
		{NodeDecisionTimeout, "timeout"},
		{string(ErrApprovalRequired), "approval_required"},
		{string(JoinSignedText("s", "p")), "execmesh-join:s:p"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
