package approvals

import (
	"fmt"
	"strings"
)

// Option parsing for the tools with carrier rules (carriers.go). A rule is
// only as good as its reading of the command line: `git ls-remote
// --upload-pa=cmd` is --upload-pack to git, because GNU getopt_long, git's
// parse-options and argp accept any unambiguous prefix of a long option.
// So every word is resolved against the tool's option table first, and
// rules are applied to what the tool will see.
//
// Abbreviations fail closed: a prefix that could abbreviate a risky option
// counts as that option, even when the tool itself would call it
// ambiguous (it then refuses to run, so nothing is lost by refusing too).

// argKind says whether an option takes a value.
type argKind uint8

const (
	argNone     argKind = iota
	argRequired         // attached (-xVAL, --x=VAL) or the next word
	argOptional         // attached only (-xVAL, --x=VAL)
)

// option is one entry of a tool's option table.
type option struct {
	long  string // without the leading "--"; "" when there is no long form
	short byte   // 0 when there is no short form
	arg   argKind
	// risk says what the option makes the tool do besides its job ("runs a
	// command", "writes a file"); "" for harmless options.
	risk string
}

// optionSet is a tool's option table and the rules its parser follows.
type optionSet struct {
	tool string
	opts []option
	// complete means the table lists every option the tool accepts, so an
	// unknown option is refused: either the tool rejects it too, or the
	// table is out of date and the option may take a value that shifts
	// which word is the script. Tools whose operands are only file names
	// or revisions leave it false and treat unknown options as flags.
	complete bool
	// abbrev: unambiguous prefixes of long options are accepted.
	abbrev bool
	// stopAtOperand: the first operand ends the options (POSIX getopt,
	// awk); otherwise options may follow operands (GNU getopt permutes).
	stopAtOperand bool
}

// optUse is one option as it appears in a command.
type optUse struct {
	option
	written  string // as written, for details ("--upload-pa")
	value    string
	hasValue bool
}

// optParse is a parsed command line.
type optParse struct {
	uses     []optUse
	operands []string
	// problem is the first reason found to refuse the command line: a risky
	// option, or (for complete tables) an unknown or ambiguous one.
	problem string
}

func (s optionSet) byLong(name string) []option {
	var exact, prefix []option
	for _, o := range s.opts {
		switch {
		case o.long == "":
		case o.long == name:
			exact = append(exact, o)
		case s.abbrev && strings.HasPrefix(o.long, name):
			prefix = append(prefix, o)
		}
	}
	if len(exact) > 0 {
		return exact[:1]
	}
	return prefix
}

func (s optionSet) byShort(c byte) (option, bool) {
	for _, o := range s.opts {
		if o.short == c {
			return o, true
		}
	}
	return option{}, false
}

// describe names an option for a refusal: "tar --to-command (written
// --to-c)".
func (s optionSet) describe(o option, written string) string {
	name := "-" + string(o.short)
	if o.long != "" {
		name = "--" + o.long
	}
	d := s.tool + " " + name
	if written != "" && written != name {
		d += " (written " + written + ")"
	}
	return d + ": " + o.risk
}

// parse reads args (without the program name) as the tool would.
func (s optionSet) parse(args []string) optParse {
	var p optParse
	fail := func(why string) {
		if p.problem == "" {
			p.problem = why
		}
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			p.operands = append(p.operands, args[i+1:]...)
			return p
		case strings.HasPrefix(a, "--"):
			name, value, hasValue := strings.Cut(a[2:], "=")
			cands := s.byLong(name)
			for _, o := range cands {
				if o.risk != "" {
					fail(s.describe(o, "--"+name))
				}
			}
			switch {
			case len(cands) == 0:
				if s.complete {
					fail(fmt.Sprintf("%s option --%s is not known", s.tool, name))
				}
				p.uses = append(p.uses, optUse{written: a})
				continue
			case len(cands) > 1:
				if s.complete {
					fail(fmt.Sprintf("%s option --%s is ambiguous", s.tool, name))
				}
				p.uses = append(p.uses, optUse{written: a})
				continue
			}
			u := optUse{option: cands[0], written: "--" + name, value: value, hasValue: hasValue}
			if !hasValue && u.arg == argRequired && i+1 < len(args) {
				i++
				u.value, u.hasValue = args[i], true
			}
			p.uses = append(p.uses, u)
		case len(a) > 1 && a[0] == '-':
			for j := 1; j < len(a); j++ {
				o, ok := s.byShort(a[j])
				if !ok {
					if s.complete {
						fail(fmt.Sprintf("%s option -%c is not known", s.tool, a[j]))
					}
					continue
				}
				if o.risk != "" {
					fail(s.describe(o, "-"+string(a[j])))
				}
				u := optUse{option: o, written: "-" + string(a[j])}
				if o.arg != argNone {
					if j+1 < len(a) {
						u.value, u.hasValue = a[j+1:], true
					} else if o.arg == argRequired && i+1 < len(args) {
						i++
						u.value, u.hasValue = args[i], true
					}
					p.uses = append(p.uses, u)
					break
				}
				p.uses = append(p.uses, u)
			}
		default:
			if s.stopAtOperand {
				p.operands = append(p.operands, args[i:]...)
				return p
			}
			p.operands = append(p.operands, a)
		}
	}
	return p
}

// has reports whether the parse used the option with the given long name
// (or short letter, for options without a long form).
func (p optParse) has(long string, short byte) bool {
	for _, u := range p.uses {
		if (long != "" && u.long == long) || (short != 0 && u.short == short) {
			return true
		}
	}
	return false
}

// values returns the values given to an option, in order.
func (p optParse) values(long string, short byte) []string {
	var out []string
	for _, u := range p.uses {
		if ((long != "" && u.long == long) || (short != 0 && u.short == short)) && u.hasValue {
			out = append(out, u.value)
		}
	}
	return out
}
