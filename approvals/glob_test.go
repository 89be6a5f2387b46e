package approvals

import (
	"os"
	"path/filepath"
	"testing"
)

func TestGlobMatching(t *testing.T) {
	home := "/home/u"
	cases := []struct {
		pattern, path string
		want          bool
	}{
		{"/usr/bin/rg", "/usr/bin/rg", true},
		{"/usr/bin/rg", "/usr/bin/rgx", false},      // anchored
		{"/usr/bin/rg", "/opt/usr/bin/rg", false},   // anchored
		{"/usr/bin/RG", "/usr/bin/rg", true},        // case-insensitive
		{"/usr/bin/rg", "/USR/BIN/RG", true},        // case-insensitive
		{"/usr/bin/*", "/usr/bin/rg", true},         // * within a component
		{"/usr/bin/*", "/usr/bin/sub/rg", false},    // * does not cross /
		{"/usr/**", "/usr/bin/sub/rg", true},        // ** crosses /
		{"/usr/**/rg", "/usr/local/bin/rg", true},   // ** in the middle
		{"/usr/**/rg", "/usr/local/bin/rgx", false}, // still anchored
		{"/usr/bin/r?", "/usr/bin/rg", true},        // ? one character
		{"/usr/bin/r?", "/usr/bin/rgg", false},      // exactly one
		{"/usr/bin?rg", "/usr/bin/rg", false},       // ? does not match /
		{"/usr/bin/r[g]", "/usr/bin/rg", false},     // [ ] are literal
		{"/usr/bin/r[g]", "/usr/bin/r[g]", true},    // [ ] are literal
		{"/usr/bin/r.g", "/usr/bin/rxg", false},     // . is literal
		{"/usr/bin/r+", "/usr/bin/rr", false},       // + is literal
		{"~/bin/tool", "/home/u/bin/tool", true},    // ~ expanded
		{"~/Projects/**/bin/rg", "/home/u/Projects/x/y/bin/rg", true},
		{"~root/bin/tool", "/root/bin/tool", false}, // ~user is not expanded
		{"rg", "/usr/bin/rg", false},                // basename-only patterns are ignored
		{"r*", "/usr/bin/rg", false},                // still basename-only
		{"*", "/any/thing", true},                   // bare * matches anything
		{"  /usr/bin/rg  ", "/usr/bin/rg", true},    // trimmed
		{"", "/usr/bin/rg", false},
		{"bin/rg", "/usr/bin/rg", false},       // relative patterns never match
		{"/usr/bin/rg\n", "/usr/bin/rg", true}, // trimmed
		{"/tmp/a b/*", "/tmp/a b/x", true},
		{"/x/日本/*", "/x/日本/y", true},
	}
	for _, c := range cases {
		if got := MatchPattern(c.pattern, c.path, home); got != c.want {
			t.Errorf("MatchPattern(%q, %q) = %v, want %v", c.pattern, c.path, got, c.want)
		}
	}
	if MatchPattern("~/bin/tool", "/home/u/bin/tool", "") {
		t.Error("~ without a home must not match")
	}
	if MatchPattern("~/bin/tool", "/home/u/bin/tool", "relative/home") {
		t.Error("~ with a relative home must not match")
	}
}

func TestArgPatternFailsClosed(t *testing.T) {
	h := newHost(t)
	opts := h.opts([]Entry{{Pattern: filepath.Join(h.bin, "ls"), ArgPattern: "-la"}})
	if ev := Evaluate("ls -la", opts); ev.Satisfied {
		t.Fatal("an entry with an argPattern must not match")
	}
}

func TestCanonicalPatternDirectory(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.MkdirAll(real, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	realDir, _ := filepath.EvalSymlinks(real)
	for _, p := range []string{link + "/*", link + "/tool", link + "/**"} {
		if !MatchPattern(p, realDir+"/tool", "") {
			t.Errorf("%q should cover %s/tool", p, realDir)
		}
	}
	// The last component is never followed.
	fileLink := filepath.Join(dir, "tool-link")
	if err := os.Symlink(filepath.Join(realDir, "tool"), fileLink); err != nil {
		t.Fatal(err)
	}
	if MatchPattern(fileLink, realDir+"/tool", "") {
		t.Error("a pattern naming a link must not match the link's target")
	}
}
