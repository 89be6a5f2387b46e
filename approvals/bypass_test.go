package approvals

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// bypassCorpus lists commands that must never be auto-allowed in allowlist
// mode, even with a generous allowlist (everything in {bin}, where the
// shells, env, xargs, sudo, find and git live, plus the symlink dir). The
// payload program `id` lives in {evil}, on PATH but never allowlisted; the
// safe bins and kept wrappers live in {trusted}. Each case names the reason
// execmesh gives.
func bypassCorpus() []struct{ cmd, reason string } {
	return []struct{ cmd, reason string }{
		// Wrappers are judged by what they run.
		{"env bash -c id", ReasonAllowlistMiss},
		{"env -S 'sh -c id'", ReasonAllowlistMiss},
		{"env --split-string='sh -c id'", ReasonAllowlistMiss},
		{"env -S'sh -c id'", ReasonAllowlistMiss},
		{"busybox sh -c id", ReasonAllowlistMiss},
		{"nice -n 5 sh -c id", ReasonAllowlistMiss},
		{"timeout 5 sh -c id", ReasonAllowlistMiss},
		{"stdbuf -oL sh -c id", ReasonAllowlistMiss},
		{"flock /tmp/l sh -c id", ReasonAllowlistMiss},
		{"flock /tmp/l -c id", ReasonAllowlistMiss},
		{"nohup id", ReasonAllowlistMiss},
		{"exec id", ReasonAllowlistMiss},
		{"command id", ReasonAllowlistMiss},
		{"command -p id", ReasonAllowlistMiss},
		{"command time -p id", ReasonAllowlistMiss},
		{"env -i id", ReasonAllowlistMiss},
		{"env -u HOME bash -c id", ReasonAllowlistMiss},
		{"env -C {evil} ./id", ReasonAllowlistMiss},
		{"/usr/bin/env bash -lc id", ReasonAllowlistMiss},
		{"sh -c \"sh -c 'sh -c id'\"", ReasonAllowlistMiss},
		{"bash -xec 'id'", ReasonAllowlistMiss},
		{"zsh -ic id", ReasonAllowlistMiss},
		{"'i'd", ReasonAllowlistMiss},
		{`i\d`, ReasonAllowlistMiss},
		{"echo ok | id", ReasonAllowlistMiss},
		{"env env env env env env env env env env ls", ReasonWrapperDepth},
		{"nice sh -c 'ls | id'", ReasonWrapper},
		{"env -S 'FOO=1 sh -c id'", ReasonWrapper},
		{"env -S 'sh -c $x'", ReasonWrapper},
		{"env -0 ls", ReasonWrapper},
		{"exec -a ls id", ReasonWrapper},
		{"timeout -k 1 sh -c id", ReasonWrapper},
		{"stdbuf sh -c id", ReasonWrapper},
		{"nice --frob ls", ReasonWrapper},
		{"env X=1 bash -lc id", ReasonAssignment},
		{"env PATH={evil} ls", ReasonAssignment},
		// Shells that read commands from somewhere the analyser cannot see.
		{"echo id | sh", ReasonShellWrapper},
		{"echo id | bash -s", ReasonShellWrapper},
		{"sh ./x", ReasonShellWrapper},
		{"busybox sh", ReasonShellWrapper},
		{"sh -c ls id", ReasonShellWrapper},
		{"zsh -o foo -c ls", ReasonShellWrapper},
		{"fish -c id", ReasonShellWrapper},
		// Shell grammar.
		{"$(id)", ReasonCommandSubstitution},
		{"`id`", ReasonCommandSubstitution},
		{`"$(id)"`, ReasonCommandSubstitution},
		{"ls $(id)", ReasonCommandSubstitution},
		{"a=$(id) ls", ReasonCommandSubstitution},
		{"ls > /tmp/x", ReasonRedirect},
		{"ls 2>&1", ReasonRedirect},
		{"ls &> /tmp/x", ReasonRedirect},
		{"cat < /etc/shadow", ReasonRedirect},
		{"echo ok |& cat", ReasonRedirect},
		{"bash -s < x", ReasonRedirect},
		{"cat <<EOF\nid\nEOF", ReasonHeredoc},
		{"cat <<'EOF'\nx\nEOF", ReasonHeredoc},
		{"cat <<EOF", ReasonUnterminated},
		{"cat <<< x", ReasonHereString},
		{"id <(ls)", ReasonProcessSubstitution},
		{"ls >(cat)", ReasonProcessSubstitution},
		{"ls; id", ReasonChain},
		{"ls && id", ReasonChain},
		{"ls || id", ReasonChain},
		{"ls\nid", ReasonChain},
		{"ls \\\n; id", ReasonLineContinuation},
		{"ls &", ReasonBackground},
		{"nohup sh -c id &", ReasonBackground},
		{"coproc id", ReasonBackground},
		{"(id)", ReasonSubshell},
		{"{ id; }", ReasonGroup},
		{"f(){ id; }; f", ReasonFunctionDefinition},
		{"if true; then id; fi", ReasonIf},
		{"while id; do :; done", ReasonWhile},
		{"until id; do :; done", ReasonUntil},
		{"for i in 1; do id; done", ReasonFor},
		{"case x in x) id;; esac", ReasonCase},
		{"! id", ReasonNegation},
		{"time id", ReasonCompound},
		{"[[ -f x ]]", ReasonCompound},
		{"((1))", ReasonCompound},
		{"let x=1", ReasonCompound},
		{"echo 'unterminated", ReasonUnterminated},
		{"ls &&", ReasonSyntax},
		// Assignments and builtins.
		{"IFS=, id", ReasonAssignment},
		{"PATH=/tmp/x ls", ReasonAssignment},
		{"LD_PRELOAD=/tmp/x.so ls", ReasonAssignment},
		{"a=1", ReasonAssignment},
		{"export X=1", ReasonBuiltin},
		{"cd /tmp", ReasonBuiltin},
		{"hash -p {evil}/id ls", ReasonBuiltin},
		{"alias ls=id", ReasonBuiltin},
		{"trap id EXIT", ReasonBuiltin},
		{"command -v id", ReasonBuiltin},
		{"exec", ReasonBuiltin},
		{"eval id", ReasonEval},
		{". ./x", ReasonSource},
		{"source x", ReasonSource},
		// Privilege tools, even when allowlisted.
		{"sudo id", ReasonPrivilege},
		{"sudo -u root ls", ReasonPrivilege},
		{"doas ls", ReasonPrivilege},
		// Dynamic words.
		{"${IFS}", ReasonDynamicExecutable},
		{"$'id'", ReasonDynamicExecutable},
		{"~root/bin/x", ReasonDynamicExecutable},
		{"$CMD", ReasonDynamicExecutable},
		{"ls${IFS}-la", ReasonDynamicExecutable}, // one word: the command name itself is computed
		{"ls -l${IFS}a", ReasonDynamicArgument},
		{"ls $HOME", ReasonDynamicArgument},
		{"ls *", ReasonDynamicArgument},
		{"ls ?", ReasonDynamicArgument},
		{"ls [ab]", ReasonDynamicArgument},
		{"ls {a,b}", ReasonDynamicArgument},
		{"ls x{1..3}", ReasonDynamicArgument},
		{"ls ~root", ReasonDynamicArgument},
		{"ls a=~/x", ReasonDynamicArgument},
		{"ls a=b:~/x", ReasonDynamicArgument},
		{"echo $'\\x69d'", ReasonDynamicArgument},
		{"echo $((1+1))", ReasonDynamicArgument},
		{"ls @(a|b)", ReasonDynamicArgument},
		{`bash -c "$CMD"`, ReasonDynamicArgument},
		// Resolution tricks.
		{"./ls", ReasonAllowlistMiss},               // a planted file named like an allowlisted tool
		{"{work}/ls", ReasonAllowlistMiss},          // the same by absolute path
		{"../work/ls", ReasonAllowlistMiss},         // relative path
		{"evil-link", ReasonAllowlistMiss},          // symlink in the allowlisted dir → non-allowlisted target
		{"{shim}/ls -c id", ReasonUnsafeExecutable}, // symlink named ls → /bin/sh
		{"{bin}/sh", ReasonShellWrapper},
		{"env", ReasonUnsafeExecutable},  // prints the environment
		{"noexec", ReasonUnresolved},     // not executable
		{"adir", ReasonUnresolved},       // a directory
		{"nosuchtool", ReasonUnresolved}, // not on PATH
		{"{trusted}/nice", ReasonUnsafeExecutable},
		// Safe bins are stdin-only.
		{"head -c 5 /etc/shadow", ReasonSafeBin},
		{"{trusted}/head -c 5 /etc/shadow", ReasonSafeBin},
		{"tail -f /var/log/syslog", ReasonSafeBin},
		{"wc --files0-from=list", ReasonSafeBin},
		{"head --lin 5", ReasonSafeBin},
		{"cut -d, -f1 /etc/passwd", ReasonSafeBin},
		{"uniq in out", ReasonSafeBin},
		{"tr a b c", ReasonSafeBin},
		{"head -n", ReasonSafeBin},
		{"head -x", ReasonSafeBin},
		{"sort -o /tmp/x", ReasonAllowlistMiss}, // sort is not a default safe bin
	}
}

