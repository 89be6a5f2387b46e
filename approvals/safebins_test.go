package approvals

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSafeBinProfiles(t *testing.T) {
	cases := []struct {
		bin  string
		args []string
		ok   bool
	}{
		{"head", nil, true},
		{"head", []string{"-n", "5"}, true},
		{"head", []string{"-n5"}, true},
		{"head", []string{"-qn5"}, true},
		{"head", []string{"--lines=5"}, true},
		{"head", []string{"--lines", "5"}, true},
		{"head", []string{"-c", "5", "/etc/shadow"}, false}, // file operand
		{"head", []string{"/etc/shadow"}, false},
		{"head", []string{"-"}, false},          // even stdin by name: no operands
		{"head", []string{"--", "-n"}, false},   // after --, an operand
		{"head", []string{"--lin", "5"}, false}, // abbreviations are refused
		{"head", []string{"--lines"}, false},    // missing value
		{"head", []string{"-n"}, false},         // missing value
		{"head", []string{"--quiet=1"}, false},  // flag with a value
		{"head", []string{"-5"}, false},         // legacy count syntax is not parsed
		{"head", []string{"-x"}, false},
		{"tail", []string{"-n", "+2"}, true},
		{"tail", []string{"-f"}, false},
		{"tail", []string{"--pid=1"}, false},
		{"wc", []string{"-l"}, true},
		{"wc", []string{"-lwc"}, true},
		{"wc", []string{"--files0-from=list"}, false},
		{"wc", []string{"--files0-from", "list"}, false},
		{"tr", []string{"a-z", "A-Z"}, true},
		{"tr", []string{"-d", "\\n"}, true},
		{"tr", nil, false},
		{"tr", []string{"a", "b", "c"}, false},
		{"cut", []string{"-d/", "-f2"}, true}, // a slash delimiter is not a path
		{"cut", []string{"-f1", "x"}, false},
		{"uniq", []string{"-c"}, true},
		{"uniq", []string{"in", "out"}, false}, // would write out
		{"sort", []string{"-rn", "-k", "2"}, true},
		{"sort", []string{"-o", "/tmp/x"}, false},
		{"sort", []string{"--output=/tmp/x"}, false},
		{"sort", []string{"--compress-prog=sh"}, false}, // abbreviation of --compress-program
		{"sort", []string{"-T", "/tmp"}, false},
		{"sort", []string{"--files0-from=x"}, false},
		{"sort", []string{"--random-source=/dev/urandom"}, false},
		{"grep", []string{"-e", "x"}, true},
		{"grep", []string{"-i", "--regexp=x"}, true},
		{"grep", []string{"x"}, false}, // pattern only via -e: a bare word could be a file
		{"grep", []string{"-r", "-e", "x"}, false},
		{"grep", []string{"-f", "patterns"}, false},
		{"grep", []string{"--dereference-recursive"}, false},
	}
	for _, c := range cases {
		prof, ok := builtinProfile(c.bin)
		if !ok {
			t.Fatalf("no profile for %s", c.bin)
		}
		err := prof.Check(c.args)
		if (err == nil) != c.ok {
			t.Errorf("%s %q: err = %v, want ok=%v", c.bin, c.args, err, c.ok)
		}
	}
	for _, name := range []string{"jq", "awk", "sed", "sh", "env", "xargs", "python3", "busybox"} {
		if _, ok := builtinProfile(name); ok {
			t.Errorf("%s must have no built-in profile", name)
		}
	}
}

