package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestEscapeScanner: escaped bytes are noticed however the output is cut
// into writes, and text without them passes unnoticed.
func TestEscapeScanner(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		writes []string
		found  bool
	}{
		{"plain", []string{"hello\n", "world\n"}, false},
		{"a backslash alone", []string{`C:\path x\y`}, false},
		{"upper-case hex is not the sanitizer's", []string{`\x0A`}, false},
		{"NUL", []string{`a\x00b`}, true},
		{"split after the backslash", []string{`a\`, `x1bb`}, true},
		{"split inside the hex", []string{`a\x`, `7f`}, true},
		{"split twice", []string{`\`, `x`, `0`, `1`}, true},
		{"U+FFFD", []string{"x\uFFFDy"}, true},
		{"U+FFFD split in its bytes", []string{"x\xef", "\xbf\xbdy"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			s := &escapeScanner{w: &out}
			for _, w := range tt.writes {
				if n, err := s.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
			}
			if s.found != tt.found {
				t.Errorf("found %v, want %v", s.found, tt.found)
			}
			if out.String() != strings.Join(tt.writes, "") {
				t.Errorf("passed on %q", out.String())
			}
			if hasEscapes(strings.Join(tt.writes, "")) != tt.found {
				t.Errorf("hasEscapes disagrees")
			}
		})
	}
}

// TestRestartOnlyKey: the keys a reload reads but does not apply, and
// what lies beneath them.
func TestRestartOnlyKey(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]string{
		"tools.exec.notifyOnExit":             "tools.exec.notifyOnExit",
		"tools.exec.notifyOnExitEmptySuccess": "tools.exec.notifyOnExitEmptySuccess",
		"nats.url":                            "nats",
		"gateway.listen":                      "gateway.listen",
		"tools.exec.security":                 "",
		"tools.exec.ask":                      "",
		"natsx":                               "",
		"agents.list[0].tools.exec.node":      "",
	} {
		if got := restartOnlyKey(key); got != want {
			t.Errorf("restartOnlyKey(%q) = %q, want %q", key, got, want)
		}
	}
}

// TestConfigChangeLine: what config set and unset print.
func TestConfigChangeLine(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		ch   configChange
		want string
	}{
		{configChange{key: "tools.exec.ask", before: "on-miss", after: "always"}, "tools.exec.ask: on-miss -> always"},
		{configChange{key: "tools.exec.ask", before: "always", after: "always"}, "tools.exec.ask: always (unchanged)"},
		{configChange{key: "tools.exec.ask", before: "always", after: "on-miss", unset: true}, "tools.exec.ask: always -> on-miss (default)"},
	} {
		if got := tt.ch.String(); got != tt.want {
			t.Errorf("%+v: %q, want %q", tt.ch, got, tt.want)
		}
	}
	path, _ := parseKeyPath("tools.exec.security")
	for doc, want := range map[string]string{
		``:                                       "allowlist",
		`{"tools":{"exec":{"security":"full"}}}`: "full",
		`{"tools":{"exec":{"host":"sandbox"}}}`:  "deny",
		`{"tools":`:                              "allowlist", // what decodes of it
	} {
		if got := valueInForce([]byte(doc), path); got != want {
			t.Errorf("valueInForce(%s) = %q, want %q", doc, got, want)
		}
	}
}
