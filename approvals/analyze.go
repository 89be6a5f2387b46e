package approvals

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"mvdan.cc/sh/v3/syntax"

	"github.com/execmesh/execmesh/protocol"
)

// MaxWrapperDepth is how many nested wrappers (env, sh -c, nice, timeout,
// busybox, …) the analyser follows. Deeper nesting is refused with
// ReasonWrapperDepth: an attacker gains nothing from depth, and a limit keeps
// analysis and execution from disagreeing about where the unwrapping stops.
const MaxWrapperDepth = 8

// Analysis is the verdict on one command text for allowlist mode.
//
// OK means the text is a single pipeline of simple commands whose every word
// is a literal, with nothing the shell would expand, redirect, chain or run
// in the background, and wrappers that the analyser could follow. OK does not
// mean the command is allowed: Evaluate then resolves the executables and
// matches them against the allowlist and the safe bins.
type Analysis struct {
	// OK reports that no problem was found.
	OK bool
	// Reason is the primary problem's reason (one of the Reason constants),
	// empty when OK.
	Reason string
	// Detail explains Reason for humans (the operator, word or wrapper).
	Detail string
	// Problems lists every problem found, in source order.
	Problems []Problem
	// Segments are the simple commands found, in order. For a pipeline there
	// is one per element; a `sh -c` payload contributes its own segments.
	// When OK is false the list is best effort (compound commands are not
	// entered) and may be empty.
	Segments []Segment

	plan []planSeg // what Evaluate works on, parallel to Segments
}

// Segment is one simple command of an analysed pipeline.
type Segment struct {
	// Argv is the command as written, with quotes and escapes resolved and
	// leading NAME=value assignments removed. Dynamic words are shown as
	// their source text (`$HOME`, `*.txt`).
	Argv []string `json:"argv"`
	// Program is what runs once dispatch wrappers are removed: `env rg -n x`
	// gives ["rg", "-n", "x"]. It is nil when the analyser could not tell.
	Program []string `json:"program,omitempty"`
	// Wrappers are the wrapper invocations that stay in front of Program
	// because they change how it runs (nice -n 5, timeout 10, stdbuf -oL,
	// flock FILE, nohup, time -p, env -i/-u/-C), outermost first.
	Wrappers [][]string `json:"wrappers,omitempty"`
	// Via names every layer that was unwrapped, outermost first ("env",
	// "sh -c", "nice", …).
	Via []string `json:"via,omitempty"`
}

// word is one analysed shell word.
type word struct {
	text    string // value with quotes and escapes resolved; source text for dynamic parts
	tilde   bool   // starts with an unquoted "~" or "~/" that the shell replaces by $HOME
	dynamic bool   // the shell computes part of the value
}

// planSeg is the internal form of a Segment: words keep their tilde flags so
// that Evaluate can expand them with the caller's home directory.
type planSeg struct {
	argv     []string
	via      []string
	wrappers [][]word
	program  []word
	chdir    *word // env -C DIR: the directory the program is resolved in
}

// analyzer collects problems and segments while walking a command. It is
// used once, by one goroutine.
type analyzer struct {
	problems []Problem
	segs     []planSeg
}

// state is the wrapper context a command is analysed in.
type state struct {
	via      []string
	wrappers [][]word
	chdir    *word
	depth    int
}

// nest returns a copy of st one wrapper deeper. Slices are copied so that
// sibling segments never share backing arrays.
func (st state) nest(via string, kept []word) state {
	n := state{
		via:      append(append([]string(nil), st.via...), via),
		wrappers: append([][]word(nil), st.wrappers...),
		chdir:    st.chdir,
		depth:    st.depth + 1,
	}
	if kept != nil {
		n.wrappers = append(n.wrappers, kept)
	}
	return n
}

func (a *analyzer) add(reason, detail string) {
	a.problems = append(a.problems, Problem{Reason: reason, Detail: detail})
}

