package approvals

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Repository configuration is the hard part of git as a carrier: a file
// written by one allowed command can turn a later allowed git command
// into any command (`[alias] st = !cmd` does not shadow the builtin status,
// but `[core] fsmonitor = cmd` runs at every git status, `[diff]
// external = cmd` at every git diff, `[filter "x"] smudge = cmd` at every
// checkout). So before git is auto-allowed, the configuration of the
// repository it would use is read as git reads it — the repository found
// from the working directory (after -C) the way git discovers it (a .git
// directory or gitfile, or a bare repository), or --git-dir; its config,
// config.worktree and the common directory's, and every include.path and
// includeIf.*.path they name — and a key that names a command, a program
// or helper git runs, or that moves where git finds hooks or its work
// tree, refuses the auto-allow (gitConfigKeyRisk). The system and global
// configuration are the operator's own and are trusted.
//
// Hooks are files, not configuration: AllowlistEnv runs every git under
// allowlist with core.hooksPath=/dev/null and core.fsmonitor=false (git's
// command-line scope, which beats the repository's), so planted hooks
// never run either.

// maxGitConfigSize bounds a configuration file the checker reads; git
// refuses nothing this large in practice, and the checker refuses it.
const maxGitConfigSize = 1 << 20

// maxGitIncludeDepth is git's own limit on nested includes.
const maxGitIncludeDepth = 10

// gitRepoRisk returns why the repository configuration a git command
// would read can make it run a program, or "".
func gitRepoRisk(argv []string, cwd, home string) string {
	inv, why := parseGitGlobal(argv)
	if why != "" {
		return why
	}
	if !filepath.IsAbs(cwd) {
		return "git without an absolute workdir: its repository cannot be checked"
	}
	dir := cwd
	for _, d := range inv.dirs {
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		dir = d
	}
	gitDir := inv.gitDir
	switch {
	case gitDir != "" && !filepath.IsAbs(gitDir):
		gitDir = filepath.Join(dir, gitDir)
	case gitDir == "":
		var err error
		if gitDir, err = discoverGitDir(dir); err != nil {
			return err.Error()
		}
		if gitDir == "" {
			return "" // not in a repository
		}
	}
	files := []string{filepath.Join(gitDir, "config"), filepath.Join(gitDir, "config.worktree")}
	if b, err := readSmall(filepath.Join(gitDir, "commondir")); err == nil {
		common := strings.TrimSpace(string(b))
		if !filepath.IsAbs(common) {
			common = filepath.Join(gitDir, common)
		}
		files = append(files, filepath.Join(common, "config"), filepath.Join(common, "config.worktree"))
	}
	for _, f := range files {
		if why := gitConfigFileRisk(f, home, 0); why != "" {
			return why
		}
	}
	return ""
}

// discoverGitDir finds the git directory for dir as git does: in dir and
// each parent, a .git directory, a .git file naming one ("gitdir: …"), or
// the directory itself when it is a bare repository. "" when there is
// none. (GIT_CEILING_DIRECTORIES and file system boundaries are not
// honoured: going further up can only find more to check.)
func discoverGitDir(dir string) (string, error) {
	for d := filepath.Clean(dir); ; {
		dotgit := filepath.Join(d, ".git")
		if fi, err := os.Stat(dotgit); err == nil {
			switch {
			case fi.IsDir():
				return dotgit, nil
			case fi.Mode().IsRegular():
				b, err := readSmall(dotgit)
				if err != nil {
					return "", fmt.Errorf("git: %s cannot be read: %v", dotgit, err)
				}
				line, _, _ := strings.Cut(string(b), "\n")
				target, ok := strings.CutPrefix(strings.TrimSpace(line), "gitdir:")
				if !ok {
					return "", fmt.Errorf("git: %s is not a gitfile", dotgit)
				}
				target = strings.TrimSpace(target)
				if !filepath.IsAbs(target) {
					target = filepath.Join(d, target)
				}
				return target, nil
			}
		}
		if isBareGitDir(d) {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", nil
		}
		d = parent
	}
}