// controls must be satisfied with both generous allowlists, so that the
// corpus shows refusals of the attack, not of the tools.
func controls() []struct{ cmd, rendered string } {
	return []struct{ cmd, rendered string }{
		{"ls -la", "'{bin}/ls' '-la'"},
		{`\ls`, "'{bin}/ls'"},
		{"l''s", "'{bin}/ls'"},
		{"ls ~/docs", "'{bin}/ls' '{home}/docs'"},
		{"git status", "'{bin}/git' 'status'"},
		{"git -C . log --oneline", "'{bin}/git' '-C' '.' 'log' '--oneline'"},
		{"env rg -n needle", "'{bin}/rg' '-n' 'needle'"},
		{"env -- rg -n needle", "'{bin}/rg' '-n' 'needle'"},
		{"env -i rg x", "'{trusted}/env' '-i' '{bin}/rg' 'x'"},
		{"nice -n 5 ls", "'{trusted}/nice' '-n' '5' '{bin}/ls'"},
		{"timeout 5 ls", "'{trusted}/timeout' '5' '{bin}/ls'"},
		{"stdbuf -oL grep x", "'{trusted}/stdbuf' '-oL' '{bin}/grep' 'x'"},
		{"flock /tmp/l ls", "'{trusted}/flock' '/tmp/l' '{bin}/ls'"},
		{"nohup ls", "'{trusted}/nohup' '{bin}/ls'"},
		{"command ls", "'{bin}/ls'"},
		{"exec ls", "'{bin}/ls'"},
		{"busybox ls", "'{bin}/ls'"},
		{"sh -c 'ls | wc -l'", "'{bin}/ls' | '{trusted}/wc' '-l'"},
		{"bash -lc 'git log --oneline'", "'{bin}/git' 'log' '--oneline'"},
		{"env -S 'rg -n x'", "'{bin}/rg' '-n' 'x'"},
		{"timeout 5 sh -c 'nice ls'", "'{trusted}/timeout' '5' '{trusted}/nice' '{bin}/ls'"},
		{"echo ok | head -n 5", "'{bin}/echo' 'ok' | '{trusted}/head' '-n' '5'"},
		{"cat x | tr a-z A-Z | cut -d, -f1 | uniq -c | wc -l", "'{bin}/cat' 'x' | '{trusted}/tr' 'a-z' 'A-Z' | '{trusted}/cut' '-d,' '-f1' | '{trusted}/uniq' '-c' | '{trusted}/wc' '-l'"},
		{"find . -name x", "'{bin}/find' '.' '-name' 'x'"},
		{"echo \"it's\"", `'{bin}/echo' 'it'"'"'s'`},
		{"echo 'a;b' \"&&\" a\\|b", "'{bin}/echo' 'a;b' '&&' 'a|b'"},
		{"~/bin/tool x", "'{home}/bin/tool' 'x'"},
	}
}