func TestSafeBinConfiguration(t *testing.T) {
	h := newHost(t)
	// A tool outside the trusted dirs is never a safe bin, even when named
	// like one: here a `head` earlier on PATH.
	writeExec(t, filepath.Join(h.root, "early", "head"), "exit 0")
	opts := h.opts(nil)
	opts.PATH = filepath.Join(h.root, "early") + string(os.PathListSeparator) + h.path
	if ev := Evaluate("head -n 1", opts); ev.Satisfied || ev.Reason != ReasonSafeBin {
		t.Errorf("untrusted head: %v %s %s", ev.Satisfied, ev.Reason, ev.Detail)
	}
	// PATH entries are never trusted by being on PATH.
	opts = h.opts(nil)
	opts.TrustedDirs = nil
	if ev := Evaluate("head -n 1", opts); ev.Satisfied {
		t.Error("head in a PATH dir that is not trusted")
	}
	// Replacing the set: sort becomes a safe bin, head no longer is.
	opts = h.opts(nil)
	opts.SafeBins = []string{" SORT "}
	if ev := Evaluate("sort -n", opts); !ev.Satisfied {
		t.Errorf("sort as configured safe bin: %s %s", ev.Reason, ev.Detail)
	}
	if ev := Evaluate("head -n 1", opts); ev.Satisfied || ev.Reason != ReasonAllowlistMiss {
		t.Errorf("head after replacing the set: %v %s", ev.Satisfied, ev.Reason)
	}
	// An empty set allows none.
	opts.SafeBins = []string{}
	if ev := Evaluate("wc -l", opts); ev.Satisfied {
		t.Error("empty safe-bin set")
	}
	// A custom profile for a new tool, and no profile means no safe bin.
	writeExec(t, filepath.Join(h.trusted, "fmtx"), "exit 0")
	opts = h.opts(nil)
	opts.SafeBins = []string{"fmtx", "jq"}
	if ev := Evaluate("fmtx -w 3", opts); ev.Satisfied || ev.Reason != ReasonSafeBin {
		t.Errorf("safe bin without a profile: %v %s", ev.Satisfied, ev.Reason)
	}
	opts.SafeBinProfiles = map[string]SafeBinProfile{"fmtx": {ValueFlags: []string{"-w"}}}
	if ev := Evaluate("fmtx -w 3", opts); !ev.Satisfied {
		t.Errorf("custom profile: %s %s", ev.Reason, ev.Detail)
	}
	if ev := Evaluate("fmtx -w 3 /etc/shadow", opts); ev.Satisfied {
		t.Error("custom profile with an operand")
	}
	// Interpreters and wrappers cannot be made safe bins.
	writeExec(t, filepath.Join(h.trusted, "jq"), "exit 0")
	opts.SafeBinProfiles["jq"] = SafeBinProfile{MaxPositional: 1}
	if ev := Evaluate("jq .", opts); ev.Satisfied || ev.Reason != ReasonSafeBin {
		t.Errorf("jq as safe bin: %v %s", ev.Satisfied, ev.Reason)
	}
	opts.SafeBins = []string{"env"}
	opts.SafeBinProfiles = map[string]SafeBinProfile{"env": {MaxPositional: 9}}
	if ev := Evaluate("env", opts); ev.Satisfied {
		t.Error("env as safe bin")
	}
}

func TestKeptWrapperTrust(t *testing.T) {
	h := newHost(t)
	allow := []Entry{{Pattern: filepath.Join(h.bin, "ls")}}
	// nice resolves in the trusted dir: fine.
	if ev := Evaluate("nice ls", h.opts(allow)); !ev.Satisfied {
		t.Fatalf("trusted nice: %s %s", ev.Reason, ev.Detail)
	}
	// A nice earlier on PATH, outside trusted dirs and not allowlisted.
	writeExec(t, filepath.Join(h.root, "early", "nice"), "exit 0")
	opts := h.opts(allow)
	opts.PATH = filepath.Join(h.root, "early") + string(os.PathListSeparator) + h.path
	if ev := Evaluate("nice ls", opts); ev.Satisfied || ev.Reason != ReasonUntrustedWrapper {
		t.Errorf("untrusted nice: %v %s", ev.Satisfied, ev.Reason)
	}
	// ...unless allowlisted.
	opts.Allowlist = append(opts.Allowlist, Entry{Pattern: filepath.Join(h.root, "early", "nice")})
	if ev := Evaluate("nice ls", opts); !ev.Satisfied {
		t.Errorf("allowlisted nice: %s %s", ev.Reason, ev.Detail)
	}
	// A "timeout" that is really something else, even under "/**".
	opts = h.opts(append(allow, Entry{Pattern: "/**"}))
	if err := os.Symlink(filepath.Join(h.evil, "id"), filepath.Join(h.root, "early", "timeout")); err != nil {
		t.Fatal(err)
	}
	opts.PATH = filepath.Join(h.root, "early")
	if ev := Evaluate("timeout 5 "+filepath.Join(h.bin, "ls"), opts); ev.Satisfied || ev.Reason != ReasonUntrustedWrapper {
		t.Errorf("timeout resolving to id: %v %s %s", ev.Satisfied, ev.Reason, ev.Detail)
	}
	// Relative wrapper paths are refused.
	writeExec(t, filepath.Join(h.work, "nice"), "exit 0")
	if ev := Evaluate("./nice ls", h.opts(append(allow, Entry{Pattern: "/**"}))); ev.Satisfied {
		t.Error("relative wrapper path")
	}
	// env -C changes where a relative program is found.
	if ev := Evaluate("env -C "+h.bin+" ./ls", h.opts(allow)); !ev.Satisfied || ev.Segments[0].ResolvedPath != filepath.Join(h.bin, "ls") {
		t.Errorf("env -C: %s %s", ev.Reason, ev.Detail)
	}
	if ev := Evaluate("env -C ../bin ./ls", h.opts(allow)); !ev.Satisfied {
		t.Errorf("env -C relative: %s %s", ev.Reason, ev.Detail)
	}
	if ev := Evaluate("env -C .. env -C bin ./ls", h.opts(allow)); !ev.Satisfied {
		t.Errorf("nested env -C: %s %s", ev.Reason, ev.Detail)
	}
	if ev := Evaluate("env -C "+h.evil+" ./id", h.opts(allow)); ev.Satisfied || ev.Segments[0].ResolvedPath != filepath.Join(h.evil, "id") {
		t.Errorf("env -C to the evil dir: %+v", ev.Segments)
	}
}
