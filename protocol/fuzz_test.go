package protocol

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// Without -fuzz these run their seeds as ordinary tests; with
// `go test -fuzz=FuzzX ./protocol/` they explore further. Beyond "never
// panics" each checks the invariants a caller relies on.

func FuzzDecodeExecArgs(f *testing.F) {
	for _, seed := range []string{
		`{"command":"ls"}`, `{"command":"ls","cwd":"/"}`, `{"command":"x","timeout":5,"timeoutSeconds":5}`,
		`{"command":"x","env":{"A":null}}`, `{"command":"x","timeout":-1e999}`, `{"command":"x","yieldMs":1e400}`,
		`{"command":"x","env":{"PATH":"/x","LD_PRELOAD":"y"}}`, `[]`, `null`, ``, `{`, `{"command":"\u0000"}`,
		`{"command":"x","elevated":null,"timeoutSeconds":0}`, `{"":1}`, `{"command":"x"} {}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		a, err := DecodeExecArgs(raw)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Type != ErrInvalidRequest || pe.Message == "" {
				t.Fatalf("error %v (%T) is not an invalid_request *Error", err, err)
			}
			return
		}
		if strings.TrimSpace(a.Command) == "" {
			t.Fatalf("accepted an empty command: %+v", a)
		}
		if a.Timeout != nil && (*a.Timeout < 0 || *a.Timeout > maxNumber || math.IsNaN(*a.Timeout)) {
			t.Fatalf("timeout %v out of range", *a.Timeout)
		}
		if a.YieldMs != nil && (math.Abs(*a.YieldMs) > maxNumber || math.IsNaN(*a.YieldMs)) {
			t.Fatalf("yieldMs %v out of range", *a.YieldMs)
		}
		_ = ValidateHostEnvOverrides(a.Env)
	})
}

func FuzzDecodeProcessArgs(f *testing.F) {
	for _, seed := range []string{
		`{"action":"poll","sessionId":"s","timeout":"2000"}`, `{"action":"poll","timeout":"+2000"}`,
		`{"action":"poll","timeout":"1e3"}`, `{"action":"log","offset":-1}`, `{"action":"log","limit":1e400}`,
		`{"action":"send-keys","keys":["C-c",null]}`, `{"action":"poll","timeout":"-99999999999999999999"}`, `{}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		a, err := DecodeProcessArgs(raw)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Type != ErrInvalidRequest {
				t.Fatalf("error %v (%T) is not an invalid_request *Error", err, err)
			}
			return
		}
		for _, p := range []*int{a.Offset, a.Limit, a.Timeout} {
			if p != nil && (*p < 0 || *p > maxNumber) {
				t.Fatalf("integer %d out of range in %+v", *p, a)
			}
		}
	})
}

func FuzzValidateHostEnvOverrides(f *testing.F) {
	f.Add("PATH", "/x", "LD_PRELOAD", "y")
	f.Add("BAD-KEY", "1", "FOO", "bar")
	f.Add("PAGER", "cat", "git_pager", "")
	f.Add(" TRIM_ME ", "v", "\ufeffHOME", "/h")
	f.Add("CARGO_TARGET_X_RUNNER", "evil", "ProgramFiles(x86)", "C")
	f.Add("GIT_ALLOW_PROTOCOL", "ext:file", "GIT_PROTOCOL_FROM_USER", "1")
	f.Add("", "", "   ", "x")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		env := map[string]string{k1: v1, k2: v2}

		blocked, invalid := InspectEnvOverrides(env)
		err := ValidateHostEnvOverrides(env)
		if (err == nil) != (len(blocked) == 0 && len(invalid) == 0) {
			t.Fatalf("ValidateHostEnvOverrides = %v, but blocked %q invalid %q", err, blocked, invalid)
		}
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Type != ErrSecurityViolation || !strings.HasPrefix(pe.Message, "Security Violation: ") {
				t.Fatalf("error %v is not a security violation", err)
			}
		}

		// As overrides: nothing dangerous gets through.
		out, b2, i2 := SanitizeHostEnv(nil, env, true)
		if !sameList(b2, blocked) || !sameList(i2, invalid) {
			t.Fatalf("SanitizeHostEnv rejected %q %q, InspectEnvOverrides %q %q", b2, i2, blocked, invalid)
		}
		if out["OPENCLAW_CLI"] != "1" {
			t.Fatalf("OPENCLAW_CLI = %q", out["OPENCLAW_CLI"])
		}
		for k, v := range out {
			if k == "OPENCLAW_CLI" {
				continue
			}
			upper := strings.ToUpper(k)
			pagerOff := (upper == "PAGER" || upper == "GIT_PAGER") && v == ""
			if upper == "PATH" || IsDangerousHostEnvVarName(k) || IsDangerousHostEnvOverrideVarName(k) && !pagerOff {
				t.Fatalf("dangerous override %q=%q accepted from %q", k, v, env)
			}
			if !isHostOverrideKey(k) {
				t.Fatalf("non-portable key %q accepted", k)
			}
		}

		// As an inherited environment: only the rewritten git keys of the
		// inherited-dangerous set remain, in their safe form.
		out, _, _ = SanitizeHostEnv(env, nil, true)
		for k, v := range out {
			switch jsToUpper(k) {
			case "GIT_ALLOW_PROTOCOL":
				for p := range strings.SplitSeq(v, ":") {
					if v != "" && p != "git" && p != "http" && p != "https" && p != "ssh" {
						t.Fatalf("GIT_ALLOW_PROTOCOL kept %q", v)
					}
				}
			case "GIT_PROTOCOL_FROM_USER":
				if isPermissiveGitProtocolFromUser(v) {
					t.Fatalf("GIT_PROTOCOL_FROM_USER kept %q", v)
				}
			default:
				if IsDangerousHostInheritedEnvVarName(k) {
					t.Fatalf("inherited %q kept", k)
				}
			}
			if k != jsTrim(k) || k == "" {
				t.Fatalf("untrimmed key %q", k)
			}
		}
	})
}

func FuzzSessionKeyToken(f *testing.F) {
	for _, s := range []string{"agent:main:main", "", "_", "a.b*>", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		tok := EncodeSessionKeyToken(key)
		if !isIDToken(tok, len(tok)) {
			t.Fatalf("token %q is not a plain subject token", tok)
		}
		back, err := DecodeSessionKeyToken(tok)
		if err != nil || back != key {
			t.Fatalf("round trip of %q = %q, %v", key, back, err)
		}
		// Any token decodes to at most one key, and only from its canonical spelling.
		if k, err := DecodeSessionKeyToken(key); err == nil && EncodeSessionKeyToken(k) != key {
			t.Fatalf("non-canonical token %q decoded to %q", key, k)
		}
	})
}

func FuzzNodePathOverrideAllowed(f *testing.F) {
	f.Add("/opt/bin:/usr/bin:/bin", "/usr/bin:/bin")
	f.Add(":/usr/bin", "/usr/bin")
	f.Add("", "")
	f.Fuzz(func(t *testing.T, requested, own string) {
		if !NodePathOverrideAllowed(requested, own) || requested == own {
			return
		}
		prefix, ok := strings.CutSuffix(requested, ":"+own)
		if !ok || own == "" {
			t.Fatalf("allowed %q over %q", requested, own)
		}
		for dir := range strings.SplitSeq(prefix, ":") {
			if !strings.HasPrefix(dir, "/") {
				t.Fatalf("allowed relative entry %q in %q", dir, requested)
			}
		}
	})
}