func TestBypassCorpus(t *testing.T) {
	h := newHost(t)
	corpus := bypassCorpus()
	if len(corpus) < 60 {
		t.Fatalf("corpus has %d commands, want at least 60", len(corpus))
	}
	allowlists := map[string][]Entry{"glob": h.globAllowlist(), "specific": h.specificAllowlist()}
	for name, allow := range allowlists {
		opts := h.opts(allow)
		for _, c := range corpus {
			cmd := h.sub(c.cmd)
			t.Run(name+"/"+cmd, func(t *testing.T) {
				ev := Evaluate(cmd, opts)
				if ev.Satisfied {
					t.Fatalf("auto-allowed: plan %q", ev.Rendered)
				}
				if ev.Argv != nil || ev.Rendered != "" {
					t.Errorf("unsatisfied evaluation carries a plan %q", ev.Rendered)
				}
				if ev.Reason != c.reason {
					t.Errorf("reason = %q (%s), want %q; problems %v", ev.Reason, ev.Detail, c.reason, ev.Analysis.Problems)
				}
				for _, ask := range []string{AskOff, AskOnMiss, AskAlways} {
					pol := Policy{Security: SecurityAllowlist, Ask: ask, AskFallback: SecurityDeny}
					d := Decide(HostGateway, pol, ev)
					switch ask {
					case AskOff:
						if d.Verdict != Deny || d.Reason != DenyAllowlistMiss {
							t.Errorf("ask=off: %v %q, want deny %q", d.Verdict, d.Reason, DenyAllowlistMiss)
						}
					default:
						if d.Verdict != NeedsApproval || d.RunPlan {
							t.Errorf("ask=%s: %+v, want needs-approval", ask, d)
						}
					}
					if f := Fallback(pol, ev); f.Verdict != Deny {
						t.Errorf("fallback with askFallback=deny: %+v", f)
					}
				}
			})
		}
		for _, c := range controls() {
			cmd := h.sub(c.cmd)
			t.Run(name+"/control/"+cmd, func(t *testing.T) {
				ev := Evaluate(cmd, opts)
				if !ev.Satisfied {
					t.Fatalf("control not satisfied: %s (%s) %v", ev.Reason, ev.Detail, ev.Analysis.Problems)
				}
				if want := h.sub(c.rendered); ev.Rendered != want {
					t.Errorf("rendered\n got %s\nwant %s", ev.Rendered, want)
				}
				d := Decide(HostNode, Policy{Security: SecurityAllowlist, Ask: AskOnMiss}, ev)
				if d.Verdict != Allow || !d.RunPlan {
					t.Errorf("decision %+v, want allow with plan", d)
				}
			})
		}
	}
}

