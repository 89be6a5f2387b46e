package approvals

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestLevels pins the security/ask ordering every host uses: configured
// values (invalid ones count as unset), the default by configured host,
// tightening only, and the file merged by Stricter.
func TestLevels(t *testing.T) {
	if got := DefaultSecurity("sandbox", false); got != SecurityDeny {
		t.Errorf("sandbox default %s", got)
	}
	if got := DefaultSecurity("auto", true); got != SecurityDeny {
		t.Errorf("auto with a sandbox %s", got)
	}
	for _, h := range []string{"auto", "gateway", "node"} {
		if got := DefaultSecurity(h, false); got != SecurityAllowlist {
			t.Errorf("%s default %s", h, got)
		}
	}
	cases := []struct {
		global, agent Levels
		tighten       []Levels
		want          Levels
	}{
		{Levels{}, Levels{}, nil, Levels{SecurityAllowlist, AskOnMiss}},
		{Levels{SecurityFull, AskOff}, Levels{}, nil, Levels{SecurityFull, AskOff}},
		{Levels{SecurityFull, AskOff}, Levels{Security: SecurityDeny}, nil, Levels{SecurityDeny, AskOff}},
		{Levels{SecurityAllowlist, ""}, Levels{Security: SecurityFull}, nil, Levels{SecurityFull, AskOnMiss}}, // the agent entry replaces
		{Levels{"bogus", "maybe"}, Levels{}, nil, Levels{SecurityAllowlist, AskOnMiss}},                       // invalid: the defaults
		{Levels{"FULL", ""}, Levels{}, nil, Levels{SecurityAllowlist, AskOnMiss}},                             // configured values are exact
		{Levels{SecurityFull, AskOff}, Levels{}, []Levels{{Security: "allowlist"}, {Ask: "always"}}, Levels{SecurityAllowlist, AskAlways}},
		{Levels{SecurityAllowlist, AskAlways}, Levels{}, []Levels{{SecurityFull, AskOff}}, Levels{SecurityAllowlist, AskAlways}}, // never loosens
		{Levels{SecurityFull, AskOff}, Levels{}, []Levels{{" DENY ", ""}}, Levels{SecurityDeny, AskOff}},                         // per-call values are normalised
		{Levels{SecurityFull, AskOff}, Levels{}, []Levels{{"bogus", "bogus"}}, Levels{SecurityFull, AskOff}},                     // and invalid ones ignored
	}
	for _, c := range cases {
		got := Configured(c.global, c.agent, SecurityAllowlist)
		for _, l := range c.tighten {
			got = got.Tighten(l)
		}
		if got != c.want {
			t.Errorf("%+v %+v %+v: %+v, want %+v", c.global, c.agent, c.tighten, got, c.want)
		}
	}
	if err := ParseLevels(Levels{Security: "full", Ask: "on-miss"}); err != nil {
		t.Error(err)
	}
	if err := ParseLevels(Levels{Security: "Full"}); err == nil || err.Error() != `Security: "Full" is not one of deny, allowlist, full` {
		t.Errorf("ParseLevels: %v", err)
	}
	f := NewFile()
	f.Defaults = &Settings{Security: SecurityAllowlist, Ask: AskAlways, AskFallback: SecurityFull}
	p := Stricter(Levels{SecurityFull, AskOff}.Policy(), f.AgentPolicy("main"))
	if p.Security != SecurityAllowlist || p.Ask != AskAlways || p.AskFallback != SecurityAllowlist {
		t.Errorf("file merge: %+v", p)
	}
	var nilFile *File
	if p := Stricter(Levels{SecurityFull, AskOff}.Policy(), nilFile.AgentPolicy("main")); p.Security != SecurityFull || p.Ask != AskOff {
		t.Errorf("no file: %+v", p)
	}
}

func authReq(h *host, cmd string, p Policy) Request {
	return Request{Host: HostGateway, AgentID: "main", Command: h.sub(cmd), Cwd: h.work,
		Env: map[string]string{"PATH": h.path, "HOME": h.home}, Policy: p, TrustedDirs: []string{h.trusted}}
}