func isBareGitDir(d string) bool {
	head, err := os.Stat(filepath.Join(d, "HEAD"))
	if err != nil || !head.Mode().IsRegular() {
		return false
	}
	for _, sub := range []string{"objects", "refs"} {
		if fi, err := os.Stat(filepath.Join(d, sub)); err != nil || !fi.IsDir() {
			return false
		}
	}
	return true
}

// readSmall reads a git file of the request's workdir (a .git file, a
// config, commondir) through readRegular: never blocked by a FIFO or a
// device put there, at most maxGitConfigSize bytes.
func readSmall(path string) ([]byte, error) {
	return readRegular(path, maxGitConfigSize)
}

// gitConfigFileRisk checks one configuration file and its includes. A file
// that does not exist is fine (git skips it); one that cannot be read or
// parsed is refused (git would stop, but the checker cannot tell what it
// says).
func gitConfigFileRisk(path, home string, depth int) string {
	if depth > maxGitIncludeDepth {
		return "git config includes nest deeper than " + fmt.Sprint(maxGitIncludeDepth)
	}
	b, err := readSmall(path)
	if errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	if err != nil {
		return fmt.Sprintf("git config %s cannot be read: %v", path, err)
	}
	entries, err := parseGitConfig(b)
	if err != nil {
		return fmt.Sprintf("git config %s cannot be parsed: %v", path, err)
	}
	for _, e := range entries {
		if (e.section == "include" || e.section == "includeif") && e.key == "path" {
			inc := e.value
			switch {
			case inc == "":
				continue
			case inc == "~" || strings.HasPrefix(inc, "~/"):
				if !filepath.IsAbs(home) {
					return "git config " + path + " includes " + inc + " without a home directory"
				}
				inc = filepath.Join(home, inc[1:])
			case !filepath.IsAbs(inc):
				inc = filepath.Join(filepath.Dir(path), inc)
			}
			if why := gitConfigFileRisk(inc, home, depth+1); why != "" {
				return why
			}
			continue
		}
		if why := gitConfigKeyRisk(e); why != "" {
			return fmt.Sprintf("repository config %s sets %s: %s", path, e.name(), why)
		}
	}
	return ""
}

// gitConfigEntry is one variable of a git configuration file: section and
// key lower-cased, the subsection as written.
type gitConfigEntry struct {
	section, subsection, key, value string
}

func (e gitConfigEntry) name() string {
	if e.subsection != "" {
		return e.section + "." + e.subsection + "." + e.key
	}
	return e.section + "." + e.key
}

