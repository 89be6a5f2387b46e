package approvals

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"mvdan.cc/sh/v3/syntax"

	"github.com/execmesh/execmesh/protocol"
)

// An approval is bound to the files it is about (OpenClaw's CVE-2026-32978
// class: a script rewritten in place after approval must not run). When a
// command needs approval, Authorize hashes (SHA-256) every executable its
// segments resolve to, the kept wrappers, and every script operand —
// `./tool`, `sh script.sh`, `python3 x.py`, `node a.js`, `awk -f prog`,
// also behind wrappers (`env python3 x.py`, `nice sh x.sh`) — and at spawn
// time hashes them again: a file whose content changed (an in-place
// rewrite keeps its inode, so content is what counts), that appeared or
// disappeared, or a command that now resolves to other files, refuses the
// run with `approval no longer matches: <path> changed`. Nothing else is
// hashed, and nothing at all for commands that need no approval.
//
// A window remains between the check and the exec, as in OpenClaw
// (#124930); it is microseconds instead of the minutes an approval waits.

// ErrBindingChanged is wrapped by the error of a binding that no longer
// matches.
var ErrBindingChanged = errors.New("approval no longer matches")

// ErrUnbindable is wrapped by the error of a command that names a file no
// approval can be bound to: a FIFO, a device or a socket (reading one
// could block or never end), a symbolic link loop, or a file larger than
// maxBoundFileSize. Such a command is denied, not asked about.
var ErrUnbindable = errors.New("exec refused: a file the command runs cannot be bound to an approval")

// Binding is what an approval is bound to: files and their hashes. It
// has the layout of protocol.ApprovalBinding, its wire form: convert with
// (*approvals.Binding)(pb) and (*protocol.ApprovalBinding)(b).
type Binding struct {
	Files []BoundFile `json:"files"`
}

// BoundFile is one file of a Binding (protocol.BoundFile). SHA256 is the
// hex digest of its content, "" for a path that did not exist (it must
// still not exist).
type BoundFile = protocol.BoundFile

// Verify hashes the files again and reports the first that changed, as an
// error wrapping ErrBindingChanged whose text is
// "approval no longer matches: <path> changed".
func (b *Binding) Verify() error {
	if b == nil {
		return nil
	}
	for _, f := range b.Files {
		if sum, err := hashFile(f.Path); err != nil || sum != f.SHA256 {
			return changed(f.Path)
		}
	}
	return nil
}

// Match compares an approval's binding with one computed now for the same
// command (Authorize does this): the same files with the same hashes, or
// the error Verify gives for the first difference. A nil b matches only a
// binding without files.
func (b *Binding) Match(now *Binding) error {
	var was, is []BoundFile
	if b != nil {
		was = b.Files
	}
	if now != nil {
		is = now.Files
	}
	for _, f := range is {
		i := slices.IndexFunc(was, func(w BoundFile) bool { return w.Path == f.Path })
		if i < 0 || was[i].SHA256 != f.SHA256 {
			return changed(f.Path)
		}
	}
	for _, w := range was {
		if !slices.ContainsFunc(is, func(f BoundFile) bool { return f.Path == w.Path }) {
			return changed(w.Path)
		}
	}
	return nil
}

func changed(path string) error {
	return fmt.Errorf("%w: %s changed", ErrBindingChanged, path)
}

