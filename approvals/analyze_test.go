package approvals

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func heads(a Analysis) []string {
	var out []string
	for _, s := range a.Segments {
		if len(s.Argv) > 0 {
			out = append(out, s.Argv[0])
		}
	}
	return out
}

// TestSpecAnalysisCases covers spec §23.7 cases 60–75 that apply to POSIX,
// with execmesh's verdicts (DESIGN §7 where they differ from OpenClaw's).
func TestSpecAnalysisCases(t *testing.T) {
	cases := []struct {
		n      int
		cmd    string
		ok     bool
		reason string
		heads  []string
	}{
		{60, "echo ok | jq .foo", true, "", []string{"echo", "jq"}},
		{61, "ls && rm -rf /", false, ReasonChain, []string{"ls", "rm"}}, // OpenClaw: ok, two chains
		{63, `echo "output: $(whoami)"`, false, ReasonCommandSubstitution, nil},
		{63, "echo \"output: `id`\"", false, ReasonCommandSubstitution, nil},
		{63, "echo $(whoami)", false, ReasonCommandSubstitution, nil},
		{63, "cat < input.txt", false, ReasonRedirect, nil},
		{63, "echo ok > output.txt", false, ReasonRedirect, nil},
		{63, "echo ok\nid", false, ReasonChain, nil},
		{63, "echo \"ok $\\\n(id -u)\"", false, ReasonLineContinuation, nil},
		{63, "echo \"ok $\\\r\n(id -u)\"", false, ReasonLineContinuation, nil},
		{64, `echo "output: \$(whoami)"`, true, "", []string{"echo"}},
		{64, `echo 'output: $(whoami)'`, true, "", []string{"echo"}},
		// 65: the older analyser accepted heredocs; execmesh never does.
		{65, "/usr/bin/tee /tmp/file << 'EOF'\nEOF", false, ReasonHeredoc, nil},
		{65, "cat <<EOF\nEOF", false, ReasonHeredoc, nil},
		{65, "cat <<-DELIM\n\tDELIM", false, ReasonHeredoc, nil},
		{65, "/usr/bin/cat << 'EOF' | /usr/bin/grep pattern\npattern\nEOF", false, ReasonHeredoc, []string{"/usr/bin/cat", "/usr/bin/grep"}},
		{66, "cat <<EOF\n$(id)\nEOF", false, ReasonHeredoc, nil},
		{66, "cat <<EOF\n${PATH}\nEOF", false, ReasonHeredoc, nil},
		{66, "cat <<EOF\nline one", false, ReasonUnterminated, nil},
		{69, "/usr/bin/obsidian-cli print-default && /usr/bin/obsidian-cli search foo | /usr/bin/head", false, ReasonChain, nil},
		{69, "/usr/bin/echo ok &&", false, ReasonSyntax, nil},
		{70, `/usr/bin/echo "foo && bar"`, true, "", []string{"/usr/bin/echo"}},
		{70, `/usr/bin/echo "foo\" && bar"`, true, "", []string{"/usr/bin/echo"}},
		// 71: line continuations are refused (OpenClaw 2026.9.6 agrees), but
		// a backslash-newline inside single quotes is literal.
		{71, "/usr/bin/git \\\n  commit \\\n  -m 'msg'", false, ReasonLineContinuation, nil},
		{71, "/usr/bin/git commit -m 'a\\\nb'", true, "", []string{"/usr/bin/git"}},
		{71, "/usr/bin/echo ok \\\n&& /usr/bin/rm -rf /", false, ReasonLineContinuation, nil},
		{74, "rg foo src/*.ts | head -n 5 && echo ok", false, ReasonChain, nil},
		{75, "env rg -n needle", true, "", []string{"env"}},
	}
	for _, c := range cases {
		a := Analyze(c.cmd)
		if a.OK != c.ok || a.Reason != c.reason {
			t.Errorf("case %d %q: ok=%v reason=%q (%s), want ok=%v reason=%q", c.n, c.cmd, a.OK, a.Reason, a.Detail, c.ok, c.reason)
		}
		if c.heads != nil && !slices.Equal(heads(a), c.heads) {
			t.Errorf("case %d %q: heads %q, want %q", c.n, c.cmd, heads(a), c.heads)
		}
	}
	// 62: argv analysis.
	if a := AnalyzeArgv([]string{"/bin/echo", "ok"}); !a.OK || !slices.Equal(a.Segments[0].Program, []string{"/bin/echo", "ok"}) {
		t.Errorf("case 62: %+v", a)
	}
	if a := AnalyzeArgv([]string{"", "   "}); a.OK || a.Reason != ReasonEmptyArgv {
		t.Errorf("case 62 empty: %+v", a)
	}
	if a := AnalyzeArgv([]string{"sh", "-c", "ls | wc -l"}); !a.OK || !slices.Equal(heads(a), []string{"ls", "wc"}) {
		t.Errorf("argv sh -c payload: %+v", a)
	}
}