// gitConfigKeyRisk says why a configuration variable makes git run a
// program or move where it finds hooks or its work tree (git-config(1)):
// values that are commands, programs or helpers; URL rewrites and
// remotes that select a remote-helper transport; "!" submodule updates;
// protocol allowances that enable such transports.
func gitConfigKeyRisk(e gitConfigEntry) string {
	s, u, k := e.section, e.subsection, e.key
	switch s {
	case "alias":
		return "an alias can run a shell command"
	case "core":
		switch k {
		case "pager", "editor", "askpass", "sshcommand", "gitproxy", "fsmonitor", "alternaterefscommand":
			return "names a command git runs"
		case "hookspath":
			return "moves where git finds hooks"
		case "worktree":
			return "moves the work tree"
		}
	case "pager", "interactive":
		if s == "pager" || k == "difffilter" {
			return "names a command git runs"
		}
	case "sequence":
		if k == "editor" {
			return "names a command git runs"
		}
	case "diff":
		if u == "" && k == "external" || u != "" && (k == "command" || k == "textconv") {
			return "names a command git runs"
		}
	case "difftool", "mergetool", "browser", "man":
		if k == "cmd" || k == "path" || s == "man" && k == "viewer" {
			return "names a program git runs"
		}
	case "merge":
		if u != "" && k == "driver" {
			return "names a command git runs"
		}
	case "filter":
		if u != "" && (k == "clean" || k == "smudge" || k == "process") {
			return "names a command git runs"
		}
	case "credential":
		if k == "helper" {
			return "names a helper git runs"
		}
	case "gpg":
		if k == "program" || k == "defaultkeycommand" {
			return "names a program git runs"
		}
	case "web", "help":
		if k == "browser" {
			return "names a program git runs"
		}
	case "remote":
		switch k {
		case "uploadpack", "receivepack", "vcs", "proxy":
			return "names a program or helper git runs"
		case "url", "pushurl":
			if isHelperURL(e.value) {
				return "a remote-helper transport runs a program"
			}
		}
	case "url":
		if isHelperURL(u) {
			return "rewrites URLs to a remote-helper transport, which runs a program"
		}
	case "submodule":
		if k == "update" && strings.HasPrefix(strings.TrimSpace(e.value), "!") {
			return "runs a command on submodule update"
		}
	case "protocol":
		if k == "allow" && strings.EqualFold(strings.TrimSpace(e.value), "always") {
			return "allows every transport, remote helpers included"
		}
	case "uploadpack":
		if k == "packobjectshook" {
			return "names a command git runs"
		}
	case "init":
		if k == "templatedir" {
			return "copies hooks from a directory"
		}
	case "imap":
		if k == "tunnel" {
			return "names a command git runs"
		}
	case "hook":
		return "configures a hook command"
	case "trace2":
		return "writes trace files"
	case "sendemail":
		return "names programs git send-email runs"
	}
	return ""
}

// isHelperURL reports a <helper>::<address> URL (git-remote-<helper>).
func isHelperURL(v string) bool {
	scheme, _, ok := strings.Cut(strings.TrimSpace(v), "::")
	return ok && isTransportName(scheme)
}

// parseGitConfig parses git's configuration syntax: [section],
// [section "subsection"] and the old [section.subsection] headers,
// name = value lines (a bare name is true), quotes, the escapes \" \\ \n
// \t \b, backslash-newline continuations and # or ; comments. It is
// strict: anything git would reject is an error.
func parseGitConfig(b []byte) ([]gitConfigEntry, error) {
	var out []gitConfigEntry
	var section, sub string
	r := bufio.NewReader(bytes.NewReader(bytes.TrimPrefix(b, []byte("\xef\xbb\xbf"))))
	line := 0
	next := func() ([]byte, bool) {
		l, err := r.ReadBytes('\n')
		if len(l) == 0 && err != nil {
			return nil, false
		}
		line++
		return l, true
	}
	for {
		l, ok := next()
		if !ok {
			return out, nil
		}
		t := bytes.TrimLeft(l, " \t\r\n")
		if len(t) == 0 || t[0] == '#' || t[0] == ';' {
			continue
		}
		if t[0] == '[' {
			var err error
			section, sub, t, err = parseGitSection(t)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			t = bytes.TrimLeft(t, " \t\r\n")
			if len(t) == 0 || t[0] == '#' || t[0] == ';' {
				continue
			}
		}
		if section == "" {
			return nil, fmt.Errorf("line %d: variable outside a section", line)
		}
		i := 0
		for i < len(t) && (t[i] == '-' || t[i] >= '0' && t[i] <= '9' || t[i] >= 'a' && t[i] <= 'z' || t[i] >= 'A' && t[i] <= 'Z') {
			i++
		}
		if i == 0 || !(t[0] >= 'a' && t[0] <= 'z' || t[0] >= 'A' && t[0] <= 'Z') {
			return nil, fmt.Errorf("line %d: bad variable name", line)
		}
		e := gitConfigEntry{section: section, subsection: sub, key: strings.ToLower(string(t[:i]))}
		v := bytes.TrimLeft(t[i:], " \t")
		switch {
		case len(v) == 0 || v[0] == '\n' || v[0] == '\r' || v[0] == '#' || v[0] == ';':
			e.value = "true"
		case v[0] == '=':
			val, err := parseGitValue(v[1:], next)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			e.value = val
		default:
			return nil, fmt.Errorf("line %d: bad variable line", line)
		}
		out = append(out, e)
	}
}

