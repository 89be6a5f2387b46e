package approvals

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// EvalOptions is the host context a command is evaluated in.
type EvalOptions struct {
	// Cwd is the absolute working directory the command runs in; relative
	// executable paths are resolved against it (none resolve when empty).
	Cwd string
	// PATH is the search path for bare command names. Empty and relative
	// entries ("", ".") are skipped: they depend on the working directory,
	// where a file named like an allowlisted tool could be planted.
	PATH string
	// Home expands "~" in commands and patterns; it must be absolute.
	Home string
	// Allowlist is the effective allowlist (Policy.Allowlist).
	Allowlist []Entry
	// SafeBins are the stdin-only programs allowed without an allowlist
	// entry (tools.exec.safeBins); nil means DefaultSafeBins. Names are
	// normalised with NormalizeSafeBins.
	SafeBins []string
	// SafeBinProfiles adds or replaces per-program profiles
	// (tools.exec.safeBinProfiles). Interpreters, shells and wrappers can
	// never be safe bins, whatever is configured.
	SafeBinProfiles map[string]SafeBinProfile
	// TrustedDirs are directories, besides DefaultTrustedDirs, where safe
	// bins and kept wrappers (nice, timeout, …) may live
	// (tools.exec.safeBinTrustedDirs).
	TrustedDirs []string
	// PTY says the command runs in a terminal, where pagers without a
	// secure mode (more, pg, most) offer a shell escape.
	PTY bool
}

// Evaluation is the allowlist verdict on a command, with the execution plan
// when the command can be auto-allowed.
type Evaluation struct {
	// Analysis is the syntactic verdict the evaluation started from.
	Analysis Analysis
	// AnalysisOK is Analysis.OK.
	AnalysisOK bool
	// Satisfied reports that the analysis is OK and every segment is
	// satisfied by the allowlist or as a safe bin.
	Satisfied bool
	// Reason and Detail explain why the command is not satisfied: the
	// analysis reason, else the first unsatisfied segment's. Empty when
	// Satisfied.
	Reason, Detail string
	// Segments are the per-segment results, parallel to Analysis.Segments.
	Segments []SegmentResult
	// Argv is the execution plan when Satisfied: one argument vector per
	// pipeline segment, each starting with the real absolute path of its
	// (first kept wrapper or) program. What was evaluated is what runs: no
	// shell sees the original text again.
	Argv [][]string
	// Rendered is Argv as one shell command: every word single-quoted,
	// segments joined with " | ". Empty unless Satisfied.
	Rendered string
}

// Satisfaction sources reported in SegmentResult.SatisfiedBy.
const (
	ByAllowlist = "allowlist"
	BySafeBin   = "safe-bin"
)

