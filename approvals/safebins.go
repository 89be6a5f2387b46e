package approvals

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// DefaultSafeBins returns the default safe bins (tools.exec.safeBins): cut,
// uniq, head, tail, tr and wc. The slice is new on every call.
func DefaultSafeBins() []string {
	return []string{"cut", "uniq", "head", "tail", "tr", "wc"}
}

// DefaultTrustedDirs returns the directories a safe bin must live in unless
// more are configured: /bin and /usr/bin. PATH entries are never trusted.
func DefaultTrustedDirs() []string {
	return []string{"/bin", "/usr/bin"}
}

// NormalizeSafeBins trims and lower-cases names, drops empty ones and
// duplicates, keeping the first occurrence's order (OpenClaw's
// normalizeSafeBins).
func NormalizeSafeBins(names []string) []string {
	out := []string{}
	for _, n := range names {
		n = strings.ToLower(strings.TrimSpace(n))
		if n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// SafeBinProfile says how a safe bin may be called: it is an allow-list of
// options, so anything else — unknown options, abbreviations of long
// options, file-taking options such as `sort -o` or `wc --files0-from` —
// is refused.
type SafeBinProfile struct {
	// MinPositional and MaxPositional bound the operands. Stdin-only tools
	// take none: `head -c 5 /etc/shadow` is refused for its operand.
	MinPositional, MaxPositional int
	// Flags are options without a value ("-q", "--quiet").
	Flags []string
	// ValueFlags are options that take a value, given as the next word, as
	// "--name=value" or attached to a short option ("-n5").
	ValueFlags []string
}

// Check validates the arguments (without the program name) against the
// profile, parsing them as GNU getopt_long does (short option clusters,
// "--" ends options, options may follow operands) but failing closed.
func (p SafeBinProfile) Check(args []string) error {
	positional := 0
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			positional += len(args) - i - 1
			i = len(args)
		case strings.HasPrefix(a, "--"):
			name, _, hasValue := strings.Cut(a, "=")
			switch {
			case slices.Contains(p.ValueFlags, name):
				if !hasValue {
					if i+1 >= len(args) {
						return fmt.Errorf("option %s needs a value", name)
					}
					i++
				}
			case slices.Contains(p.Flags, name):
				if hasValue {
					return fmt.Errorf("option %s takes no value", name)
				}
			default:
				return fmt.Errorf("option %s is not allowed", name)
			}
		case strings.HasPrefix(a, "-") && a != "-":
		cluster:
			for j := 1; j < len(a); j++ {
				opt := "-" + a[j:j+1]
				switch {
				case slices.Contains(p.ValueFlags, opt):
					if j+1 == len(a) {
						if i+1 >= len(args) {
							return fmt.Errorf("option %s needs a value", opt)
						}
						i++
					}
					break cluster
				case slices.Contains(p.Flags, opt):
				default:
					return fmt.Errorf("option %s is not allowed", opt)
				}
			}
		default:
			positional++
		}
	}
	if positional < p.MinPositional || positional > p.MaxPositional {
		if p.MaxPositional == 0 {
			return fmt.Errorf("operands are not allowed (%d given): stdin only", positional)
		}
		return fmt.Errorf("%d operands given, %d to %d allowed", positional, p.MinPositional, p.MaxPositional)
	}
	return nil
}