// hashFile returns the hex SHA-256 of a regular file's content. It is ""
// when there is no file at path, a directory there, or a file the daemon
// may not read: bound as "", which a later hash of the same matches and a
// readable file does not. Anything else is an error naming what is there
// (openRegular: a FIFO, a device, a socket, a symbolic link loop, a file
// larger than maxBoundFileSize); nothing it opens can block it.
func hashFile(path string) (string, error) {
	f, _, err := openRegular(path, maxBoundFileSize)
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.ENOTDIR), errors.Is(err, errIsDir):
		return "", nil
	case err != nil:
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	// A file that grows while it is hashed stops at the cap.
	n, err := io.Copy(h, io.LimitReader(f, maxBoundFileSize+1))
	if err != nil {
		return "", err
	}
	if n > maxBoundFileSize {
		return "", fmt.Errorf("%s is larger than %d bytes", path, maxBoundFileSize)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// bind computes the binding of an evaluated command. opts are the
// evaluation's options (PATH, Cwd, Home): executables the evaluation did
// not get to (a wrapper behind a refused program, a segment the analyser
// could not follow) are resolved here from the words as written, and so
// is every simple command the analysis does not enter (inside subshells,
// groups, if/for/while/case, functions, command substitutions): an
// approved command runs as written, all of it. A file that cannot be
// bound (hashFile's error) is an error wrapping ErrUnbindable.
func bind(command string, ev Evaluation, opts EvalOptions) (*Binding, error) {
	e := newEvaluator(EvalOptions{PATH: opts.PATH, Home: opts.Home, SafeBins: []string{}})
	var paths []string
	add := func(p string) {
		if p != "" && !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	abs := func(dir, p string) string {
		switch {
		case p == "~" || strings.HasPrefix(p, "~/"):
			if !filepath.IsAbs(opts.Home) {
				return ""
			}
			return filepath.Join(opts.Home, p[1:])
		case filepath.IsAbs(p):
			return filepath.Clean(p)
		case filepath.IsAbs(dir):
			return filepath.Join(dir, p)
		}
		return ""
	}
	bindSeg := func(ps planSeg, resolved string, wrapperPaths []string) {
		prog := texts(ps.program)
		if len(prog) == 0 {
			prog = ps.argv
		}
		if len(prog) == 0 {
			return
		}
		dir := opts.Cwd
		if ps.chdir != nil {
			dir = abs(opts.Cwd, ps.chdir.text)
		}
		exe := resolved
		if exe == "" {
			if p, err := e.resolve(prog[0], dir); err == nil {
				exe = p
			} else if strings.Contains(prog[0], "/") {
				exe = abs(dir, prog[0]) // not there at approval time: it must stay absent
			}
		}
		add(exe)
		// The wrappers the plan drops (env, sh -c, command, …) run too:
		// an approved command runs as written, so they are bound, and a
		// confined run may execute them.
		for _, v := range ps.via {
			if f := strings.Fields(v); len(f) > 0 {
				if p, err := e.resolve(f[0], opts.Cwd); err == nil {
					add(p)
				}
			}
		}
		for j, w := range ps.wrappers {
			if j < len(wrapperPaths) {
				add(wrapperPaths[j])
			} else if len(w) > 0 {
				if p, err := e.resolve(w[0].text, opts.Cwd); err == nil {
					add(p)
				}
			}
		}
		kind := kindName(filepath.Base(prog[0]))
		if exe != "" {
			kind = kindName(filepath.Base(exe))
		}
		for _, s := range scriptOperands(kind, prog) {
			add(abs(dir, s))
		}
	}
	for i, r := range ev.Segments {
		if i < len(ev.Analysis.plan) {
			bindSeg(ev.Analysis.plan[i], r.ResolvedPath, r.WrapperPaths)
		}
	}
	if f, err := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(strings.NewReader(command), ""); err == nil {
		syntax.Walk(f, func(n syntax.Node) bool {
			call, ok := n.(*syntax.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			var a analyzer
			var words []string
			for _, w := range call.Args {
				lw := a.word(w)
				if lw.dynamic {
					break
				}
				words = append(words, lw.text)
			}
			if len(words) > 0 {
				for _, ps := range AnalyzeArgv(words).plan {
					bindSeg(ps, "", nil)
				}
			}
			return true
		})
	}
	b := &Binding{}
	for _, p := range paths {
		sum, err := hashFile(p)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnbindable, err)
		}
		b.Files = append(b.Files, BoundFile{Path: p, SHA256: sum})
	}
	return b, nil
}

// interpreterValueOptions lists, per interpreter kind, the options that take
// the next word as their value, and stopOptions the ones after which the
// program comes from the command line (no script file).
var (
	interpreterValueOptions = map[string][]string{
		"sh":     {"-o", "+o", "-O", "+O", "--rcfile", "--init-file"},
		"python": {"-W", "-X", "-Q"},
		"node":   {"-r", "--require", "--import", "--loader", "--experimental-loader", "-C", "--conditions", "--input-type", "--env-file"},
		"ruby":   {"-I", "-r", "-C", "-E", "--encoding"},
		"perl":   {"-I", "-M", "-m", "-x"},
		"php":    {"-c", "-d", "-z"},
		"lua":    {"-l"},
	}
	stopOptions = map[string][]string{
		"sh":      {"-c", "-s"},
		"python":  {"-c", "-m", "-"},
		"node":    {"-e", "--eval", "-p", "--print", "-"},
		"ruby":    {"-e"},
		"perl":    {"-e", "-E"},
		"php":     {"-r"},
		"lua":     {"-e", "-"},
		"rscript": {"-e"},
	}
)

// interpreterFamily maps an executable kind to the interpreter whose
// command line it takes.
func interpreterFamily(kind string) string {
	switch {
	case isShell(kind) || isOtherShell(kind):
		return "sh"
	case kind == "python" || kind == "pypy" || kind == "pypy3":
		return "python"
	case kind == "node" || kind == "nodejs" || kind == "tsx" || kind == "ts-node" || kind == "bun" || kind == "deno":
		return "node"
	case kind == "ruby" || kind == "perl" || kind == "php" || kind == "rscript" || kind == "tclsh" || kind == "wish" || kind == "expect":
		return kind
	case kind == "lua" || kind == "luajit":
		return "lua"
	}
	return ""
}

// scriptOperands returns the script files a program's command line runs:
// the first operand of an interpreter (after its options), the -f/-E
// program files of awk and the -f script files of sed, the file of
// source and ".". Files it cannot tell apart from data are not included.
func scriptOperands(kind string, argv []string) []string {
	args := argv[1:]
	switch kind {
	case "awk", "gawk", "mawk", "nawk":
		return optionValues(args, "fE", "--file", "--exec")
	case "sed", "gsed":
		return optionValues(args, "f", "--file")
	case "source", ".":
		if len(args) > 0 {
			return args[:1]
		}
		return nil
	}
	fam := interpreterFamily(kind)
	if fam == "" {
		return nil
	}
	if (kind == "deno" || kind == "bun") && len(args) > 0 && (args[0] == "run" || args[0] == "test") {
		args = args[1:]
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			if i+1 < len(args) {
				return args[i+1 : i+2]
			}
			return nil
		case slices.Contains(stopOptions[fam], a):
			return nil
		case fam == "sh" && len(a) > 1 && (a[0] == '-' || a[0] == '+') && !strings.HasPrefix(a, "--"):
			if strings.ContainsAny(a[1:], "cs") && a[0] == '-' {
				return nil
			}
			if strings.ContainsAny(a[1:], "oO") {
				i++
			}
		case slices.Contains(interpreterValueOptions[fam], a):
			i++
		case fam == "php" && a == "-f":
			if i+1 < len(args) {
				return args[i+1 : i+2]
			}
			return nil
		case strings.HasPrefix(a, "-") && a != "-":
			if fam == "python" && a[1] != '-' && a[1] != 'W' && a[1] != 'X' && strings.ContainsAny(a[1:], "cm") {
				return nil // -Bc 'code', -um module
			}
		default:
			return []string{a}
		}
	}
	return nil
}

// optionValues returns the values of a program's file options, written
// as -f FILE, -fFILE, --file FILE or --file=FILE (shorts are the option
// letters, longs the long names), up to "--". A word it cannot read as
// an option is an operand. It binds script files to an approval; nothing
// is allowed on what it finds.
func optionValues(args []string, shorts string, longs ...string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		for _, l := range longs {
			switch {
			case a == l && i+1 < len(args):
				i++
				out = append(out, args[i])
			case strings.HasPrefix(a, l+"="):
				out = append(out, a[len(l)+1:])
			}
		}
		if len(a) < 2 || a[0] != '-' || a[1] == '-' {
			continue
		}
		// A cluster of short options: the first that takes a file ends it.
		for j := 1; j < len(a); j++ {
			if !strings.ContainsRune(shorts, rune(a[j])) {
				continue
			}
			if j+1 < len(a) {
				out = append(out, a[j+1:])
			} else if i+1 < len(args) {
				i++
				out = append(out, args[i])
			}
			break
		}
	}
	return out
}
