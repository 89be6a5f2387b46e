package approvals

import (
	"encoding/json"
	"os"
	"slices"
	"testing"

	"github.com/execmesh/execmesh/internal/testutil"
)

type shellCase struct {
	Command  string       `json:"command"`
	OK       bool         `json:"ok"`
	Reason   string       `json:"reason"`
	Segments [][]string   `json:"segments"`
	Chains   []any        `json:"chains"`
	Trust    []shellTrust `json:"trust"`
}

type shellTrust struct {
	TrustMode string   `json:"trustMode"`
	Reasons   []string `json:"reasons"`
}

// autoAllowable is OpenClaw's effective verdict for allowlist mode: the plan
// is ok and every segment can be satisfied by the allowlist alone
// (trustMode "executable"; "prompt-only" and "exact-command" segments
// always prompt). Several chains count as not auto-allowable here because
// execmesh never allows chaining (DESIGN.md §7); those cases are listed in
// verdictDifferences with OpenClaw's own "ok".
func (c shellCase) autoAllowable() bool {
	if !c.OK {
		return false
	}
	for _, tr := range c.Trust {
		if tr.TrustMode != "executable" {
			return false
		}
	}
	return true
}

// verdictDifferences are the fixture cases where execmesh's verdict differs
// from OpenClaw 2026.9.6, with the reason execmesh gives ("" = execmesh
// accepts what OpenClaw refuses) and why.
var verdictDifferences = map[string]struct{ reason, why string }{
	"ls && rm -rf /":                           {ReasonChain, "DESIGN §7: chaining is never auto-allowed"},
	"echo a; echo b":                           {ReasonChain, "DESIGN §7: chaining"},
	"echo a || echo b":                         {ReasonChain, "DESIGN §7: chaining"},
	"echo a\necho b":                           {ReasonChain, "DESIGN §7: newline-separated commands are chaining"},
	"echo a\r\necho b":                         {ReasonChain, "DESIGN §7: newline-separated commands are chaining"},
	"[ -f x ] && echo y":                       {ReasonChain, "DESIGN §7: chaining"},
	"git log --oneline | head -n 5 && echo ok": {ReasonChain, "DESIGN §7: chaining"},
	"rg foo src/*.ts | head -n 5 && echo ok":   {ReasonChain, "DESIGN §7: chaining (and a glob)"},
	"/usr/bin/obsidian-cli print-default && /usr/bin/obsidian-cli search foo | /usr/bin/head":                      {ReasonChain, "DESIGN §7: chaining"},
	"/usr/bin/obsidian-cli print-default && /usr/bin/obsidian-cli search foo | /usr/bin/head && /usr/bin/rm -rf /": {ReasonChain, "DESIGN §7: chaining"},
	"echo a |& cat": {ReasonRedirect, "|& redirects stderr into the pipe; redirections are never auto-allowed"},
	"ls *.txt":      {ReasonDynamicArgument, "globs expand at run time; OpenClaw accepts them and renders them quoted, execmesh refuses so the approved text means what it says"},
	"! ls":          {ReasonNegation, "the plan is argv only; negation is shell syntax"},
	"time ls":       {ReasonCompound, "the time keyword is shell syntax; `command time` unwraps GNU time"},
	// execmesh accepts a backslash-newline inside single quotes: it is
	// literal there, and the parser gives the exact argument.
	"echo 'a \\\nb'": {"", "backslash-newline inside single quotes is literal, not a continuation"},
	// What an allowlisted program runs is for the kernel confinement to
	// refuse (DESIGN.md §3.4), not for the analysis to predict: the
	// segment is find, judged by the allowlist; rm runs only if the
	// allowlist allows it too.
	"find . -name '*.go' -exec rm {} \\;": {"", "find -exec: the confinement decides what find may run"},
}

// reasonDifferences are refusals where both agree but name the reason
// differently.
var reasonDifferences = map[string]string{
	"/usr/bin/echo ok &&":             ReasonSyntax,       // OpenClaw: "unable to parse command"
	"cat <<EOF\nline one":             ReasonUnterminated, // OpenClaw: syntax-error
	"echo 'unterminated":              ReasonUnterminated, // OpenClaw: syntax-error
	"echo \"unterminated":             ReasonUnterminated, // OpenClaw: syntax-error
	"sh -c 'echo \"$1\"' sh hello":    ReasonShellWrapper,
	"bash -c 'cat /etc/passwd > out'": ReasonRedirect,
	"bash -c \"$CMD\"":                ReasonDynamicArgument,
}