// TestAuthorize walks the verdicts and what comes with them.
func TestAuthorize(t *testing.T) {
	h := newHost(t)
	allow := Policy{Security: SecurityAllowlist, Ask: AskOnMiss, AskFallback: SecurityDeny, Allowlist: h.globAllowlist()}

	a, err := Authorize(authReq(h, "ls -la | wc -l", allow))
	if err != nil || a.Verdict != Allow || !a.RunPlan || a.Binding != nil {
		t.Fatalf("plan: %+v %v", a, err)
	}
	if !slices.Equal(a.Argv[:2], []string{"/bin/sh", "-c"}) || !strings.Contains(a.Argv[2], h.bin+"/ls") {
		t.Errorf("argv %q", a.Argv)
	}
	a, _ = Authorize(authReq(h, "ls", allow))
	if !slices.Equal(a.Argv, []string{h.bin + "/ls"}) {
		t.Errorf("one segment runs the program itself: %q", a.Argv)
	}

	a, _ = Authorize(authReq(h, "id", allow))
	if a.Verdict != NeedsApproval || a.Reason != ReasonAllowlistMiss || !a.AllowAlways || a.FallbackAllows ||
		a.AskFallback != SecurityDeny || a.Binding == nil || a.Argv != nil {
		t.Fatalf("miss: %+v", a)
	}
	if !slices.Equal(a.AllowAlwaysPaths, []string{h.evil + "/id"}) {
		t.Errorf("allow-always paths %q", a.AllowAlwaysPaths)
	}
	full := Policy{Security: SecurityFull, Ask: AskOff}
	if a, _ := Authorize(authReq(h, "id; ls", full)); a.Verdict != Allow || a.Argv != nil {
		t.Errorf("security full: %+v", a)
	}
	// Under security full without ask always nothing is evaluated: no
	// program is looked up, nothing can be allowlisted.
	for _, ask := range []string{AskOff, AskOnMiss} {
		a, _ := Authorize(authReq(h, "ls", Policy{Security: SecurityFull, Ask: ask}))
		if a.Verdict != Allow || len(a.Evaluation.Segments) != 0 || a.AllowAlwaysPaths != nil || a.AllowAlways {
			t.Errorf("security full, ask %s: evaluated (%+v)", ask, a)
		}
	}
	if a, _ := Authorize(authReq(h, "id", Policy{Security: SecurityDeny})); a.Verdict != Deny || a.Reason != "exec denied: host=gateway security=deny" {
		t.Errorf("deny: %+v", a)
	}
	off := allow
	off.Ask = AskOff
	if a, _ := Authorize(authReq(h, "id", off)); a.Verdict != Deny || a.Reason != DenyAllowlistMiss {
		t.Errorf("ask off: %+v", a)
	}
	always := Policy{Security: SecurityFull, Ask: AskAlways, AskFallback: SecurityFull}
	if a, _ := Authorize(authReq(h, "ls", always)); a.Verdict != NeedsApproval || a.AllowAlways || !a.FallbackAllows {
		t.Errorf("ask always: %+v", a)
	}
	if a, _ := Authorize(Request{Host: HostSandbox, Command: "anything"}); a.Verdict != Allow {
		t.Errorf("sandbox: %+v", a)
	}

	// Decisions.
	req := authReq(h, "id", allow)
	pending, _ := Authorize(req)
	req.Approved = pending.Binding
	for decision, want := range map[string]string{DecisionDeny: DenyUserDenied, DecisionTimeout: DenyApprovalTimeout} {
		req.Decision = decision
		if a, _ := Authorize(req); a.Verdict != Deny || a.Reason != want || !a.Applied {
			t.Errorf("%s: %+v", decision, a)
		}
	}
	req.Decision = DecisionAllowAlways
	if a, _ := Authorize(req); a.Verdict != Allow || a.Argv != nil || !a.Applied {
		t.Errorf("allow-always: %+v", a)
	}
	req.Decision = "sure"
	if _, err := Authorize(req); !errors.Is(err, ErrUnknownDecision) {
		t.Errorf("unknown decision: %v", err)
	}
	// A decision on a command that needs none is ignored.
	ok := authReq(h, "ls", allow)
	ok.Decision = DecisionDeny
	if a, _ := Authorize(ok); a.Verdict != Allow || a.Applied {
		t.Errorf("decision on an allowed command: %+v", a)
	}
}