// Analyze parses command as bash with mvdan.cc/sh and judges whether it can
// be auto-allowed in allowlist mode. It never runs anything.
//
// Refused (each with a Reason): chaining (; && || newlines), redirections,
// heredocs and here-strings, command and process substitution, background
// jobs, subshells, groups, function definitions, if/for/while/until/case,
// negation, time/coproc/arithmetic/[[ ]], assignments, eval/source, state
// changing builtins, privilege tools, command carriers (xargs, find -exec,
// git -c, …), parameter/arithmetic expansion, globs, brace expansion,
// ANSI-C quoting, line continuations, unterminated input and any syntax the
// analyser does not know. Wrappers (env, env -S, sh/bash/… -c, nice, nohup,
// timeout, stdbuf, flock, time, command, exec, busybox/toybox) are unwrapped
// recursively up to MaxWrapperDepth and judged by what they run.
func Analyze(command string) Analysis {
	var a analyzer
	a.source(command, state{})
	return a.result()
}

// AnalyzeArgv judges a command given as an argument vector (no shell
// involved), as a node receives it. Blank entries are dropped, as OpenClaw
// does; nothing left is ReasonEmptyArgv. Wrappers are unwrapped as in
// Analyze, and an `sh -c` payload is analysed as shell text.
func AnalyzeArgv(argv []string) Analysis {
	var a analyzer
	var words []word
	var written []string
	for _, s := range argv {
		if strings.TrimSpace(s) == "" {
			continue
		}
		words = append(words, word{text: s})
		written = append(written, s)
	}
	if len(words) == 0 {
		a.add(ReasonEmptyArgv, "")
		return a.result()
	}
	if strings.ContainsRune(strings.Join(written, ""), 0) {
		a.add(ReasonSyntax, "NUL byte in argv")
		return a.result()
	}
	a.unwrap(written, words, state{})
	return a.result()
}

func (a *analyzer) result() Analysis {
	an := Analysis{Problems: a.problems, plan: a.segs}
	if len(a.problems) == 0 && len(a.segs) == 0 {
		// Defensive: a text that yields no command is never OK.
		a.add(ReasonEmpty, "")
		an.Problems = a.problems
	}
	for _, ps := range a.segs {
		an.Segments = append(an.Segments, ps.export())
		if ps.program == nil && len(an.Problems) == 0 {
			// Defensive: every OK segment must say what it runs.
			an.Problems = append(an.Problems, Problem{ReasonSyntax, "command not determined"})
		}
	}
	if len(an.Problems) == 0 {
		an.OK = true
	} else {
		p := primary(an.Problems)
		an.Reason, an.Detail = p.Reason, p.Detail
	}
	return an
}

func (ps planSeg) export() Segment {
	s := Segment{Argv: ps.argv, Via: ps.via}
	if ps.program != nil {
		s.Program = texts(ps.program)
	}
	for _, w := range ps.wrappers {
		s.Wrappers = append(s.Wrappers, texts(w))
	}
	return s
}

func texts(ws []word) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.text
	}
	return out
}

// source parses and walks one piece of shell text: the command itself or an
// `sh -c` payload.
func (a *analyzer) source(src string, st state) {
	if strings.ContainsRune(src, 0) {
		a.add(ReasonSyntax, "NUL byte")
		return
	}
	if strings.TrimSpace(src) == "" {
		a.add(ReasonEmpty, "")
		return
	}
	f, err := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(strings.NewReader(src), "")
	if err != nil {
		a.add(parseErrorReason(err), err.Error())
		return
	}
	if len(f.Stmts) == 0 {
		a.add(ReasonEmpty, "")
		return
	}
	for _, s := range f.Stmts {
		a.stmt(s, st)
	}
	if len(f.Stmts) > 1 {
		a.add(ReasonChain, "; or newline between commands")
	}
	a.continuations(src, f)
}

