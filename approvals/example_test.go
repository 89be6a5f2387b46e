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