// SegmentResult is the evaluation of one segment.
type SegmentResult struct {
	Segment
	// ResolvedPath is the real path (symbolic links resolved) of Program[0],
	// "" when it does not resolve.
	ResolvedPath string `json:"resolvedPath,omitempty"`
	// WrapperPaths are the real paths of Wrappers, in order.
	WrapperPaths []string `json:"wrapperPaths,omitempty"`
	// SatisfiedBy is ByAllowlist, BySafeBin or "" when not satisfied.
	SatisfiedBy string `json:"satisfiedBy,omitempty"`
	// EntryID and Pattern identify the matching allowlist entry.
	EntryID string `json:"entryId,omitempty"`
	Pattern string `json:"pattern,omitempty"`
	// Reason and Detail say why the segment is not satisfied.
	Reason string `json:"reason,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Argv is the segment's planned argument vector (wrappers and program
	// with real paths and ~ expanded), set when the segment is satisfied.
	Argv []string `json:"execArgv,omitempty"`
}

// Evaluate analyses command and evaluates it against the allowlist and safe
// bins: Analyze(command).Evaluate(opts).
func Evaluate(command string, opts EvalOptions) Evaluation {
	return Analyze(command).Evaluate(opts)
}

// Evaluate resolves every segment's executable and matches it. Matching is
// on real paths only:
//
//   - "~" is expanded from opts.Home; a name containing "/" is resolved
//     against opts.Cwd; a bare name is searched in the absolute entries of
//     opts.PATH. The result must be an existing executable regular file.
//   - Symbolic links are resolved with filepath.EvalSymlinks and only the
//     real path is matched and executed. A link named like an allowlisted
//     binary does not match by its name, and a link inside an allowlisted
//     directory does not let a target outside it run. (Links in a pattern's
//     directory part are resolved, so /bin/* covers a merged /usr/bin.)
//   - An executable that really is a shell, a dispatch wrapper, a command
//     carrier or a privilege tool never satisfies a segment, whatever it is
//     called and whatever pattern matches it.
//   - Kept wrappers must resolve to that very tool in a trusted directory
//     or to an allowlisted path.
func (an Analysis) Evaluate(opts EvalOptions) Evaluation {
	e := newEvaluator(opts)
	ev := Evaluation{Analysis: an, AnalysisOK: an.OK}
	satisfied := an.OK && len(an.plan) > 0
	for _, ps := range an.plan {
		r := e.segment(ps)
		ev.Segments = append(ev.Segments, r)
		if r.SatisfiedBy == "" {
			satisfied = false
			if an.OK && ev.Reason == "" {
				ev.Reason, ev.Detail = r.Reason, r.Detail
			}
		}
	}
	if !an.OK {
		ev.Reason, ev.Detail = an.Reason, an.Detail
	}
	if satisfied {
		ev.Satisfied = true
		for _, r := range ev.Segments {
			ev.Argv = append(ev.Argv, r.Argv)
		}
		ev.Rendered = Render(ev.Argv)
	}
	return ev
}

// AllowAlwaysPaths returns the real paths an "allow-always" decision may
// persist for this command: the resolved program of every segment, never a
// shell, wrapper, carrier or privilege tool (those are unwrapped, or nothing
// is persisted for them). Duplicates are removed.
func (ev Evaluation) AllowAlwaysPaths() []string {
	var out []string
	for _, r := range ev.Segments {
		if r.ResolvedPath == "" || unsafeKind(filepath.Base(r.ResolvedPath)) != "" {
			continue
		}
		if !slices.Contains(out, r.ResolvedPath) {
			out = append(out, r.ResolvedPath)
		}
	}
	return out
}

// evaluator holds what one Evaluate call needs, compiled once.
type evaluator struct {
	opts     EvalOptions
	patterns []pattern
	trusted  map[string]bool
	safeBins []string
}

func newEvaluator(opts EvalOptions) *evaluator {
	e := &evaluator{opts: opts, trusted: map[string]bool{}}
	for _, en := range opts.Allowlist {
		if p, ok := compilePattern(en, opts.Home); ok {
			e.patterns = append(e.patterns, p)
		}
	}
	for _, d := range append(DefaultTrustedDirs(), opts.TrustedDirs...) {
		if !filepath.IsAbs(d) {
			continue
		}
		d = filepath.Clean(d)
		e.trusted[d] = true
		if real, err := filepath.EvalSymlinks(d); err == nil {
			e.trusted[real] = true
		}
	}
	if opts.SafeBins == nil {
		e.safeBins = DefaultSafeBins()
	} else {
		e.safeBins = NormalizeSafeBins(opts.SafeBins)
	}
	return e
}

func (e *evaluator) match(realPath string) (pattern, bool) {
	for _, p := range e.patterns {
		if p.match(realPath) {
			return p, true
		}
	}
	return pattern{}, false
}

// expand returns the words' values with a leading "~" replaced by the home
// directory. Dynamic words cannot be planned.
func (e *evaluator) expand(ws []word) ([]string, error) {
	out := make([]string, len(ws))
	for i, w := range ws {
		if w.dynamic {
			return nil, fmt.Errorf("%s is computed by the shell", w.text)
		}
		out[i] = w.text
		if w.tilde {
			if !filepath.IsAbs(e.opts.Home) {
				return nil, errors.New("~ needs an absolute home directory")
			}
			out[i] = strings.TrimSuffix(e.opts.Home, "/") + w.text[1:]
		}
	}
	return out, nil
}

func (e *evaluator) segment(ps planSeg) SegmentResult {
	r := SegmentResult{Segment: ps.export()}
	fail := func(reason, detail string) SegmentResult {
		r.SatisfiedBy, r.Reason, r.Detail = "", reason, detail
		return r
	}
	if len(ps.program) == 0 {
		return fail(ReasonUnresolved, "the command could not be determined")
	}
	args, err := e.expand(ps.program)
	if err != nil {
		return fail(ReasonDynamicArgument, err.Error())
	}
	cwd := e.opts.Cwd
	if ps.chdir != nil {
		d, err := e.expand([]word{*ps.chdir})
		if err != nil {
			return fail(ReasonDynamicArgument, err.Error())
		}
		switch {
		case filepath.IsAbs(d[0]):
			cwd = d[0]
		case filepath.IsAbs(cwd):
			cwd = filepath.Join(cwd, d[0])
		default:
			cwd = ""
		}
	}
	path, err := e.resolve(args[0], cwd)
	if err != nil {
		return fail(ReasonUnresolved, err.Error())
	}
	r.ResolvedPath = path
	if kind := unsafeKind(filepath.Base(path)); kind != "" {
		return fail(ReasonUnsafeExecutable, fmt.Sprintf("%s resolves to %s, a %s", args[0], path, kind))
	}

	var plan []string
	for _, w := range ps.wrappers {
		wargs, err := e.expand(w)
		if err != nil {
			return fail(ReasonDynamicArgument, err.Error())
		}
		want := commandName(w[0])
		if strings.Contains(wargs[0], "/") && !filepath.IsAbs(wargs[0]) {
			// A relative wrapper path would be resolved in a directory the
			// command itself may change (env -C); refuse rather than guess.
			return fail(ReasonUntrustedWrapper, wargs[0]+" is a relative path")
		}
		wpath, err := e.resolve(wargs[0], e.opts.Cwd)
		if err != nil {
			return fail(ReasonUntrustedWrapper, err.Error())
		}
		r.WrapperPaths = append(r.WrapperPaths, wpath)
		if kindName(filepath.Base(wpath)) != want {
			return fail(ReasonUntrustedWrapper, fmt.Sprintf("%s resolves to %s, not %s", wargs[0], wpath, want))
		}
		if _, ok := e.match(wpath); !ok && !e.trusted[filepath.Dir(wpath)] {
			return fail(ReasonUntrustedWrapper, wpath+" is neither in a trusted directory nor allowlisted")
		}
		plan = append(append(plan, wpath), wargs[1:]...)
	}

	if p, ok := e.match(path); ok {
		r.SatisfiedBy, r.EntryID, r.Pattern = ByAllowlist, p.entry.ID, p.entry.Pattern
	} else if detail, isSafeBin := e.safeBinCheck(path, args[1:]); isSafeBin {
		if detail != "" {
			return fail(ReasonSafeBin, detail)
		}
		r.SatisfiedBy = BySafeBin
	} else {
		return fail(ReasonAllowlistMiss, path)
	}
	r.Argv = append(append(plan, path), args[1:]...)
	return r
}

// resolve finds the real path of an executable named tok.
func (e *evaluator) resolve(tok, cwd string) (string, error) {
	if tok == "" {
		return "", errors.New("empty command name")
	}
	if strings.Contains(tok, "/") {
		p := tok
		if !filepath.IsAbs(p) {
			if !filepath.IsAbs(cwd) {
				return "", fmt.Errorf("%s: relative path without an absolute workdir", tok)
			}
			p = filepath.Join(cwd, p)
		}
		return realExecutable(p)
	}
	for _, dir := range filepath.SplitList(e.opts.PATH) {
		if !filepath.IsAbs(dir) {
			continue
		}
		if p, err := realExecutable(filepath.Join(dir, tok)); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found on PATH", tok)
}

// realExecutable returns the real path of p if it is an executable regular
// file.
func realExecutable(p string) (string, error) {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", p)
	}
	if fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("%s is not executable", p)
	}
	return real, nil
}