// TestSpecEvaluationCases covers cases 69–75 with real files.
func TestSpecEvaluationCases(t *testing.T) {
	h := newHost(t)
	obs := filepath.Join(h.bin, "obsidian-cli")
	head := filepath.Join(h.trusted, "head")
	allow := []Entry{{Pattern: obs}, {Pattern: head}}
	opts := h.opts(allow)

	// 69: with execmesh's rules a chain is never satisfied, even when every
	// segment would be.
	ev := Evaluate(obs+" print-default && "+obs+" search foo | "+head, opts)
	if !ev.Satisfied && ev.AnalysisOK {
		t.Error("69: analysis should fail on chaining")
	}
	if ev.Satisfied || ev.Reason != ReasonChain {
		t.Errorf("69: %v %q", ev.Satisfied, ev.Reason)
	}
	for _, r := range ev.Segments {
		if r.SatisfiedBy == "" {
			t.Errorf("69: segment %q would not even be satisfied: %s", r.Argv, r.Reason)
		}
	}
	ev = Evaluate(obs+" search foo | "+head, opts)
	if !ev.Satisfied {
		t.Errorf("69: pipeline of allowlisted tools: %s %s", ev.Reason, ev.Detail)
	}
	ev = Evaluate(obs+" search foo | "+head+" | "+filepath.Join(h.evil, "rm")+" -rf /", opts)
	if ev.Satisfied || ev.Reason != ReasonAllowlistMiss {
		t.Errorf("69: rm in the pipeline: %v %q", ev.Satisfied, ev.Reason)
	}

	// 70: quoted operators are arguments.
	echo := filepath.Join(h.bin, "echo")
	opts = h.opts([]Entry{{Pattern: echo}})
	for _, cmd := range []string{echo + ` "foo && bar"`, echo + ` "foo\" && bar"`} {
		if ev := Evaluate(cmd, opts); !ev.Satisfied {
			t.Errorf("70: %q: %s", cmd, ev.Reason)
		}
	}
	// 71: a continuation is refused even with the allowlist, and an empty
	// allowlist satisfies nothing.
	git := filepath.Join(h.bin, "git")
	if ev := Evaluate(git+" \\\n  commit", h.opts([]Entry{{Pattern: git}})); ev.Satisfied || ev.Reason != ReasonLineContinuation {
		t.Errorf("71: %v %q", ev.Satisfied, ev.Reason)
	}
	if ev := Evaluate(git+" status", h.opts(nil)); ev.Satisfied || !ev.AnalysisOK || ev.Reason != ReasonAllowlistMiss {
		t.Errorf("71 empty allowlist: %+v", ev.Reason)
	}
	// 72: "*" satisfies any resolvable command.
	opts = h.opts([]Entry{{Pattern: "*"}})
	for _, cmd := range []string{"ls", "id", "rg x | wc -l", filepath.Join(h.evil, "rm") + " -rf /tmp/x"} {
		if ev := Evaluate(cmd, opts); !ev.Satisfied {
			t.Errorf("72: %q: %s %s", cmd, ev.Reason, ev.Detail)
		}
	}
	if ev := Evaluate("nosuchtool", opts); ev.Satisfied || ev.Reason != ReasonUnresolved {
		t.Errorf("72: unresolvable under *: %+v", ev.Reason)
	}
	// 74: an allowlisted segment and a safe bin, rendered single-quoted with
	// real paths (execmesh quotes every segment, not only safe bins).
	rg := filepath.Join(h.bin, "rg")
	opts = h.opts([]Entry{{Pattern: rg}})
	ev = Evaluate("rg foo src/x.ts | head -n 5", opts)
	if !ev.Satisfied {
		t.Fatalf("74: %s %s", ev.Reason, ev.Detail)
	}
	if want := Quote(rg) + " 'foo' 'src/x.ts' | " + Quote(head) + " '-n' '5'"; ev.Rendered != want {
		t.Errorf("74: rendered %s, want %s", ev.Rendered, want)
	}
	if ev.Segments[0].SatisfiedBy != ByAllowlist || ev.Segments[1].SatisfiedBy != BySafeBin {
		t.Errorf("74: satisfied by %q, %q", ev.Segments[0].SatisfiedBy, ev.Segments[1].SatisfiedBy)
	}
	// 75: env is dropped from the plan.
	ev = Evaluate("env rg -n needle", opts)
	if !ev.Satisfied || ev.Rendered != Quote(rg)+" '-n' 'needle'" {
		t.Errorf("75: %q (%s)", ev.Rendered, ev.Reason)
	}
	if !slices.Equal(ev.Argv[0], []string{rg, "-n", "needle"}) {
		t.Errorf("75: argv %q", ev.Argv[0])
	}
}