// builtinProfile returns the profile execmesh ships for a safe bin (spec
// §17.6, stricter where it was deny-listed). jq, sed and awk have none: they
// read files or run commands from their program text.
func builtinProfile(name string) (SafeBinProfile, bool) {
	headTail := SafeBinProfile{
		Flags:      []string{"-q", "-v", "-z", "--quiet", "--silent", "--verbose", "--zero-terminated"},
		ValueFlags: []string{"-n", "-c", "--lines", "--bytes"},
	}
	switch name {
	case "head", "tail":
		return headTail, true
	case "wc":
		return SafeBinProfile{Flags: []string{"-c", "-m", "-l", "-L", "-w", "--bytes", "--chars",
			"--lines", "--max-line-length", "--words"}}, true
	case "cut":
		return SafeBinProfile{
			Flags:      []string{"-n", "-s", "-z", "--complement", "--only-delimited", "--zero-terminated"},
			ValueFlags: []string{"-b", "-c", "-f", "-d", "--bytes", "--characters", "--fields", "--delimiter", "--output-delimiter"},
		}, true
	case "uniq":
		return SafeBinProfile{
			Flags:      []string{"-c", "-d", "-D", "-i", "-u", "-z", "--count", "--repeated", "--ignore-case", "--unique", "--zero-terminated"},
			ValueFlags: []string{"-f", "-s", "-w", "--skip-fields", "--skip-chars", "--check-chars"},
		}, true
	case "tr":
		return SafeBinProfile{
			MinPositional: 1, MaxPositional: 2,
			Flags: []string{"-c", "-C", "-d", "-s", "-t", "--complement", "--delete", "--squeeze-repeats", "--truncate-set1"},
		}, true
	case "grep":
		return SafeBinProfile{
			Flags: []string{"-E", "-F", "-G", "-i", "-y", "-v", "-w", "-x", "-c", "-o", "-q", "-s", "-b",
				"-n", "-H", "-h", "-a", "-I", "-z", "-U", "--extended-regexp", "--fixed-strings",
				"--basic-regexp", "--ignore-case", "--no-ignore-case", "--invert-match", "--word-regexp",
				"--line-regexp", "--count", "--only-matching", "--quiet", "--silent", "--no-messages",
				"--byte-offset", "--line-number", "--with-filename", "--no-filename", "--text",
				"--null-data", "--binary"},
			ValueFlags: []string{"-e", "--regexp", "-m", "--max-count", "-A", "-B", "-C",
				"--after-context", "--before-context", "--context", "--label"},
		}, true
	case "sort":
		return SafeBinProfile{
			Flags: []string{"-b", "-d", "-f", "-g", "-i", "-M", "-h", "-n", "-R", "-r", "-V", "-s", "-u", "-z",
				"--ignore-leading-blanks", "--dictionary-order", "--ignore-case", "--general-numeric-sort",
				"--ignore-nonprinting", "--month-sort", "--human-numeric-sort", "--numeric-sort",
				"--random-sort", "--reverse", "--version-sort", "--stable", "--unique", "--zero-terminated"},
			ValueFlags: []string{"-k", "--key", "-t", "--field-separator", "-S", "--buffer-size", "--parallel"},
		}, true
	}
	return SafeBinProfile{}, false
}

// neverSafeBin lists programs that no configuration can make a safe bin:
// they interpret programs, run commands, or write files by design.
func neverSafeBin(name string) bool {
	n := kindName(name)
	if unsafeKind(name) != "" {
		return true
	}
	switch n {
	case "awk", "gawk", "mawk", "nawk", "busybox", "toybox", "sed", "gsed", "jq", "yq", "perl",
		"python", "ruby", "node", "nodejs", "deno", "bun", "php", "lua", "luajit", "tclsh", "wish",
		"osascript", "vim", "vi", "nvim", "ex", "ed", "emacs", "less", "more", "man", "git", "find",
		"tar", "zip", "unzip", "make", "ssh", "scp", "rsync", "curl", "wget", "tee", "dd", "cp",
		"mv", "rm", "ln", "install", "split", "csplit", "sqlite3", "env", "xargs":
		return true
	}
	return false
}

// safeBinCheck reports whether running realPath with args is a safe-bin use.
// It returns ("", true) when it is, (detail, true) when the program is a
// configured safe bin used unsafely, and ("", false) when it is not a safe
// bin at all.
func (e *evaluator) safeBinCheck(realPath string, args []string) (string, bool) {
	name := filepath.Base(realPath)
	if !slices.Contains(e.safeBins, name) {
		return "", false
	}
	if neverSafeBin(name) {
		return name + " can never be a safe bin", true
	}
	if !e.trusted[filepath.Dir(realPath)] {
		return realPath + " is not in a trusted directory", true
	}
	prof, ok := e.opts.SafeBinProfiles[name]
	if !ok {
		prof, ok = builtinProfile(name)
	}
	if !ok {
		return name + " has no safe-bin profile", true
	}
	if err := prof.Check(args); err != nil {
		return name + ": " + err.Error(), true
	}
	return "", true
}