// TestBinding: executables and script operands are bound, through
// wrappers too; a rewrite with the same inode, a new file where there was
// none, another resolution, or no binding at all refuse the decision.
func TestBinding(t *testing.T) {
	h := newHost(t)
	pol := Policy{Security: SecurityAllowlist, Ask: AskOnMiss, AskFallback: SecurityDeny}
	scripts := map[string]string{"x.py": "print(1)\n", "a.js": "1\n", "s.sh": "echo\n", "p.awk": "{print}\n", "t.rb": "1\n"}
	for name, body := range scripts {
		if err := os.WriteFile(filepath.Join(h.work, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, interp := range []string{"python3", "node", "ruby"} {
		writeExec(t, filepath.Join(h.bin, interp), "exit 0")
	}
	cases := map[string][]string{
		"./x":                              {h.work + "/x"},
		"python3 x.py arg data.csv":        {h.bin + "/python3", h.work + "/x.py"},
		"python3 -u -W ignore x.py":        {h.bin + "/python3", h.work + "/x.py"},
		"python3 -c 'print(1)' x.py":       {h.bin + "/python3"},
		"node --require r a.js":            {h.bin + "/node", h.work + "/a.js"},
		"sh s.sh":                          {h.bin + "/sh", h.work + "/s.sh"},
		"bash -e -o pipefail s.sh":         {h.bin + "/bash", h.work + "/s.sh"},
		"env python3 x.py":                 {h.trusted + "/env", h.bin + "/python3", h.work + "/x.py"},
		"nice -n 5 sh s.sh":                {h.bin + "/sh", h.trusted + "/nice", h.work + "/s.sh"},
		"awk -f p.awk f":                   {h.bin + "/awk", h.work + "/p.awk"},
		"ruby -I lib t.rb":                 {h.bin + "/ruby", h.work + "/t.rb"},
		"./not-yet-there":                  {h.work + "/not-yet-there"},
		"(./x)":                            {h.work + "/x"},
		"if true; then python3 x.py; fi":   {h.bin + "/true", h.bin + "/python3", h.work + "/x.py"},
		"for i in 1; do ./x; done":         {h.work + "/x"},
		"echo $(./x) && sh s.sh":           {h.bin + "/echo", h.work + "/x", h.bin + "/sh", h.work + "/s.sh"},
		"sh -c 'python3 x.py | node a.js'": {h.bin + "/sh", h.bin + "/python3", h.work + "/x.py", h.bin + "/node", h.work + "/a.js"},
	}
	for cmd, want := range cases {
		a, _ := Authorize(authReq(h, cmd, pol))
		if a.Verdict != NeedsApproval || a.Binding == nil {
			t.Errorf("%s: %+v", cmd, a.Verdict)
			continue
		}
		var got []string
		for _, f := range a.Binding.Files {
			got = append(got, f.Path)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: bound %q, want %q", cmd, got, want)
		}
	}

	req := authReq(h, "python3 x.py", pol)
	pending, _ := Authorize(req)
	req.Decision, req.Approved = DecisionAllowOnce, pending.Binding
	if a, _ := Authorize(req); a.Verdict != Allow {
		t.Fatalf("unchanged: %+v", a)
	}
	if err := pending.Binding.Verify(); err != nil {
		t.Fatalf("Verify unchanged: %v", err)
	}
	// In place: same inode, new content.
	f, err := os.OpenFile(filepath.Join(h.work, "x.py"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("import os; os.system('id')\n")
	f.Close()
	want := "approval no longer matches: " + h.work + "/x.py changed"
	if a, _ := Authorize(req); a.Verdict != Deny || a.Reason != want {
		t.Errorf("rewritten: %+v", a)
	}
	if err := pending.Binding.Verify(); err == nil || err.Error() != want || !errors.Is(err, ErrBindingChanged) {
		t.Errorf("Verify: %v", err)
	}
	// A file that appears where there was none.
	req = authReq(h, "./later", pol)
	pending, _ = Authorize(req)
	writeExec(t, filepath.Join(h.work, "later"), "id")
	req.Decision, req.Approved = DecisionAllowOnce, pending.Binding
	if a, _ := Authorize(req); a.Verdict != Deny || !strings.HasSuffix(a.Reason, "/later changed") {
		t.Errorf("appeared: %+v", a)
	}
	// No binding at all (a forged or older decision).
	req = authReq(h, "./x", pol)
	req.Decision = DecisionAllowOnce
	if a, _ := Authorize(req); a.Verdict != Deny || !strings.HasPrefix(a.Reason, "approval no longer matches: ") {
		t.Errorf("no binding: %+v", a)
	}
	// Allow-always binds paths, never content: the persisted entry is the
	// interpreter's path (allowlisting an interpreter allows what it runs).
	if a, _ := Authorize(authReq(h, "python3 x.py", pol)); !slices.Equal(a.AllowAlwaysPaths, []string{h.bin + "/python3"}) {
		t.Errorf("allow-always paths %q", a.AllowAlwaysPaths)
	}
}
