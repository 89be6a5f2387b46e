package approvals

import (
	"slices"
	"testing"
)

// TestOrders covers spec §23.9 case 86.
func TestOrders(t *testing.T) {
	cases := []struct{ a, b, min string }{
		{SecurityFull, SecurityAllowlist, SecurityAllowlist},
		{SecurityAllowlist, SecurityFull, SecurityAllowlist},
		{SecurityDeny, SecurityFull, SecurityDeny},
		{" FULL ", "full", SecurityFull},
		{"bogus", SecurityFull, SecurityDeny}, // invalid fails closed
	}
	for _, c := range cases {
		if got := MinSecurity(c.a, c.b); got != c.min {
			t.Errorf("MinSecurity(%q, %q) = %q, want %q", c.a, c.b, got, c.min)
		}
	}
	asks := []struct{ a, b, max string }{
		{AskOff, AskAlways, AskAlways},
		{AskOnMiss, AskOff, AskOnMiss},
		{AskOff, AskOff, AskOff},
		{"nope", AskOff, AskAlways},
	}
	for _, c := range asks {
		if got := MaxAsk(c.a, c.b); got != c.max {
			t.Errorf("MaxAsk(%q, %q) = %q, want %q", c.a, c.b, got, c.max)
		}
	}
	p := Policy{Security: SecurityAllowlist, Ask: AskOnMiss}
	if got := p.Tighten(SecurityFull, AskOff); got.Security != SecurityAllowlist || got.Ask != AskOnMiss {
		t.Errorf("per-call full/off loosened the policy: %+v", got)
	}
	if got := p.Tighten(" Deny ", "ALWAYS"); got.Security != SecurityDeny || got.Ask != AskAlways {
		t.Errorf("per-call deny/always: %+v", got)
	}
	if got := p.Tighten("bogus", "bogus"); got.Security != SecurityAllowlist || got.Ask != AskOnMiss {
		t.Errorf("invalid per-call values must be ignored: %+v", got)
	}
	file := Policy{Security: SecurityFull, Ask: AskOff, AskFallback: SecurityFull, Allowlist: []Entry{{Pattern: "/x"}}}
	got := Stricter(Policy{Security: SecurityAllowlist, Ask: AskOnMiss}, file)
	if got.Security != SecurityAllowlist || got.Ask != AskOnMiss || got.AskFallback != SecurityAllowlist || len(got.Allowlist) != 1 {
		t.Errorf("Stricter: %+v", got)
	}
}

// TestRequiresApproval covers spec §23.9 case 87.
func TestRequiresApproval(t *testing.T) {
	cases := []struct {
		ask, security   string
		analysisOK, sat bool
		want            bool
		name            string
	}{
		{AskAlways, SecurityFull, true, true, true, "always prompts"},
		{AskOnMiss, SecurityFull, false, false, false, "full never prompts on miss"},
		{AskOnMiss, SecurityFull, true, true, false, "full never prompts"},
		{AskOnMiss, SecurityAllowlist, true, true, false, "satisfied"},
		{AskOnMiss, SecurityAllowlist, true, false, true, "miss"},
		{AskOnMiss, SecurityAllowlist, false, false, true, "analysis failed"},
		{AskOff, SecurityAllowlist, true, false, false, "off never prompts (denied instead)"},
		{AskOff, SecurityAllowlist, false, false, false, "off never prompts"},
	}
	for _, c := range cases {
		if got := RequiresApproval(c.ask, c.security, c.analysisOK, c.sat); got != c.want {
			t.Errorf("%s: RequiresApproval(%s, %s, %v, %v) = %v", c.name, c.ask, c.security, c.analysisOK, c.sat, got)
		}
	}
}

