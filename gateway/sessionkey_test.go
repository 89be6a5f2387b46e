package gateway

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// sessionKeyOracle is the grammar of a session key as a regular
// expression (what ParseSessionKey checks by hand).
var sessionKeyOracle = regexp.MustCompile(`^agent:([a-z0-9][a-z0-9_-]{0,63}):([A-Za-z0-9._:@/+=-]{1,190})$`)

// TestParseSessionKey: ParseSessionKey accepts exactly the keys of the
// grammar and returns their agent id, on edge cases and on random keys
// near the grammar; the empty key is the default one.
func TestParseSessionKey(t *testing.T) {
	check := func(key string) {
		t.Helper()
		if key == "" {
			return // the default key, below
		}
		_, agent, err := ParseSessionKey(key)
		m := sessionKeyOracle.FindStringSubmatch(key)
		switch {
		case m == nil && err == nil:
			t.Errorf("%q accepted (agent %q), want refused", key, agent)
		case m != nil && err != nil:
			t.Errorf("%q refused (%v), want agent %q", key, err, m[1])
		case m != nil && agent != m[1]:
			t.Errorf("%q: agent %q, want %q", key, agent, m[1])
		}
	}
	for _, k := range []string{
		"agent:main:main", "agent:a:b", "agent:0:x", "agent:-a:x", "agent:_a:x", "agent:a-b_c:x",
		"agent:A:x", "agent::x", "agent:a:", "agent:a", "agent:", "agent", "agents:a:b", " agent:a:b",
		"agent:a:b ", "agent:a:b\n", "agent:a:b:c:d", "agent:a:::", "agent:a:x@y/z+=.-_", "agent:a:é",
		"agent:" + strings.Repeat("a", 64) + ":x", "agent:" + strings.Repeat("a", 65) + ":x",
		"agent:a:" + strings.Repeat("x", 190), "agent:a:" + strings.Repeat("x", 191), "agent:a:x\x00",
	} {
		check(k)
	}
	if key, agent, err := ParseSessionKey(""); err != nil || key != DefaultSessionKey || agent != "main" {
		t.Errorf(`"": %q %q %v, want the default key`, key, agent, err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := "agent:mainAZ09_-.@/+=é \x00"
	for range 20000 {
		b := []byte("agent:")
		if r.IntN(10) == 0 {
			b = b[:r.IntN(len(b))]
		}
		for n := r.IntN(12); n > 0; n-- {
			b = append(b, alphabet[r.IntN(len(alphabet))])
		}
		if r.IntN(4) == 0 {
			b = append(b, strings.Repeat("a", 60+r.IntN(8))...)
		}
		if r.IntN(4) == 0 {
			b = append(b, ':')
			b = append(b, strings.Repeat("x", 185+r.IntN(10))...)
		}
		check(string(b))
	}
}
