package visible

import (
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"ls -la /tmp", "ls -la /tmp"},
		{`printf 'a\n' | grep "x\\y"`, `printf 'a\n' | grep "x\\y"`}, // backslashes as typed
		{"héllo wörld — ✓ 日本", "héllo wörld — ✓ 日本"},
		{"rm -rf ~\x1b[2Kls", `rm -rf ~\x1b[2Kls`},
		{"evil\b\b\b\bgood", `evil\b\b\b\bgood`},
		{"rm -rf /\rls       ", `rm -rf /\rls       `},
		{"a\tb\nc\vd\fe\af", `a\tb\nc\vd\fe\af`},
		{"\x00\x01\x1f\x7f", `\x00\x01\x1f\x7f`},
		{"c1 \u0085 \u009b31m", `c1 \u0085 \u009b31m`},
		{"zero\u200bwidth\u200c\u200d\u2060", `zero\u200bwidth\u200c\u200d\u2060`},
		{"ls \u202etxt.exe", `ls \u202etxt.exe`},
		{"\u2066a\u2067b\u2068c\u2069", `\u2066a\u2067b\u2068c\u2069`},
		{"bom\ufeff soft\u00adhyphen", `bom\ufeff soft\u00adhyphen`},
		{"nbsp\u00a0ideo\u3000line\u2028para\u2029", `nbsp\u00a0ideo\u3000line\u2028para\u2029`},
		{"filler\u3164x\u115f vs\ufe0f", `filler\u3164x\u115f vs\ufe0f`},
		{"tag\U000e0041 private\ue000", `tag\U000e0041 private\ue000`},
		{"bad \xff\xfe utf8 \xe2\x82", `bad \xff\xfe utf8 \xe2\x82`},
		{"replacement \ufffd kept", "replacement \ufffd kept"},
	} {
		if got := String(tc.in); got != tc.want {
			t.Errorf("String(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestStringNoRawControls: whatever the input, the output holds no byte
// below 0x20, no DEL and is valid UTF-8 of printable characters.
func TestStringNoRawControls(t *testing.T) {
	var all strings.Builder
	for r := rune(0); r < 0x3000; r++ {
		all.WriteRune(r)
	}
	all.WriteString("\xff\xc0\x80")
	out := String(all.String())
	if i := firstHidden(out); i >= 0 {
		t.Fatalf("String left %q at %d", out[i:min(len(out), i+8)], i)
	}
}

func FuzzString(f *testing.F) {
	for _, s := range []string{"a\x1b[2Kb", "\u202e", "\xff", "x\r\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := String(s)
		if firstHidden(out) >= 0 {
			t.Fatalf("String(%q) = %q still hides something", s, out)
		}
		if firstHidden(s) < 0 && out != s {
			t.Fatalf("String(%q) = %q changed visible text", s, out)
		}
	})
}