// TestBypassAllowAnything: with the bare "*" pattern every resolvable
// executable matches, but structure, shells, wrappers and carriers are
// still refused, and no plan ever runs a shell.
func TestBypassAllowAnything(t *testing.T) {
	h := newHost(t)
	opts := h.opts([]Entry{{Pattern: "*"}})
	if ev := Evaluate("id", opts); !ev.Satisfied || ev.Rendered != Quote(filepath.Join(h.evil, "id")) {
		t.Fatalf("* should allow id: %+v", ev)
	}
	for _, c := range bypassCorpus() {
		cmd := h.sub(c.cmd)
		ev := Evaluate(cmd, opts)
		if !ev.Satisfied {
			continue
		}
		// Only the wrapper cases whose payload is id may pass with "*", and
		// then the plan runs id itself, never a shell or env.
		for _, argv := range ev.Argv {
			if k := unsafeKind(filepath.Base(argv[0])); k != "" && k != "dispatch wrapper" {
				t.Errorf("%q: plan runs %s (%s)", cmd, argv[0], k)
			}
			for _, w := range argv {
				if isShell(kindName(filepath.Base(w))) {
					t.Errorf("%q: plan %q mentions a shell", cmd, ev.Rendered)
				}
			}
		}
		// "*" allowlists every resolvable path, id and safe bins used with
		// files included (an allowlist match wins over safe-bin rules).
		if c.reason != ReasonAllowlistMiss && c.reason != ReasonSafeBin {
			t.Errorf("%q (%s) satisfied under *: %q", cmd, c.reason, ev.Rendered)
		}
	}
}

// TestRealSafeBin checks the spec's example against the host's real head
// (trusted by default in /usr/bin): the file operand is refused.
func TestRealSafeBin(t *testing.T) {
	head, err := filepath.EvalSymlinks("/usr/bin/head")
	if err != nil || filepath.Base(head) != "head" {
		t.Skip("no plain /usr/bin/head on this host")
	}
	ev := Evaluate("/usr/bin/head -c 5 /etc/shadow", EvalOptions{Cwd: t.TempDir()})
	if ev.Satisfied || ev.Reason != ReasonSafeBin {
		t.Fatalf("got %v %q (%s)", ev.Satisfied, ev.Reason, ev.Detail)
	}
	ev = Evaluate("/usr/bin/head -c 5", EvalOptions{Cwd: t.TempDir()})
	if !ev.Satisfied || ev.Rendered != Quote(head)+" '-c' '5'" {
		t.Fatalf("stdin-only head not satisfied: %+v", ev)
	}
	if ev.Segments[0].SatisfiedBy != BySafeBin {
		t.Fatalf("satisfied by %q", ev.Segments[0].SatisfiedBy)
	}
}