// segmentDifferences are cases OpenClaw parses whose segments execmesh
// reports differently.
var segmentDifferences = map[string]string{
	"sh -lc 'echo hi'":                "execmesh unwraps sh -lc and reports the payload's commands (OpenClaw keeps the wrapper, so allowlisting sh allows any -lc payload)",
	"sh -c 'echo \"$1\"' sh hello":    "execmesh reports the payload's commands",
	"bash -c 'cat /etc/passwd > out'": "execmesh reports the payload's commands",
	"[ -f x ] && echo y":              "the closing ] is an argument of [; OpenClaw's parser drops it",
	"time ls":                         "the time keyword is not entered",
}

func TestShellAnalysisConformance(t *testing.T) {
	data, err := os.ReadFile(testutil.ConformanceFile(t, "shell_analysis.json"))
	if err != nil {
		t.Fatalf("conformance fixtures missing (testdata/conformance at the module root): %v", err)
	}
	var fx struct {
		Cases []shellCase `json:"cases"`
		Argv  []struct {
			Argv     []string   `json:"argv"`
			OK       bool       `json:"ok"`
			Reason   string     `json:"reason"`
			Segments [][]string `json:"segments"`
		} `json:"argv"`
		SafeBins []struct {
			Input  []string `json:"input"`
			Result []string `json:"result"`
		} `json:"safeBins"`
	}
	if err := json.Unmarshal(data, &fx); err != nil {
		t.Fatal(err)
	}
	if len(fx.Cases) < 90 {
		t.Fatalf("only %d cases", len(fx.Cases))
	}
	seen := map[string]bool{}
	for _, c := range fx.Cases {
		t.Run(c.Command, func(t *testing.T) {
			a := Analyze(c.Command)
			want := c.autoAllowable() && len(c.Chains) == 0
			wantReason := ""
			if d, ok := verdictDifferences[c.Command]; ok {
				seen[c.Command] = true
				want, wantReason = d.reason == "", d.reason
			} else if !c.OK {
				wantReason = c.Reason
				if r, ok := reasonDifferences[c.Command]; ok {
					seen[c.Command] = true
					wantReason = r
				}
			} else if r, ok := reasonDifferences[c.Command]; ok {
				seen[c.Command] = true
				wantReason = r
			}
			if a.OK != want {
				t.Fatalf("OK = %v (%s: %s), OpenClaw auto-allowable = %v", a.OK, a.Reason, a.Detail, want)
			}
			if !a.OK && wantReason != "" && a.Reason != wantReason {
				t.Errorf("reason = %q (%s), want %q", a.Reason, a.Detail, wantReason)
			}
			if !c.OK {
				return
			}
			got := make([][]string, 0, len(a.Segments))
			for _, s := range a.Segments {
				got = append(got, s.Argv)
			}
			same := slices.EqualFunc(got, c.Segments, slices.Equal[[]string])
			if _, listed := segmentDifferences[c.Command]; listed {
				seen[c.Command+"#segments"] = true
				if same {
					t.Errorf("listed as a segment difference but segments agree: %q", got)
				}
				return
			}
			if !same {
				t.Errorf("segments = %q, OpenClaw %q", got, c.Segments)
			}
		})
	}
	for cmd := range verdictDifferences {
		if !seen[cmd] {
			t.Errorf("verdict difference %q is not a fixture case", cmd)
		}
	}
	for cmd := range segmentDifferences {
		if !seen[cmd+"#segments"] {
			t.Errorf("segment difference %q is not a fixture case", cmd)
		}
	}

	for _, c := range fx.Argv {
		a := AnalyzeArgv(c.Argv)
		if a.OK != c.OK || (!c.OK && a.Reason != c.Reason) {
			t.Errorf("AnalyzeArgv(%q) = %v %q, want %v %q", c.Argv, a.OK, a.Reason, c.OK, c.Reason)
		}
		var got [][]string
		for _, s := range a.Segments {
			got = append(got, s.Argv)
		}
		if len(c.Segments) > 0 && !slices.EqualFunc(got, c.Segments, slices.Equal[[]string]) {
			t.Errorf("AnalyzeArgv(%q) segments = %q, want %q", c.Argv, got, c.Segments)
		}
	}
	for _, c := range fx.SafeBins {
		if got := NormalizeSafeBins(c.Input); !slices.Equal(got, c.Result) {
			t.Errorf("NormalizeSafeBins(%q) = %q, want %q", c.Input, got, c.Result)
		}
	}
}