func TestDecide(t *testing.T) {
	sat := Evaluation{AnalysisOK: true, Satisfied: true}
	miss := Evaluation{AnalysisOK: true, Reason: ReasonAllowlistMiss}
	chain := Evaluation{Reason: ReasonChain}
	cases := []struct {
		host    string
		p       Policy
		ev      Evaluation
		verdict Verdict
		reason  string
		plan    bool
	}{
		{HostGateway, Policy{Security: SecurityDeny, Ask: AskOff}, sat, Deny, "exec denied: host=gateway security=deny", false},
		{HostNode, Policy{Security: SecurityDeny, Ask: AskAlways}, sat, Deny, "exec denied: host=node security=deny", false},
		{HostGateway, Policy{Security: SecurityFull, Ask: AskOff}, chain, Allow, "", false},
		{HostGateway, Policy{Security: SecurityFull, Ask: AskOnMiss}, miss, Allow, "", false},
		{HostGateway, Policy{Security: SecurityFull, Ask: AskAlways}, sat, NeedsApproval, "ask=always", false},
		{HostGateway, Policy{Security: SecurityAllowlist, Ask: AskOnMiss}, sat, Allow, "", true},
		{HostGateway, Policy{Security: SecurityAllowlist, Ask: AskOnMiss}, miss, NeedsApproval, ReasonAllowlistMiss, false},
		{HostGateway, Policy{Security: SecurityAllowlist, Ask: AskOnMiss}, chain, NeedsApproval, ReasonChain, false},
		{HostGateway, Policy{Security: SecurityAllowlist, Ask: AskOff}, chain, Deny, DenyAllowlistMiss, false},
		{HostGateway, Policy{Security: SecurityAllowlist, Ask: AskOff}, miss, Deny, DenyAllowlistMiss, false},
		{HostGateway, Policy{Security: SecurityAllowlist, Ask: AskOff}, sat, Allow, "", true},
		{HostGateway, Policy{Security: SecurityAllowlist, Ask: AskAlways}, sat, NeedsApproval, "ask=always", false},
		{HostGateway, Policy{Security: "weird", Ask: AskOff}, sat, Deny, "exec denied: host=gateway security=deny", false},
		{HostGateway, Policy{Security: SecurityAllowlist, Ask: "weird"}, sat, NeedsApproval, "ask=always", false},
		{HostSandbox, Policy{Security: SecurityDeny}, chain, Allow, "", false},
	}
	for i, c := range cases {
		d := Decide(c.host, c.p, c.ev)
		if d.Verdict != c.verdict || d.Reason != c.reason || d.RunPlan != c.plan {
			t.Errorf("case %d: %+v (%s), want %v %q plan=%v", i, d, d.Verdict, c.verdict, c.reason, c.plan)
		}
	}
	// Fallback after an unanswered approval.
	fb := []struct {
		p       Policy
		ev      Evaluation
		verdict Verdict
		reason  string
	}{
		{Policy{Security: SecurityAllowlist, AskFallback: SecurityDeny}, sat, Deny, DenyApprovalTimeout},
		{Policy{Security: SecurityAllowlist, AskFallback: ""}, sat, Deny, DenyApprovalTimeout},
		{Policy{Security: SecurityAllowlist, AskFallback: SecurityAllowlist}, miss, Deny, DenyApprovalTimeoutMiss},
		{Policy{Security: SecurityAllowlist, AskFallback: SecurityAllowlist}, sat, Allow, ""},
		{Policy{Security: SecurityAllowlist, AskFallback: SecurityFull}, miss, Deny, DenyApprovalTimeoutMiss}, // capped by security
		{Policy{Security: SecurityFull, AskFallback: SecurityFull}, chain, Allow, ""},
	}
	for i, c := range fb {
		if d := Fallback(c.p, c.ev); d.Verdict != c.verdict || d.Reason != c.reason {
			t.Errorf("fallback %d: %+v, want %v %q", i, d, c.verdict, c.reason)
		}
	}
}

func TestDefaultPolicy(t *testing.T) {
	cases := map[string]string{HostSandbox: SecurityDeny, HostGateway: SecurityAllowlist, HostNode: SecurityAllowlist, "": SecurityDeny, "auto": SecurityDeny}
	for host, sec := range cases {
		p := DefaultPolicy(host)
		if p.Security != sec || p.Ask != AskOnMiss || p.AskFallback != SecurityDeny {
			t.Errorf("DefaultPolicy(%q) = %+v", host, p)
		}
	}
}

// TestResolve covers spec §23.9 case 89 and the per-field precedence.
func TestResolve(t *testing.T) {
	f, err := Parse([]byte(`{
	  "version": 1,
	  "defaults": {"security": "full", "ask": "off"},
	  "agents": {
	    "*": {"security": "allowlist", "ask": "always", "allowlist": [{"id": "s", "pattern": "/usr/bin/rg"}]},
	    "main": {"security": "bogus", "allowlist": [{"id": "m", "pattern": "/usr/bin/jq"}]},
	    "ops": {"ask": "ON-MISS", "askFallback": "full"},
	    "bad": {"ask": 5}
	  }
	}`))
	if err != nil {
		t.Fatal(err)
	}
	def := DefaultPolicy(HostGateway)
	main := f.Resolve("", def)
	if main.Security != SecurityFull {
		t.Errorf("case 89: main security = %q, want full (invalid → defaults, not *)", main.Security)
	}
	if main.Ask != AskAlways {
		t.Errorf("main ask = %q, want * always", main.Ask)
	}
	if main.AskFallback != SecurityDeny {
		t.Errorf("main askFallback = %q, want the built-in deny", main.AskFallback)
	}
	if ids := entryIDs(main.Allowlist); !slices.Equal(ids, []string{"s", "m"}) {
		t.Errorf("allowlist order %q, want * then agent", ids)
	}
	ops := f.Resolve("ops", def)
	if ops.Security != SecurityAllowlist || ops.Ask != AskOnMiss || ops.AskFallback != SecurityFull {
		t.Errorf("ops: %+v", ops)
	}
	// A field of the wrong type is dropped at load, so "*" applies.
	if bad := f.Resolve("bad", def); bad.Ask != AskAlways {
		t.Errorf("bad: %+v", bad)
	}
	unknown := f.Resolve("nobody", def)
	if unknown.Security != SecurityAllowlist || !slices.Equal(entryIDs(unknown.Allowlist), []string{"s"}) {
		t.Errorf("unknown agent: %+v", unknown)
	}
	if star := f.Resolve("*", def); len(star.Allowlist) != 1 {
		t.Errorf("* agent gets its entries once: %+v", star.Allowlist)
	}
	empty := NewFile().Resolve("main", def)
	if empty.Security != def.Security || empty.Ask != def.Ask || empty.AskFallback != def.AskFallback {
		t.Errorf("empty file: %+v", empty)
	}
}

func entryIDs(es []Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.ID)
	}
	return out
}
