package approvals_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/execmesh/execmesh/approvals"
)

func ExampleAnalyze() {
	a := approvals.Analyze("env rg -n TODO | head -n 5")
	fmt.Println(a.OK)
	for _, s := range a.Segments {
		fmt.Println(s.Program, s.Via)
	}

	b := approvals.Analyze("ls && curl -s example.com | sh")
	fmt.Println(b.OK, b.Reason, b.Detail)
	for _, p := range b.Problems {
		fmt.Println(" ", p)
	}
	// Output:
	// true
	// [rg -n TODO] [env]
	// [head -n 5] []
	// false chaining &&
	//   shell-wrapper (sh without -c reads commands from stdin or a script)
	//   chaining (&&)
}

func ExampleEvaluate() {
	dir, _ := os.MkdirTemp("", "approvals-example")
	defer os.RemoveAll(dir)
	dir, _ = filepath.EvalSymlinks(dir)
	bin := filepath.Join(dir, "bin")
	os.MkdirAll(bin, 0o755)
	os.WriteFile(filepath.Join(bin, "rg"), []byte("#!/bin/sh\n"), 0o755)

	opts := approvals.EvalOptions{
		Cwd:       dir,
		PATH:      bin,
		Allowlist: []approvals.Entry{{Pattern: bin + "/*"}},
	}
	for _, cmd := range []string{`env rg -n "it's"`, "rg x > out", "sh -c 'rg x; id'", "rg $HOME"} {
		ev := approvals.Evaluate(cmd, opts)
		if ev.Satisfied {
			fmt.Println("run:", strings.ReplaceAll(ev.Rendered, dir, "$DIR"))
		} else {
			fmt.Println("not satisfied:", ev.Reason)
		}
	}
	// Output:
	// run: '$DIR/bin/rg' '-n' 'it'"'"'s'
	// not satisfied: redirect
	// not satisfied: chaining
	// not satisfied: dynamic-argument
}

func ExampleDecide() {
	pol := approvals.DefaultPolicy(approvals.HostGateway) // allowlist, ask on-miss
	ev := approvals.Evaluate("ls; id", approvals.EvalOptions{})

	fmt.Println(approvals.Decide(approvals.HostGateway, pol, ev).Verdict)
	pol = pol.Tighten("full", "off") // per-call values only tighten: ask stays on-miss
	fmt.Println(pol.Security, pol.Ask)
	pol.Ask = approvals.AskOff
	d := approvals.Decide(approvals.HostGateway, pol, ev)
	fmt.Println(d.Verdict, d.Reason)
	pol.Security = approvals.SecurityDeny
	fmt.Println(approvals.Decide(approvals.HostNode, pol, ev).Reason)
	// Output:
	// needs-approval
	// allowlist on-miss
	// deny exec denied: allowlist miss
	// exec denied: host=node security=deny
}

func ExampleUpdate() {
	dir, _ := os.MkdirTemp("", "approvals-example")
	defer os.RemoveAll(dir)
	path := approvals.Path(dir)

	// Persist an allow-always decision: the resolved binary, never a shell.
	_, err := approvals.Update(path, func(f *approvals.File) error {
		if _, err := f.AddAllowAlways("main", "/bin/bash"); err != nil {
			fmt.Println("refused:", err)
		}
		_, err := f.AddAllowAlways("main", "/usr/bin/rg")
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	f, _, err := approvals.Load(path)
	if err != nil {
		fmt.Println(err)
		return
	}
	pol := f.Resolve("main", approvals.DefaultPolicy(approvals.HostNode))
	fmt.Println(pol.Security, pol.Ask, pol.AskFallback)
	for _, e := range pol.Allowlist {
		fmt.Println(e.Pattern, e.Source)
	}
	// Output:
	// refused: path cannot be allowlisted: /bin/bash is a shell
	// allowlist on-miss deny
	// /usr/bin/rg allow-always
}

// ExampleAuthorize shows a host's whole use of the package for one
// command: the effective policy from the configured levels and the
// approvals file, the verdict, and after an operator's decision the check
// of the approval's binding right before the spawn.
func ExampleAuthorize() {
	dir, _ := os.MkdirTemp("", "approvals-example")
	defer os.RemoveAll(dir)
	dir, _ = filepath.EvalSymlinks(dir)
	tool := filepath.Join(dir, "tool")
	os.WriteFile(tool, []byte("#!/bin/sh\necho hello\n"), 0o755)

	// tools.exec (nothing configured), then a per-call value, then the
	// agent's entry of exec-approvals.json (none here).
	levels := approvals.Configured(approvals.Levels{}, approvals.Levels{}, approvals.DefaultSecurity("gateway", false)).
		Tighten(approvals.Levels{Ask: "on-miss"})
	var file *approvals.File // approvals.Load(approvals.Path(stateDir))
	policy := approvals.Stricter(levels.Policy(), file.AgentPolicy("main"))

	req := approvals.Request{
		Host:    approvals.HostGateway,
		AgentID: "main",
		Command: "./tool",
		Cwd:     dir,
		Env:     map[string]string{"PATH": "/usr/bin:/bin", "HOME": dir},
		Policy:  policy,
	}
	auth, _ := approvals.Authorize(req)
	fmt.Println(auth.Verdict, auth.Reason, auth.AllowAlways, len(auth.Binding.Files))

	// The operator allows it once; meanwhile the file is rewritten.
	os.WriteFile(tool, []byte("#!/bin/sh\necho changed\n"), 0o755)
	req.Decision, req.Approved = approvals.DecisionAllowOnce, auth.Binding
	auth, _ = approvals.Authorize(req)
	fmt.Println(auth.Verdict, strings.ReplaceAll(auth.Reason, dir, "$DIR"))
	// Output:
	// needs-approval allowlist-miss true 1
	// deny approval no longer matches: $DIR/tool changed
}