func TestSegmentsAndWrappers(t *testing.T) {
	cases := []struct {
		cmd      string
		program  []string
		wrappers [][]string
		via      []string
	}{
		{"env rg -n x", []string{"rg", "-n", "x"}, nil, []string{"env"}},
		{"env -i -u HOME rg", []string{"rg"}, [][]string{{"env", "-i", "-u", "HOME"}}, []string{"env"}},
		{"env -iuHOME rg", []string{"rg"}, [][]string{{"env", "-i", "-u", "HOME"}}, []string{"env"}},
		{"env --unset=HOME -- rg", []string{"rg"}, [][]string{{"env", "-u", "HOME"}}, []string{"env"}},
		{"env -S 'nice -n 2 rg x' y", []string{"rg", "x", "y"}, [][]string{{"nice", "-n", "2"}}, []string{"env", "nice"}},
		{"nice -n 5 timeout -s KILL 10 rg", []string{"rg"}, [][]string{{"nice", "-n", "5"}, {"timeout", "-s", "KILL", "10"}}, []string{"nice", "timeout"}},
		{"nice -5 rg", []string{"rg"}, [][]string{{"nice", "-5"}}, []string{"nice"}},
		{"stdbuf -i0 -oL --error=0 rg", []string{"rg"}, [][]string{{"stdbuf", "-i0", "-oL", "--error=0"}}, []string{"stdbuf"}},
		{"flock -w 5 /tmp/l rg", []string{"rg"}, [][]string{{"flock", "-w", "5", "/tmp/l"}}, []string{"flock"}},
		{"flock -n /tmp/l -c 'rg x'", []string{"rg", "x"}, [][]string{{"flock", "-n", "/tmp/l"}}, []string{"flock -c"}},
		{"command -p -- rg", []string{"rg"}, nil, []string{"command"}},
		{"exec -- rg", []string{"rg"}, nil, []string{"exec"}},
		{"busybox env sh -c rg", []string{"rg"}, nil, []string{"busybox", "env", "sh -c"}},
		{"/usr/bin/env /bin/bash --norc -lc 'rg x'", []string{"rg", "x"}, nil, []string{"env", "bash -c"}},
		{"bash -c -- 'rg'", []string{"rg"}, nil, []string{"bash -c"}},
		{"command time -p rg", []string{"rg"}, [][]string{{"time", "-p"}}, []string{"command", "time"}},
		{"nohup -- rg", []string{"rg"}, [][]string{{"nohup", "--"}}, []string{"nohup"}},
	}
	for _, c := range cases {
		a := Analyze(c.cmd)
		if !a.OK || len(a.Segments) != 1 {
			t.Errorf("%q: ok=%v %s (%s), %d segments", c.cmd, a.OK, a.Reason, a.Detail, len(a.Segments))
			continue
		}
		s := a.Segments[0]
		if !slices.Equal(s.Program, c.program) || !slices.EqualFunc(s.Wrappers, c.wrappers, slices.Equal[[]string]) || !slices.Equal(s.Via, c.via) {
			t.Errorf("%q: program %q wrappers %q via %q; want %q %q %q", c.cmd, s.Program, s.Wrappers, s.Via, c.program, c.wrappers, c.via)
		}
	}
}