// parseErrorReason tells input that ends inside a quote or a heredoc
// (ReasonUnterminated) from other parse errors, including input that merely
// ends after an operator such as `ls &&` (ReasonSyntax). mvdan.cc/sh has no
// error kinds for these, so its message is consulted; either way the
// command is refused, only the reason differs.
func parseErrorReason(err error) string {
	var perr syntax.ParseError
	if errors.As(err, &perr) && (strings.Contains(perr.Text, "quote") || strings.Contains(perr.Text, "here-document")) {
		return ReasonUnterminated
	}
	return ReasonSyntax
}

// continuations refuses backslash-newline outside single quotes. Bash splices
// them before tokenising, also inside double quotes after a `$`, where
// mvdan.cc/sh keeps them literal: `"$\<LF>(id)"` is a command substitution to
// bash and a plain string to the parser. Refusing them all keeps the analysis
// and the shell in agreement.
func (a *analyzer) continuations(src string, f *syntax.File) {
	type span struct{ from, to int }
	var quoted []span
	syntax.Walk(f, func(n syntax.Node) bool {
		if q, ok := n.(*syntax.SglQuoted); ok {
			quoted = append(quoted, span{int(q.Left.Offset()), int(q.Right.Offset())})
		}
		return true
	})
	slices.SortFunc(quoted, func(x, y span) int { return x.from - y.from })
	next := 0 // first span that may still contain or follow i
	for i := 0; i < len(src)-1; i++ {
		for next < len(quoted) && quoted[next].to <= i {
			next++
		}
		if src[i] != '\\' || (next < len(quoted) && quoted[next].from < i) {
			continue
		}
		c := src[i+1]
		if c == '\n' || (c == '\r' && i+2 < len(src) && src[i+2] == '\n') {
			a.add(ReasonLineContinuation, "backslash-newline")
			return
		}
		i++ // the escaped character cannot start another escape
	}
}

// stmt walks one statement. The type switch refuses every command kind except
// simple commands and pipes; its default refuses whatever mvdan.cc/sh may add.
func (a *analyzer) stmt(s *syntax.Stmt, st state) {
	if s.Negated {
		a.add(ReasonNegation, "!")
	}
	if s.Background {
		a.add(ReasonBackground, "&")
	}
	if s.Coprocess {
		a.add(ReasonBackground, "|&")
	}
	if s.Disown {
		a.add(ReasonBackground, "disown")
	}
	for _, r := range s.Redirs {
		a.redirect(r)
	}
	switch c := s.Cmd.(type) {
	case nil:
		if len(s.Redirs) == 0 {
			a.add(ReasonSyntax, "empty statement")
		}
	case *syntax.CallExpr:
		a.call(c, st)
	case *syntax.BinaryCmd:
		switch c.Op {
		case syntax.Pipe:
		case syntax.PipeAll:
			a.add(ReasonRedirect, "|& (stderr into the pipe)")
		case syntax.AndStmt, syntax.OrStmt:
			// Reported after the operands so that a subshell or background
			// job inside wins, as it does in OpenClaw.
			defer a.add(ReasonChain, c.Op.String())
		default:
			a.add(ReasonSyntax, "operator "+c.Op.String())
		}
		a.stmt(c.X, st)
		a.stmt(c.Y, st)
	case *syntax.Subshell:
		a.add(ReasonSubshell, "( … )")
	case *syntax.Block:
		a.add(ReasonGroup, "{ …; }")
	case *syntax.IfClause:
		a.add(ReasonIf, "")
	case *syntax.WhileClause:
		if c.Until {
			a.add(ReasonUntil, "")
		} else {
			a.add(ReasonWhile, "")
		}
	case *syntax.ForClause:
		a.add(ReasonFor, "")
	case *syntax.CaseClause:
		a.add(ReasonCase, "")
	case *syntax.FuncDecl:
		a.add(ReasonFunctionDefinition, "")
	case *syntax.TimeClause:
		a.add(ReasonCompound, "time")
	case *syntax.CoprocClause:
		a.add(ReasonBackground, "coproc")
	case *syntax.ArithmCmd:
		a.add(ReasonCompound, "(( ))")
	case *syntax.LetClause:
		a.add(ReasonCompound, "let")
	case *syntax.TestClause:
		a.add(ReasonCompound, "[[ ]]")
	case *syntax.DeclClause:
		a.add(ReasonBuiltin, c.Variant.Value)
	default:
		a.add(ReasonSyntax, fmt.Sprintf("unsupported command %T", c))
	}
}

