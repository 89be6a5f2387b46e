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
	yield := 100.0
	plan := Plan{Host: "node", NodeID: "n", AgentID: "a", SessionKey: "k", Command: "c", Argv: []string{"/bin/c"}, Cwd: "/", CwdID: "1:2", EnvDigest: "e", Files: []BoundFile{{Path: "/bin/c", SHA256: "h"}}}
	decision := Decision{ApprovalID: "i", Decision: DecisionAllowOnce, Plan: plan, ExpiresAtMs: 9}
	details := Details{SessionID: Some("s")}
	tests := []struct {
		name   string
		value  any // a pointer to a value with every field set
		golden string
	}{
		{"exec request", &ExecRequest{SessionKey: "k", AgentID: "a", SessionID: "s", Target: TargetNode, Args: ExecArgs{Command: "true", YieldMs: &yield}, Security: "full", Ask: "off", Warnings: []string{"w"}, Sync: true,
			Limits: &Limits{PidsMax: 7}, Approval: &SignedDecision{Decision: decision, GatewayKey: "g", Signature: "x"},
			Stream: &StreamSpec{ID: "i", Stdin: true, KeepOnDetach: true}},
			`{"sessionKey":"k","agentId":"a","sessionId":"s","target":"node","args":{"command":"true","yieldMs":100},"security":"full","ask":"off","warnings":["w"],"sync":true,"limits":{"pidsMax":7},"approval":{"decision":{"approvalId":"i","decision":"allow-once","plan":{"host":"node","nodeId":"n","agentId":"a","sessionKey":"k","command":"c","argv":["/bin/c"],"cwd":"/","cwdId":"1:2","envDigest":"e","files":[{"path":"/bin/c","sha256":"h"}]},"expiresAtMs":9},"gatewayKey":"g","signature":"x"},"stream":{"id":"i","stdin":true,"keepOnDetach":true}}`},
		{"exec reply", &ExecReply{Result: TextResult("t", details), Instance: "i"},
			`{"result":{"content":[{"type":"text","text":"t"}],"details":{"sessionId":"s"}},"instance":"i"}`},
		{"approval request", &ApprovalRequest{AllowAlways: true, AskFallback: "deny", FallbackAllows: true, Reason: "r", Plan: plan},
			`{"allowAlways":true,"askFallback":"deny","fallbackAllows":true,"reason":"r","plan":{"host":"node","nodeId":"n","agentId":"a","sessionKey":"k","command":"c","argv":["/bin/c"],"cwd":"/","cwdId":"1:2","envDigest":"e","files":[{"path":"/bin/c","sha256":"h"}]}}`},
		{"applypatch request", &ApplyPatchRequest{SessionKey: "k", AgentID: "a", Target: TargetNode, Args: ApplyPatchArgs{Input: "p"}, Security: "full", AnyWorkdir: true},
			`{"sessionKey":"k","agentId":"a","target":"node","args":{"input":"p"},"security":"full","anyWorkdir":true}`},
		{"process request", &ProcessRequest{SessionKey: "k", Args: ProcessArgs{Action: "poll", SessionID: "s"}},
			`{"sessionKey":"k","args":{"action":"poll","sessionId":"s"}}`},
		{"process reply", &ProcessReply{Result: TextResult("t", details), Gone: true, Instance: "i"},
			`{"result":{"content":[{"type":"text","text":"t"}],"details":{"sessionId":"s"}},"gone":true,"instance":"i"}`},
		{"list request", &ListRequest{SessionKey: "k", Limit: 3},
			`{"sessionKey":"k","limit":3}`},
		{"list reply", &ListReply{Instance: "i", Sessions: []ListedSession{{SessionKey: "k", Details: details}}, Total: 7, Partial: true},
			`{"instance":"i","sessions":[{"sessionKey":"k","details":{"sessionId":"s"}}],"total":7,"partial":true}`},
		{"listed session", &ListedSession{SessionKey: "k", Details: details},
			`{"sessionKey":"k","details":{"sessionId":"s"}}`},
		{"ping reply", &PingReply{Instance: "i"},
			`{"instance":"i"}`},
		{"which request", &NodeWhichRequest{Bins: []string{"git"}},
			`{"bins":["git"]}`},
		{"which response", &NodeWhichResponse{Bins: map[string]string{"git": "/usr/bin/git"}},
			`{"bins":{"git":"/usr/bin/git"}}`},
		{"pairing notice", &NodePairingNotice{Status: NodePairingPaired, GatewayKeys: []string{"g"}},
			`{"status":"paired","gatewayKeys":["g"]}`},
		{"heartbeat", &NodeHeartbeat{NodeID: "n", PublicKey: "p", Name: "x", Platform: "linux", Hostname: "h", Version: "v", Instance: "i", StartedAt: 1, Sessions: 2, Server: "s", IntervalMs: 3, Containment: "cgroup", Confinement: "ask", ConfinementReason: "r", TS: 4},
			`{"nodeId":"n","publicKey":"p","name":"x","platform":"linux","hostname":"h","version":"v","instance":"i","startedAt":1,"sessions":2,"server":"s","intervalMs":3,"containment":"cgroup","confinement":"ask","confinementReason":"r","ts":4}`},
		{"pair request", &NodePairRequest{Type: NodePairJoin, NodeID: "n", PublicKey: "p", Name: "x", Platform: "l", Version: "v", Instance: "i", JoinUser: "u", JoinSecret: "s", Signature: "g"},
			`{"type":"join","nodeId":"n","publicKey":"p","name":"x","platform":"l","version":"v","instance":"i","joinUser":"u","joinSecret":"s","signature":"g"}`},
		{"pair response", &NodePairResponse{Status: NodePairingRejected, NodeID: "n", Message: "m", Error: &Error{Type: ErrConflict, Message: "e", Retryable: true}, GatewayKeys: []string{"g"}},
			`{"status":"rejected","nodeId":"n","message":"m","error":{"type":"conflict","message":"e","retryable":true},"gatewayKeys":["g"]}`},
		{"join code", &JoinCode{V: 1, URLs: []string{"nats://x:1"}, Prefix: "p", User: "u", Secret: "s", Name: "n", ExpiresAt: 5, GatewayKeys: []string{"g"}},
			`{"v":1,"urls":["nats://x:1"],"prefix":"p","user":"u","secret":"s","name":"n","expiresAt":5,"gatewayKeys":["g"]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Every field set, so that each one's name shows in the golden.
			rv := reflect.ValueOf(tc.value).Elem()
			for i := range rv.NumField() {
				if rv.Type().Field(i).Tag.Get("json") == "-" {
					continue // not on the wire (ExecRequest.IdempotencyKey: a header)
				}
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
		{NodeEndpointExec, "exec"},
		{NodeEndpointProcess, "process"},
		{NodeEndpointPing, "ping"},
		{NodeEndpointList, "list"},
		{NodeEndpointPairing, "pairing"},
		{NodeEndpointApplyPatch, "applypatch"},
		{NodePairingPending, "pending"},
		{NodePairingPaired, "paired"},
		{NodePairingRejected, "rejected"},
		{NodePairAnnounce, "announce"},
		{NodePairJoin, "join"},
		{DecisionAllowOnce, "allow-once"},
		{DecisionAllowAlways, "allow-always"},
		{DecisionDeny, "deny"},
		{DecisionTimeout, "timeout"},
		{TargetGateway, "gateway"},
		{TargetSandbox, "sandbox"},
		{TargetNode, "node"},
		{string(ErrApprovalRequired), "approval_required"},
		{string(JoinSignedText("s", "p")), "execmesh-join:s:p"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