func TestWrapperDepth(t *testing.T) {
	cmd := "ls"
	for range MaxWrapperDepth {
		cmd = "sh -c " + Quote(cmd)
	}
	if a := Analyze(cmd); !a.OK {
		t.Fatalf("%d levels should be followed: %s %s", MaxWrapperDepth, a.Reason, a.Detail)
	}
	cmd = "sh -c " + Quote(cmd)
	if a := Analyze(cmd); a.OK || a.Reason != ReasonWrapperDepth {
		t.Fatalf("%d levels: %v %s", MaxWrapperDepth+1, a.OK, a.Reason)
	}
	if a := Analyze(strings.Repeat("env ", MaxWrapperDepth+1) + "ls"); a.Reason != ReasonWrapperDepth {
		t.Fatalf("env chain: %s", a.Reason)
	}
	if a := Analyze("env -S 'env -S \"ls\"'"); !a.OK {
		t.Fatalf("nested env -S: %s %s", a.Reason, a.Detail)
	}
}

func TestWords(t *testing.T) {
	cases := []struct {
		cmd  string
		argv []string
	}{
		{`echo a\ b`, []string{"echo", "a b"}},
		{`echo "a\nb"`, []string{"echo", `a\nb`}},
		{`echo "\$x \` + "`" + ` \" \\"`, []string{"echo", "$x ` \" \\"}},
		{`echo '\'`, []string{"echo", `\`}},
		{`echo ""`, []string{"echo", ""}},
		{`echo a''b""c`, []string{"echo", "abc"}},
		{`echo \*`, []string{"echo", "*"}},
		{`echo '*' "?" \[a]`, []string{"echo", "*", "?", "[a]"}},
		{`echo "{a,b}" \{a,b}`, []string{"echo", "{a,b}", "{a,b}"}},
		{`git stash show stash@{0}`, []string{"git", "stash", "show", "stash@{0}"}},
		{`find . -name x -print {}`, []string{"find", ".", "-name", "x", "-print", "{}"}},
		{`echo --x=~/y a:~/b '~' a='~' "a"=b`, []string{"echo", "--x=~/y", "a:~/b", "~", "a=~", "a=b"}},
		{`echo $`, []string{"echo", "$"}},
		{`[ -f x ]`, []string{"[", "-f", "x", "]"}},
		{"echo é ü 日本", []string{"echo", "é", "ü", "日本"}},
	}
	for _, c := range cases {
		a := Analyze(c.cmd)
		if !a.OK {
			t.Errorf("%q: %s (%s)", c.cmd, a.Reason, a.Detail)
			continue
		}
		if !slices.Equal(a.Segments[0].Argv, c.argv) {
			t.Errorf("%q: argv %q, want %q", c.cmd, a.Segments[0].Argv, c.argv)
		}
	}
}

func TestAnalyzeRefusals(t *testing.T) {
	cases := map[string]string{
		"echo a\x00b":           ReasonSyntax,
		"a=(1 2)":               ReasonAssignment,
		"declare -x A=1":        ReasonBuiltin,
		"ls \\\n -la":           ReasonLineContinuation,
		`echo "a\` + "\n" + `"`: ReasonLineContinuation,
		"exec 3>/tmp/x":         ReasonRedirect,
		"> /tmp/x":              ReasonRedirect,
		"ls >| x":               ReasonRedirect,
		"ls <> x":               ReasonRedirect,
		"ls >> x":               ReasonRedirect,
		"echo $[1+1]":           ReasonDynamicArgument,
		`echo $"x"`:             ReasonDynamicArgument,
		"sh":                    ReasonShellWrapper,
		"sh -c":                 ReasonShellWrapper,
		"sh -O extglob -c ls":   ReasonShellWrapper,
		"bash --rcfile x -c ls": ReasonShellWrapper,
		"tcsh -c ls":            ReasonShellWrapper,
		"nohup":                 ReasonWrapper,
		"timeout 5":             ReasonWrapper,
		"timeout x ls":          ReasonWrapper,
		"stdbuf -oX ls":         ReasonWrapper,
		"command -x ls":         ReasonWrapper,
		"command":               ReasonBuiltin,
		"env -S 'ls > x'":       ReasonWrapper,
		"env -S 'ls *'":         ReasonWrapper,
		"env -Z ls":             ReasonWrapper,
		"env --frob ls":         ReasonWrapper,
		"env -u":                ReasonWrapper,
		"flock":                 ReasonWrapper,
		"flock -c ls":           ReasonWrapper,
		"flock /tmp/l -c ls x":  ReasonWrapper,
		"ls &!":                 ReasonSyntax,
		"coproc x { ls; }":      ReasonBackground,
		"sudoedit /etc/x":       ReasonPrivilege,
		"time -p ls":            ReasonCompound,
	}
	for cmd, want := range cases {
		a := Analyze(cmd)
		if a.OK || a.Reason != want {
			t.Errorf("%q: ok=%v reason=%q (%s), want %q", cmd, a.OK, a.Reason, a.Detail, want)
		}
	}
	for cmd, blocked := range map[string]bool{"LD_PRELOAD=x ls": true, "PATH=/x ls": true, "env BASH_ENV=x ls": true, "FOO=1 ls": false} {
		a := Analyze(cmd)
		if a.Reason != ReasonAssignment || strings.Contains(a.Detail, "blocked") != blocked {
			t.Errorf("%q: %s (%s), blocked key marked: want %v", cmd, a.Reason, a.Detail, blocked)
		}
	}
	// Read-only git and find stay allowable (git and find are trusted by
	// path when allowlisted).
	for _, cmd := range []string{"git config --get user.name", "git log -c", "git commit -c HEAD", "find . -type f -print", "git -C sub status"} {
		if a := Analyze(cmd); !a.OK {
			t.Errorf("%q refused: %s (%s)", cmd, a.Reason, a.Detail)
		}
	}
}

// TestAnalyzeLargeInput guards against quadratic work on long commands,
// which an agent controls.
func TestAnalyzeLargeInput(t *testing.T) {
	inputs := []string{
		"echo " + strings.Repeat("{", 100000) + "}",
		"echo " + strings.Repeat("'a' ", 50000) + "\\\nx",
		"echo " + strings.Repeat("a\\ ", 100000),
		"ls " + strings.Repeat("| wc ", 5000),
	}
	for _, in := range inputs {
		done := make(chan Analysis, 1)
		go func() { done <- Analyze(in) }()
		select {
		case <-done:
		case <-t.Context().Done():
			t.Fatal("cancelled")
		case <-time.After(20 * time.Second):
			t.Fatalf("Analyze took too long on a %d-byte input", len(in))
		}
	}
}