// parseGitSection parses a section header and returns what follows it on
// the line.
func parseGitSection(t []byte) (section, sub string, rest []byte, err error) {
	i := 1
	for i < len(t) && (t[i] == '-' || t[i] == '.' || t[i] >= '0' && t[i] <= '9' || t[i] >= 'a' && t[i] <= 'z' || t[i] >= 'A' && t[i] <= 'Z') {
		i++
	}
	name := string(t[1:i])
	if i < len(t) && t[i] == ']' {
		if name == "" {
			return "", "", nil, errors.New("empty section name")
		}
		// [section.sub]: the old syntax, subsection lower-cased by git.
		s, u, _ := strings.Cut(name, ".")
		return strings.ToLower(s), strings.ToLower(u), t[i+1:], nil
	}
	if i >= len(t) || (t[i] != ' ' && t[i] != '\t') || name == "" || strings.Contains(name, ".") {
		return "", "", nil, errors.New("bad section header")
	}
	for i < len(t) && (t[i] == ' ' || t[i] == '\t') {
		i++
	}
	if i >= len(t) || t[i] != '"' {
		return "", "", nil, errors.New("bad section header")
	}
	i++
	var b strings.Builder
	for ; i < len(t) && t[i] != '"'; i++ {
		if t[i] == '\n' {
			return "", "", nil, errors.New("newline in a subsection")
		}
		if t[i] == '\\' && i+1 < len(t) {
			i++
		}
		b.WriteByte(t[i])
	}
	if i+1 >= len(t) || t[i] != '"' || t[i+1] != ']' {
		return "", "", nil, errors.New("bad section header")
	}
	return strings.ToLower(name), b.String(), t[i+2:], nil
}

// parseGitValue parses a value up to the end of its (continued) line.
func parseGitValue(v []byte, next func() ([]byte, bool)) (string, error) {
	var b strings.Builder
	quoted := false
	pendingSpace := 0
	for {
		for i := 0; i < len(v); i++ {
			c := v[i]
			switch {
			case c == '\n' || c == '\r' && i+1 < len(v) && v[i+1] == '\n':
				if quoted {
					return "", errors.New("newline in a quoted value")
				}
				return b.String(), nil
			case !quoted && (c == '#' || c == ';'):
				return b.String(), nil
			case !quoted && (c == ' ' || c == '\t'):
				if b.Len() > 0 {
					pendingSpace++
				}
				continue
			case c == '"':
				quoted = !quoted
			case c == '\\':
				if i+1 < len(v) && v[i+1] != '\n' && v[i+1] != '\r' {
					for ; pendingSpace > 0; pendingSpace-- {
						b.WriteByte(' ')
					}
				}
				if i+1 >= len(v) {
					return "", errors.New("backslash at the end of the file")
				}
				i++
				switch v[i] {
				case '\n':
					// continuation: go on with the next line
				case '\r':
					if i+1 < len(v) && v[i+1] == '\n' {
						i++
					}
				case 'n':
					b.WriteByte('\n')
				case 't':
					b.WriteByte('\t')
				case 'b':
					b.WriteByte('\b')
				case '"', '\\':
					b.WriteByte(v[i])
				default:
					return "", fmt.Errorf("bad escape \\%c", v[i])
				}
				if v[i] == '\n' || v[i] == '\r' {
					nl, ok := next()
					if !ok {
						return b.String(), nil
					}
					v, i = nl, -1
				}
				continue
			default:
				for ; pendingSpace > 0; pendingSpace-- {
					b.WriteByte(' ')
				}
				b.WriteByte(c)
				continue
			}
			for ; pendingSpace > 0; pendingSpace-- {
				b.WriteByte(' ')
			}
		}
		if quoted {
			return "", errors.New("unterminated quote")
		}
		return b.String(), nil
	}
}