func (a *analyzer) redirect(r *syntax.Redirect) {
	switch r.Op {
	case syntax.Hdoc, syntax.DashHdoc:
		a.add(ReasonHeredoc, r.Op.String())
		// The body is not analysed: the heredoc is refused anyway, and its
		// text is data, not arguments.
		return
	case syntax.WordHdoc:
		a.add(ReasonHereString, r.Op.String())
	default:
		detail := r.Op.String()
		if r.N != nil {
			detail = r.N.Value + detail
		}
		if r.Word != nil {
			detail += printNode(r.Word)
		}
		a.add(ReasonRedirect, detail)
	}
	if r.Word != nil {
		a.word(r.Word) // records substitutions in the target
	}
}

func (a *analyzer) call(c *syntax.CallExpr, st state) {
	for _, as := range c.Assigns {
		detail := "assignment"
		if as.Name != nil {
			detail = assignmentDetail(as.Name.Value)
		}
		a.add(ReasonAssignment, detail)
		if as.Value != nil {
			a.word(as.Value)
		}
	}
	if len(c.Args) == 0 {
		return // a bare assignment: reported above, runs nothing
	}
	words := make([]word, len(c.Args))
	written := make([]string, len(c.Args))
	for i, w := range c.Args {
		words[i] = a.word(w)
		written[i] = words[i].text
	}
	if words[0].dynamic {
		a.add(ReasonDynamicExecutable, words[0].text)
	}
	a.unwrap(written, words, st)
}

// assignmentDetail names an assigned variable, marking the keys the host
// environment policy blocks for requests (PATH, LD_*, BASH_ENV, IFS, …).
// Every assignment is refused anyway: the environment of an auto-allowed
// command never comes from its text.
func assignmentDetail(name string) string {
	if strings.EqualFold(strings.TrimSpace(name), "PATH") ||
		protocol.IsDangerousHostEnvVarName(name) || protocol.IsDangerousHostEnvOverrideVarName(name) ||
		protocol.IsExecmeshBlockedOverrideVarName(name) {
		return name + "= (blocked host env key)"
	}
	return name + "="
}

