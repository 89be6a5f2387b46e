package approvals

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"mvdan.cc/sh/v3/syntax"

	"github.com/execmesh/execmesh/internal/testutil"
)

// recordingHost is a host whose executables append their own path to
// $STUB_LOG. Kept-wrapper stubs then exec the first absolute executable in
// their arguments, the way nice or timeout run their command.
func recordingHost(t testing.TB) *host {
	h := newHost(t)
	record := `printf '%s\n' "$0" >> "$STUB_LOG"`
	for _, n := range binTools {
		writeExec(t, filepath.Join(h.bin, n), record)
	}
	for _, n := range evilTools {
		writeExec(t, filepath.Join(h.evil, n), record)
	}
	for _, n := range trustedTools {
		writeExec(t, filepath.Join(h.trusted, n), record+`
for a in "$@"; do
	shift
	case "$a" in /*) if [ -f "$a" ] && [ -x "$a" ]; then exec "$a" "$@"; fi ;; esac
done`)
	}
	writeExec(t, filepath.Join(h.home, "bin", "tool"), record)
	return h
}

// FuzzAnalyze checks, for any command text: analysis and evaluation never
// panic and are consistent; an OK analysis has only the syntax a single
// pipeline of literal simple commands may have (checked by an independent
// walk of the parse); and whenever a command is judged satisfied, the plan
// runs only the programs in its Segments, each allowlisted or a safe bin —
// checked by running the plan under /bin/sh with recording stubs.
func FuzzAnalyze(f *testing.F) {
	for _, c := range bypassCorpus() {
		f.Add(c.cmd)
	}
	for _, c := range controls() {
		f.Add(c.cmd)
	}
	if data, err := os.ReadFile(testutil.ConformanceFile(f, "shell_analysis.json")); err == nil {
		var fx struct{ Cases []struct{ Command string } }
		if json.Unmarshal(data, &fx) == nil {
			for _, c := range fx.Cases {
				f.Add(c.Command)
			}
		}
	}
	h := recordingHost(f)
	opts := h.opts(h.globAllowlist())
	f.Fuzz(func(t *testing.T, cmd string) {
		cmd = h.sub(cmd)
		a := Analyze(cmd)
		if a.OK != (len(a.Problems) == 0) || a.OK != (a.Reason == "") {
			t.Fatalf("inconsistent analysis: ok=%v reason=%q problems=%v", a.OK, a.Reason, a.Problems)
		}
		if a.OK {
			if len(a.Segments) == 0 {
				t.Fatal("OK analysis without segments")
			}
			for _, s := range a.Segments {
				if len(s.Program) == 0 {
					t.Fatalf("OK segment without a program: %+v", s)
				}
			}
			checkPlainSyntax(t, cmd)
		}
		ev := a.Evaluate(opts)
		if !ev.Satisfied {
			if ev.Argv != nil || ev.Rendered != "" {
				t.Fatal("plan on an unsatisfied evaluation")
			}
			return
		}
		if !a.OK || len(ev.Argv) != len(a.Segments) || len(ev.Segments) != len(a.Segments) {
			t.Fatalf("satisfied with ok=%v, %d argv, %d segments", a.OK, len(ev.Argv), len(a.Segments))
		}
		var want []string
		runnable := true
		for i, r := range ev.Segments {
			switch r.SatisfiedBy {
			case ByAllowlist:
				if !matchesAny(opts.Allowlist, r.ResolvedPath, opts.Home) {
					t.Fatalf("segment %d: %s is not allowlisted", i, r.ResolvedPath)
				}
			case BySafeBin:
				if !slices.Contains(DefaultSafeBins(), filepath.Base(r.ResolvedPath)) {
					t.Fatalf("segment %d: %s is not a safe bin", i, r.ResolvedPath)
				}
			default:
				t.Fatalf("segment %d satisfied by %q", i, r.SatisfiedBy)
			}
			if unsafeKind(filepath.Base(r.ResolvedPath)) != "" {
				t.Fatalf("segment %d runs %s", i, r.ResolvedPath)
			}
			argv := ev.Argv[i]
			n := len(r.Program)
			if len(argv) < n || argv[len(argv)-n] != r.ResolvedPath || !slices.Equal(argv[len(argv)-n+1:], expandHome(r.Program[1:], opts.Home)) {
				t.Fatalf("segment %d: plan %q does not run the analysed program %q (%s)", i, argv, r.Program, r.ResolvedPath)
			}
			if len(r.WrapperPaths) != len(r.Wrappers) {
				t.Fatalf("segment %d: %d wrappers, %d paths", i, len(r.Wrappers), len(r.WrapperPaths))
			}
			if len(r.Wrappers) > 0 && argv[0] != r.WrapperPaths[0] {
				t.Fatalf("segment %d: plan starts with %s, not its wrapper", i, argv[0])
			}
			for _, p := range append([]string{r.ResolvedPath}, r.WrapperPaths...) {
				if !strings.HasPrefix(p, h.root+string(filepath.Separator)) {
					runnable = false // a real system program: never run it here
				}
			}
			want = append(want, r.WrapperPaths...)
			want = append(want, r.ResolvedPath)
		}
		if !runnable {
			return
		}
		ran := runPlan(t, h, ev.Rendered)
		allowed := map[string]bool{}
		for _, p := range want {
			allowed[p] = true
		}
		for _, p := range ran {
			if !allowed[p] {
				t.Fatalf("plan %s ran %s, which is not among the analysed programs %q", ev.Rendered, p, want)
			}
		}
		if !hasWrappers(ev) {
			slices.Sort(ran)
			slices.Sort(want)
			if !slices.Equal(ran, want) {
				t.Fatalf("plan %s ran %q, want %q", ev.Rendered, ran, want)
			}
		}
	})
}