// TestSymlinkRules pins the symlink decisions: the real path is matched, a
// link's own name never matches, and links in a pattern's directory part
// are followed.
func TestSymlinkRules(t *testing.T) {
	h := newHost(t)
	// A directory link: patterns through it cover the real directory.
	linkDir := filepath.Join(h.root, "linkdir")
	if err := os.Symlink(h.bin, linkDir); err != nil {
		t.Fatal(err)
	}
	opts := h.opts([]Entry{{Pattern: linkDir + "/*"}})
	if ev := Evaluate("ls", opts); !ev.Satisfied {
		t.Fatalf("pattern through a linked directory: %s %s", ev.Reason, ev.Detail)
	}
	// Running a link: the link name never matches, the target must.
	toolLink := filepath.Join(h.root, "links", "rg")
	if err := os.MkdirAll(filepath.Dir(toolLink), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(h.bin, "rg"), toolLink); err != nil {
		t.Fatal(err)
	}
	opts = h.opts([]Entry{{Pattern: toolLink}})
	if ev := Evaluate(toolLink+" x", opts); ev.Satisfied || ev.Reason != ReasonAllowlistMiss {
		t.Fatalf("link name matched: %+v", ev.Reason)
	}
	opts = h.opts([]Entry{{Pattern: filepath.Join(h.bin, "rg")}})
	ev := Evaluate(toolLink+" x", opts)
	if !ev.Satisfied {
		t.Fatalf("link to an allowlisted target: %s %s", ev.Reason, ev.Detail)
	}
	if got, want := ev.Argv[0][0], filepath.Join(h.bin, "rg"); got != want {
		t.Errorf("plan runs %s, want the real path %s", got, want)
	}
	// A link to git under another name resolves to git.
	if err := os.Symlink(filepath.Join(h.bin, "git"), filepath.Join(h.work, "g")); err != nil {
		t.Fatal(err)
	}
	opts = h.opts(h.globAllowlist())
	if ev := Evaluate("./g log", opts); !ev.Satisfied {
		t.Fatalf("plain git through a link: %s %s", ev.Reason, ev.Detail)
	}
	// An allowlisted name that is a link to a shell never runs.
	opts = h.opts([]Entry{{Pattern: filepath.Join(h.shim, "ls")}, {Pattern: "/**"}})
	if ev := Evaluate(filepath.Join(h.shim, "ls"), opts); ev.Satisfied || ev.Reason != ReasonUnsafeExecutable {
		t.Fatalf("link to /bin/sh: %v %s", ev.Satisfied, ev.Reason)
	}
}

// TestPlanIsWhatRuns: every satisfied control's plan names only absolute
// real paths, and the analysed program is what the plan runs.
func TestPlanIsWhatRuns(t *testing.T) {
	h := newHost(t)
	opts := h.opts(h.globAllowlist())
	for _, c := range controls() {
		ev := Evaluate(h.sub(c.cmd), opts)
		if !ev.Satisfied {
			t.Errorf("%q not satisfied: %s", c.cmd, ev.Reason)
			continue
		}
		for i, r := range ev.Segments {
			argv := ev.Argv[i]
			if !filepath.IsAbs(argv[0]) {
				t.Errorf("%q: relative program %q", c.cmd, argv[0])
			}
			n := len(r.Program)
			if !slices.Equal(argv[len(argv)-n+1:], expandHome(r.Program[1:], h.home)) {
				t.Errorf("%q: plan %q does not end with the program's arguments %q", c.cmd, argv, r.Program)
			}
			if argv[len(argv)-n] != r.ResolvedPath {
				t.Errorf("%q: plan runs %q, resolved %q", c.cmd, argv[len(argv)-n], r.ResolvedPath)
			}
		}
	}
}

func expandHome(args []string, home string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "~" || strings.HasPrefix(a, "~/") {
			a = home + a[1:]
		}
		out[i] = a
	}
	return out
}