// word resolves quotes and escapes of one shell word and reports every part
// whose value the shell computes at run time.
func (a *analyzer) word(w *syntax.Word) word {
	var text strings.Builder
	// shape holds the word's unquoted, unescaped characters verbatim and a
	// placeholder for everything quoted, so that globs and brace expansion
	// are found across parts (`{a,"b"}` expands, `"{a,b}"` does not).
	var shape strings.Builder
	res := word{}
	dyn := func(reason string, n syntax.Node) {
		s := printNode(n)
		a.add(reason, s)
		text.WriteString(s)
		shape.WriteByte('a')
		res.dynamic = true
	}
	for i, part := range w.Parts {
		switch p := part.(type) {
		case *syntax.Lit:
			v := p.Value
			if i == 0 && strings.HasPrefix(v, "~") {
				switch {
				case (v == "~" && len(w.Parts) == 1) || strings.HasPrefix(v, "~/"):
					res.tilde = true
				default:
					// ~user, ~+, ~-, or a tilde-prefix that continues in
					// quotes: the shell decides.
					a.add(ReasonDynamicArgument, "tilde expansion "+v)
					res.dynamic = true
				}
			}
			for j := 0; j < len(v); j++ {
				if v[j] == '\\' && j+1 < len(v) {
					j++
					text.WriteByte(v[j])
					shape.WriteByte('a')
					continue
				}
				text.WriteByte(v[j])
				shape.WriteByte(v[j])
			}
		case *syntax.SglQuoted:
			if p.Dollar {
				dyn(ReasonDynamicArgument, p) // $'…' has its own escape language
				continue
			}
			text.WriteString(p.Value)
			shape.WriteByte('a')
		case *syntax.DblQuoted:
			if p.Dollar {
				dyn(ReasonDynamicArgument, p) // $"…" is translated at run time
				continue
			}
			for _, ip := range p.Parts {
				switch q := ip.(type) {
				case *syntax.Lit:
					text.WriteString(unescapeDouble(q.Value))
					shape.WriteByte('a')
				case *syntax.CmdSubst:
					dyn(ReasonCommandSubstitution, q)
				case *syntax.ParamExp, *syntax.ArithmExp:
					dyn(ReasonDynamicArgument, q)
				default:
					dyn(ReasonSyntax, q)
				}
			}
		case *syntax.CmdSubst:
			dyn(ReasonCommandSubstitution, p)
		case *syntax.ProcSubst:
			dyn(ReasonProcessSubstitution, p)
		case *syntax.ParamExp, *syntax.ArithmExp, *syntax.ExtGlob, *syntax.BraceExp:
			dyn(ReasonDynamicArgument, p)
		default:
			dyn(ReasonSyntax, p)
		}
	}
	res.text = text.String()
	if why := expands(shape.String()); why != "" {
		a.add(ReasonDynamicArgument, why+" "+res.text)
		res.dynamic = true
	}
	return res
}

// expands reports whether the unquoted characters of a word make the shell
// expand it: pathname globs, brace expansion, or a tilde in an
// assignment-like word (bash expands `a=~/x` even as an argument).
func expands(shape string) string {
	if strings.ContainsAny(shape, "*?") {
		return "glob"
	}
	if i := strings.IndexByte(shape, '['); i >= 0 && strings.IndexByte(shape[i+1:], ']') >= 0 {
		return "glob"
	}
	// Brace expansion needs a "{", then "," or "..", then "}". Checking for
	// that sequence anywhere in the word is linear and only ever stricter
	// than bash's matching of brace pairs.
	if open := strings.IndexByte(shape, '{'); open >= 0 {
		rest := shape[open+1:]
		if sep := strings.IndexByte(rest, ','); sep >= 0 && strings.IndexByte(rest[sep:], '}') >= 0 {
			return "brace expansion"
		}
		if sep := strings.Index(rest, ".."); sep >= 0 && strings.IndexByte(rest[sep:], '}') >= 0 {
			return "brace expansion"
		}
	}
	if m := reAssignLike.FindStringSubmatch(shape); m != nil {
		if strings.HasPrefix(m[1], "~") || strings.Contains(m[1], ":~") {
			return "tilde expansion"
		}
	}
	return ""
}

// reAssignLike matches words bash treats like assignments even as
// arguments, expanding a tilde after the "=" or a ":" (`a=~/x`, `p=a:~/b`).
var reAssignLike = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=(.*)$`)

// unescapeDouble resolves the backslash escapes bash honours inside double
// quotes: \$ \` \" \\ and backslash-newline. Other backslashes stay.
func unescapeDouble(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			switch s[i+1] {
			case '$', '`', '"', '\\':
				b.WriteByte(s[i+1])
				i++
				continue
			case '\n':
				i++
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// printNode renders a syntax node as shell source, for details and for the
// display form of dynamic words.
func printNode(n syntax.Node) string {
	var b strings.Builder
	if err := syntax.NewPrinter().Print(&b, n); err != nil {
		return fmt.Sprintf("%T", n)
	}
	return b.String()
}