func hasWrappers(ev Evaluation) bool {
	for _, r := range ev.Segments {
		if len(r.Wrappers) > 0 {
			return true
		}
	}
	return false
}

func matchesAny(entries []Entry, path, home string) bool {
	for _, e := range entries {
		if MatchPattern(e.Pattern, path, home) {
			return true
		}
	}
	return false
}

// runPlan runs a rendered plan under /bin/sh with an empty PATH and returns
// the executables that ran, in order of their log lines.
func runPlan(t *testing.T, h *host, rendered string) []string {
	t.Helper()
	log := filepath.Join(t.TempDir(), "log")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", rendered)
	cmd.Env = []string{"STUB_LOG=" + log, "PATH=/nonexistent"}
	cmd.Dir = h.work
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("plan %s failed: %v\n%s", rendered, err, out)
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatalf("plan %s ran nothing: %v", rendered, err)
	}
	return strings.Fields(string(data))
}

// checkPlainSyntax walks the parse of an OK command independently of the
// analyser, with a list of the only node kinds such a command may contain.
// Shell payloads (sh -c '…') are strings here, analysed on their own.
func checkPlainSyntax(t *testing.T, cmd string) {
	t.Helper()
	f, err := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(strings.NewReader(cmd), "")
	if err != nil {
		t.Fatalf("OK analysis of text that does not parse: %v", err)
	}
	if len(f.Stmts) != 1 {
		t.Fatalf("OK analysis of %d statements", len(f.Stmts))
	}
	syntax.Walk(f, func(n syntax.Node) bool {
		switch n := n.(type) {
		case nil, *syntax.File, *syntax.Word, *syntax.Lit:
		case *syntax.Stmt:
			if n.Negated || n.Background || n.Coprocess || n.Disown || len(n.Redirs) > 0 {
				t.Fatalf("OK analysis of a statement with %+v", n)
			}
		case *syntax.CallExpr:
			if len(n.Assigns) > 0 {
				t.Fatal("OK analysis with assignments")
			}
		case *syntax.BinaryCmd:
			if n.Op != syntax.Pipe {
				t.Fatalf("OK analysis with operator %s", n.Op)
			}
		case *syntax.SglQuoted:
			if n.Dollar {
				t.Fatal("OK analysis with $'…'")
			}
		case *syntax.DblQuoted:
			if n.Dollar {
				t.Fatal(`OK analysis with $"…"`)
			}
			for _, p := range n.Parts {
				if _, ok := p.(*syntax.Lit); !ok {
					t.Fatalf("OK analysis with %T in double quotes", p)
				}
			}
		default:
			t.Fatalf("OK analysis containing %T", n)
		}
		return true
	})
}

// FuzzAnalyzeArgv: argv analysis never panics and stays consistent.
// Arguments are separated by NUL in the fuzz input.
func FuzzAnalyzeArgv(f *testing.F) {
	f.Add("ls\x00-la")
	f.Add("sh\x00-c\x00ls | wc -l")
	f.Add("env\x00-S\x00sh -c id")
	f.Add("\x00  \x00")
	f.Fuzz(func(t *testing.T, in string) {
		a := AnalyzeArgv(strings.Split(in, "\x00"))
		if a.OK != (len(a.Problems) == 0) {
			t.Fatalf("inconsistent: %+v", a)
		}
		if a.OK && (len(a.Segments) == 0 || len(a.Segments[0].Program) == 0) {
			t.Fatalf("OK without a program: %+v", a)
		}
	})
}
