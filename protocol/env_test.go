package protocol

import (
	"errors"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// hostEnvFixture is testdata/conformance/host_env.json.
type hostEnvFixture struct {
	OpenclawVersion string `json:"openclawVersion"`
	Lists           struct {
		BlockedEverywhereKeys            []string `json:"blockedEverywhereKeys"`
		BlockedOverrideOnlyKeys          []string `json:"blockedOverrideOnlyKeys"`
		AllowedInheritedOverrideOnlyKeys []string `json:"allowedInheritedOverrideOnlyKeys"`
		BlockedPrefixes                  []string `json:"blockedPrefixes"`
		BlockedOverridePrefixes          []string `json:"blockedOverridePrefixes"`
		BlockedOverridePattern           string   `json:"blockedOverridePattern"`
		Derived                          struct {
			BlockedKeys              []string `json:"blockedKeys"`
			BlockedOverrideKeys      []string `json:"blockedOverrideKeys"`
			BlockedInheritedKeys     []string `json:"blockedInheritedKeys"`
			BlockedInheritedPrefixes []string `json:"blockedInheritedPrefixes"`
		} `json:"derived"`
		ShellWrapperAllowedOverrideKeys     []string `json:"shellWrapperAllowedOverrideKeys"`
		ShellWrapperAllowedOverridePrefixes []string `json:"shellWrapperAllowedOverridePrefixes"`
	} `json:"lists"`
	Cases []struct {
		Key                                string  `json:"key"`
		DangerousOverride                  bool    `json:"dangerousOverride"`
		DangerousInherited                 bool    `json:"dangerousInherited"`
		OverrideRejection                  *string `json:"overrideRejection"`
		ReportedAs                         *string `json:"reportedAs"`
		IsDangerousHostEnvVarName          bool    `json:"isDangerousHostEnvVarName"`
		IsDangerousHostEnvOverrideVarName  bool    `json:"isDangerousHostEnvOverrideVarName"`
		IsDangerousHostInheritedEnvVarName bool    `json:"isDangerousHostInheritedEnvVarName"`
	} `json:"cases"`
	Sanitize []struct {
		Name                        string            `json:"name"`
		BaseEnv                     map[string]string `json:"baseEnv"`
		Overrides                   map[string]string `json:"overrides"`
		BlockPathOverrides          *bool             `json:"blockPathOverrides"`
		ResultEnv                   map[string]string `json:"resultEnv"`
		RejectedOverrideBlockedKeys []string          `json:"rejectedOverrideBlockedKeys"`
		RejectedOverrideInvalidKeys []string          `json:"rejectedOverrideInvalidKeys"`
	} `json:"sanitize"`
	ExecOverrideErrors []struct {
		Env    map[string]string `json:"env"`
		Error  *string           `json:"error"`
		Status string            `json:"status"`
		Text   string            `json:"text"`
	} `json:"execOverrideErrors"`
}

func loadHostEnv(t *testing.T) *hostEnvFixture {
	t.Helper()
	var fx hostEnvFixture
	loadFixture(t, "host_env.json", &fx)
	if fx.OpenclawVersion == "" || len(fx.Cases) == 0 || len(fx.Sanitize) == 0 || len(fx.ExecOverrideErrors) == 0 {
		t.Fatalf("host_env.json: unexpected shape (version %q, %d cases, %d sanitize, %d execOverrideErrors)",
			fx.OpenclawVersion, len(fx.Cases), len(fx.Sanitize), len(fx.ExecOverrideErrors))
	}
	return &fx
}

// sortedUpperSet is what OpenClaw derives from a shipped list.
func sortedUpperSet(list []string) []string {
	out := make([]string, len(list))
	for i, s := range list {
		out[i] = strings.ToUpper(s)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// sameList compares lists, treating nil and empty as equal.
func sameList(a, b []string) bool {
	return len(a) == 0 && len(b) == 0 || slices.Equal(a, b)
}

func TestHostEnvPolicyLists(t *testing.T) {
	fx := loadHostEnv(t)
	L := fx.Lists

	tables := []struct {
		name  string
		table []string
		want  []string
	}{
		{"blockedEverywhereKeys", blockedEverywhereKeys, sortedUpperSet(L.BlockedEverywhereKeys)},
		{"blockedEverywhereKeys (derived blockedKeys)", blockedEverywhereKeys, L.Derived.BlockedKeys},
		{"blockedOverrideOnlyKeys", blockedOverrideOnlyKeys, sortedUpperSet(L.BlockedOverrideOnlyKeys)},
		{"blockedOverrideOnlyKeys (derived blockedOverrideKeys)", blockedOverrideOnlyKeys, L.Derived.BlockedOverrideKeys},
		{"allowedInheritedOverrideOnlyKeys", allowedInheritedOverrideOnlyKeys, sortedUpperSet(L.AllowedInheritedOverrideOnlyKeys)},
		{"blockedPrefixes", blockedPrefixes, sortedUpperSet(L.BlockedPrefixes)},
		{"blockedPrefixes (derived blockedInheritedPrefixes)", blockedPrefixes, L.Derived.BlockedInheritedPrefixes},
		{"blockedOverridePrefixes", blockedOverridePrefixes, sortedUpperSet(L.BlockedOverridePrefixes)},
		{"shellWrapperAllowedOverrideKeys", shellWrapperAllowedOverrideKeys, sortedUpperSet(L.ShellWrapperAllowedOverrideKeys)},
		{"shellWrapperAllowedOverridePrefixes", shellWrapperAllowedOverridePrefixes, sortedUpperSet(L.ShellWrapperAllowedOverridePrefixes)},
	}
	for _, tc := range tables {
		if !slices.Equal(tc.table, tc.want) {
			t.Errorf("%s differs from host_env.json:\n got %q\nwant %q", tc.name, tc.table, tc.want)
		}
		// Lookups are binary searches: every table must be strictly sorted.
		if !slices.IsSorted(tc.table) || len(slices.Compact(slices.Clone(tc.table))) != len(tc.table) {
			t.Errorf("%s is not strictly sorted", tc.name)
		}
	}
	if L.BlockedOverridePattern != blockedOverridePattern {
		t.Errorf("blockedOverridePattern = %q, fixture has %q", blockedOverridePattern, L.BlockedOverridePattern)
	}

	// The inherited set is derived, not stored: rebuild it and compare.
	var inherited []string
	for _, k := range slices.Concat(blockedEverywhereKeys, blockedOverrideOnlyKeys, allowedInheritedOverrideOnlyKeys) {
		if isBlockedInherited(k) {
			inherited = append(inherited, k)
		}
	}
	slices.Sort(inherited)
	inherited = slices.Compact(inherited)
	if !slices.Equal(inherited, L.Derived.BlockedInheritedKeys) {
		t.Errorf("derived blockedInheritedKeys differ:\n got %q\nwant %q", inherited, L.Derived.BlockedInheritedKeys)
	}
	for _, k := range L.Derived.BlockedInheritedKeys {
		if !IsDangerousHostInheritedEnvVarName(k) || !IsDangerousHostInheritedEnvVarName(strings.ToLower(k)) {
			t.Errorf("IsDangerousHostInheritedEnvVarName(%q) = false, want true", k)
		}
	}
	for _, k := range L.Derived.BlockedKeys {
		if !IsDangerousHostEnvVarName(k) || !IsDangerousHostEnvVarName(strings.ToLower(k)) {
			t.Errorf("IsDangerousHostEnvVarName(%q) = false, want true", k)
		}
	}
	for _, k := range L.Derived.BlockedOverrideKeys {
		if !IsDangerousHostEnvOverrideVarName(k) {
			t.Errorf("IsDangerousHostEnvOverrideVarName(%q) = false, want true", k)
		}
	}
	for _, k := range L.AllowedInheritedOverrideOnlyKeys {
		if IsDangerousHostInheritedEnvVarName(k) {
			t.Errorf("IsDangerousHostInheritedEnvVarName(%q) = true for an allowed-inherited key", k)
		}
	}
}

func TestHostEnvConformanceCases(t *testing.T) {
	fx := loadHostEnv(t)
	for _, c := range fx.Cases {
		t.Run(c.Key, func(t *testing.T) {
			if got := IsDangerousHostEnvVarName(c.Key); got != c.IsDangerousHostEnvVarName {
				t.Errorf("IsDangerousHostEnvVarName = %v, want %v", got, c.IsDangerousHostEnvVarName)
			}
			if got := IsDangerousHostEnvOverrideVarName(c.Key); got != c.IsDangerousHostEnvOverrideVarName {
				t.Errorf("IsDangerousHostEnvOverrideVarName = %v, want %v", got, c.IsDangerousHostEnvOverrideVarName)
			}
			if got := IsDangerousHostInheritedEnvVarName(c.Key); got != c.IsDangerousHostInheritedEnvVarName {
				t.Errorf("IsDangerousHostInheritedEnvVarName = %v, want %v", got, c.IsDangerousHostInheritedEnvVarName)
			}

			// As a request override with value "x".
			env := map[string]string{c.Key: "x"}
			blocked, invalid := InspectEnvOverrides(env)
			var wantBlocked, wantInvalid []string
			switch {
			case c.OverrideRejection == nil:
			case *c.OverrideRejection == "blocked":
				wantBlocked = []string{*c.ReportedAs}
			case *c.OverrideRejection == "invalid":
				wantInvalid = []string{*c.ReportedAs}
			default:
				t.Fatalf("unknown overrideRejection %q", *c.OverrideRejection)
			}
			if !sameList(blocked, wantBlocked) || !sameList(invalid, wantInvalid) {
				t.Errorf("InspectEnvOverrides = blocked %q invalid %q, want blocked %q invalid %q", blocked, invalid, wantBlocked, wantInvalid)
			}
			err := ValidateHostEnvOverrides(env)
			if (err != nil) != c.DangerousOverride {
				t.Errorf("ValidateHostEnvOverrides = %v, dangerousOverride %v", err, c.DangerousOverride)
			}
			_, sb, si := SanitizeHostEnv(nil, env, true)
			if !sameList(sb, wantBlocked) || !sameList(si, wantInvalid) {
				t.Errorf("SanitizeHostEnv rejected blocked %q invalid %q, want %q %q", sb, si, wantBlocked, wantInvalid)
			}

			// As an inherited variable with value "x".
			got, _, _ := SanitizeHostEnv(map[string]string{c.Key: "x"}, nil, true)
			key := jsTrim(c.Key)
			_, kept := got[key]
			if dropped := key != "" && !kept; dropped != c.DangerousInherited {
				t.Errorf("inherited %q dropped = %v, want %v (env %v)", c.Key, dropped, c.DangerousInherited, got)
			}
		})
	}
}

func TestSanitizeHostEnvConformance(t *testing.T) {
	fx := loadHostEnv(t)
	for _, c := range fx.Sanitize {
		t.Run(c.Name, func(t *testing.T) {
			blockPath := true
			if c.BlockPathOverrides != nil {
				blockPath = *c.BlockPathOverrides
			}
			base := maps.Clone(c.BaseEnv)
			overrides := maps.Clone(c.Overrides)
			env, blocked, invalid := SanitizeHostEnv(c.BaseEnv, c.Overrides, blockPath)
			if !maps.Equal(env, c.ResultEnv) {
				t.Errorf("env\n got %q\nwant %q", env, c.ResultEnv)
			}
			if !sameList(blocked, c.RejectedOverrideBlockedKeys) {
				t.Errorf("rejected blocked = %q, want %q", blocked, c.RejectedOverrideBlockedKeys)
			}
			if !sameList(invalid, c.RejectedOverrideInvalidKeys) {
				t.Errorf("rejected invalid = %q, want %q", invalid, c.RejectedOverrideInvalidKeys)
			}
			if !maps.Equal(base, c.BaseEnv) || !maps.Equal(overrides, c.Overrides) {
				t.Errorf("SanitizeHostEnv modified its inputs")
			}
			if blockPath {
				b, i := InspectEnvOverrides(c.Overrides)
				if !sameList(b, c.RejectedOverrideBlockedKeys) || !sameList(i, c.RejectedOverrideInvalidKeys) {
					t.Errorf("InspectEnvOverrides = %q %q, want %q %q", b, i, c.RejectedOverrideBlockedKeys, c.RejectedOverrideInvalidKeys)
				}
			}
		})
	}
}

func TestValidateHostEnvOverridesConformance(t *testing.T) {
	fx := loadHostEnv(t)
	for _, c := range fx.ExecOverrideErrors {
		name := strings.Join(slices.Sorted(maps.Keys(c.Env)), ",")
		t.Run(name, func(t *testing.T) {
			err := ValidateHostEnvOverrides(c.Env)
			if c.Error == nil {
				// OpenClaw ran the command (status and text are the run's).
				if err != nil {
					t.Fatalf("ValidateHostEnvOverrides = %v, want nil (OpenClaw ran it: %s %q)", err, c.Status, c.Text)
				}
				env, blocked, invalid := SanitizeHostEnv(nil, c.Env, true)
				if len(blocked) != 0 || len(invalid) != 0 {
					t.Errorf("SanitizeHostEnv rejected %q %q", blocked, invalid)
				}
				for k := range c.Env {
					if _, ok := env[k]; !ok {
						t.Errorf("accepted override %q missing from %q", k, env)
					}
				}
				return
			}
			assertSecurityViolation(t, err, *c.Error)
		})
	}
}

func assertSecurityViolation(t *testing.T, err error, want string) {
	t.Helper()
	var pe *Error
	if !errors.As(err, &pe) {
		t.Fatalf("error = %v (%T), want *Error %q", err, err, want)
	}
	if pe.Type != ErrSecurityViolation || pe.Type.HTTPStatus() != http.StatusBadRequest {
		t.Errorf("error type = %q (HTTP %d), want %q (400)", pe.Type, pe.Type.HTTPStatus(), ErrSecurityViolation)
	}
	if pe.Message != want {
		t.Errorf("message\n got %q\nwant %q", pe.Message, want)
	}
}

// Spec §23.8, cases 76–81 (src/infra/host-env-security.test.ts).
func TestHostEnvSpecCases(t *testing.T) {
	t.Run("76 dangerous everywhere", func(t *testing.T) {
		for _, k := range []string{"BASH_ENV", "bash_env", "BROWSER", "SHELL", "GIT_EDITOR", "git_work_tree",
			"CC", "cxx", "RUSTC_WRAPPER", "SHELLOPTS", "ps4", "DYLD_INSERT_LIBRARIES", "ld_preload",
			"BASH_FUNC_echo%%", "JAVA_OPTS", "GLIBC_TUNABLES", "MAKEFLAGS", "NODE_V8_COVERAGE", "HGRCPATH",
			"BASHOPTS", "FPATH", "KSH_ENV", "TCLLIBPATH", "VIMINIT", "LUA_INIT_5_4", "HOSTALIASES", "CONFIG_SITE",
			"ERL_AFLAGS", "R_PROFILE_USER"} {
			if !IsDangerousHostEnvVarName(k) {
				t.Errorf("IsDangerousHostEnvVarName(%q) = false", k)
			}
		}
	})
	t.Run("77 not dangerous everywhere", func(t *testing.T) {
		for _, k := range []string{"KUBECONFIG", "AWS_CONFIG_FILE", "HTTPS_PROXY", "no_proxy", "SSL_CERT_FILE",
			"DOCKER_HOST", "CARGO_REGISTRIES_CRATES_IO_INDEX", "PATH", "FOO", "GRADLE_USER_HOME",
			"ANSIBLE_CONFIG", "TF_CLI_CONFIG_FILE"} {
			if IsDangerousHostEnvVarName(k) {
				t.Errorf("IsDangerousHostEnvVarName(%q) = true", k)
			}
		}
	})
	t.Run("78 inherited", func(t *testing.T) {
		for _, k := range []string{"ANSIBLE_CONFIG", "TF_CLI_CONFIG_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI"} {
			if !IsDangerousHostInheritedEnvVarName(k) {
				t.Errorf("IsDangerousHostInheritedEnvVarName(%q) = false", k)
			}
		}
		for _, k := range []string{"TF_VAR_admin_cidr", "KUBECONFIG", "SSH_AUTH_SOCK", "DOCKER_CONTEXT",
			"GIT_CONFIG_GLOBAL", "NPM_CONFIG_USERCONFIG", "HOME", "HTTP_PROXY"} {
			if IsDangerousHostInheritedEnvVarName(k) {
				t.Errorf("IsDangerousHostInheritedEnvVarName(%q) = true", k)
			}
		}
	})
	t.Run("79 sanitize base", func(t *testing.T) {
		base := map[string]string{
			"PATH": "/usr/bin:/bin", "OK": "1", "NODE_OPTIONS": "--require evil", "LD_PRELOAD": "evil.so",
			"BASH_ENV": "x", "GIT_SSH_COMMAND": "evil", "EDITOR": "vim", "GITHUB_TOKEN": "t",
			"AWS_CONFIG_FILE": "/c", "KUBECONFIG": "/k", "GOOGLE_APPLICATION_CREDENTIALS": "/g",
			"AWS_SHARED_CREDENTIALS_FILE": "/s", "AWS_WEB_IDENTITY_TOKEN_FILE": "/w", "AZURE_AUTH_LOCATION": "/a",
			"SSH_AUTH_SOCK": "/sock", "HTTP_PROXY": "http://p", "HTTPS_PROXY": "http://p", "SSL_CERT_FILE": "/cert",
			"SSL_CERT_DIR": "/certs", "DOCKER_CONTEXT": "ctx", "DOCKER_HOST": "unix:///d", "ANSIBLE_CONFIG": "/ans",
		}
		env, _, _ := SanitizeHostEnv(base, nil, true)
		want := []string{"AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
			"AZURE_AUTH_LOCATION", "DOCKER_CONTEXT", "DOCKER_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "HTTPS_PROXY",
			"HTTP_PROXY", "KUBECONFIG", "OK", "OPENCLAW_CLI", "PATH", "SSH_AUTH_SOCK", "SSL_CERT_DIR", "SSL_CERT_FILE"}
		if got := slices.Sorted(maps.Keys(env)); !slices.Equal(got, want) {
			t.Errorf("keys\n got %q\nwant %q", got, want)
		}
		if env["OPENCLAW_CLI"] != "1" || env["PATH"] != "/usr/bin:/bin" {
			t.Errorf("env = %q", env)
		}
	})
	t.Run("80 overrides keep trusted base", func(t *testing.T) {
		base := map[string]string{"PATH": "/usr/bin:/bin", "HOME": "/tmp/trusted-home",
			"CARGO_REGISTRIES_CRATES_IO_INDEX": "https://index.crates.io"}
		overrides := map[string]string{"PATH": "/tmp/evil", "HOME": "/tmp/evil-home",
			"CARGO_REGISTRIES_CRATES_IO_INDEX": "https://evil", "SAFE": "ok", "BASH_ENV": "/tmp/x",
			"GIT_SSH_COMMAND": "evil", "NPM_CONFIG_USERCONFIG": "/tmp/npmrc"}
		env, blocked, _ := SanitizeHostEnv(base, overrides, true)
		want := map[string]string{"PATH": "/usr/bin:/bin", "HOME": "/tmp/trusted-home",
			"CARGO_REGISTRIES_CRATES_IO_INDEX": "https://index.crates.io", "SAFE": "ok", "OPENCLAW_CLI": "1"}
		if !maps.Equal(env, want) {
			t.Errorf("env\n got %q\nwant %q", env, want)
		}
		wantBlocked := []string{"BASH_ENV", "CARGO_REGISTRIES_CRATES_IO_INDEX", "GIT_SSH_COMMAND", "HOME",
			"NPM_CONFIG_USERCONFIG", "PATH"}
		if !slices.Equal(blocked, wantBlocked) {
			t.Errorf("blocked = %q, want %q", blocked, wantBlocked)
		}
	})
	t.Run("81 exec errors", func(t *testing.T) {
		for _, c := range []struct {
			env  map[string]string
			want string
		}{
			{map[string]string{"PATH": "/x"}, "Security Violation: Custom 'PATH' variable is forbidden during host execution."},
			{map[string]string{"LD_PRELOAD": "x"}, "Security Violation: Environment variable 'LD_PRELOAD' is forbidden during host execution."},
			{map[string]string{"PATH": "x", "LD_PRELOAD": "y"}, "Security Violation: Custom 'PATH' variable is forbidden during host execution (blocked override keys: LD_PRELOAD, PATH)."},
			{map[string]string{"BAD-KEY": "1"}, "Security Violation: invalid non-portable override keys: BAD-KEY."},
		} {
			assertSecurityViolation(t, ValidateHostEnvOverrides(c.env), c.want)
		}
	})
}

// Edge cases beyond the fixture. The expected values were obtained by
// calling OpenClaw 2026.9.6's own sanitizeHostExecEnvWithDiagnostics and
// predicates (the OpenClaw install of bench/openclaw/setup.sh).
func TestSanitizeHostEnvOracleEdgeCases(t *testing.T) {
	cases := []struct {
		name       string
		base, over map[string]string
		want       map[string]string
		blocked    []string
		invalid    []string
	}{
		{name: "BOM is trimmed like JavaScript trim", base: map[string]string{"\ufeffFOO\ufeff": "bom"},
			want: map[string]string{"FOO": "bom"}},
		{name: "NEL is not trimmed", base: map[string]string{"FOO\u0085": "nel"},
			want: map[string]string{"FOO\u0085": "nel"}},
		{name: "NBSP and ideographic space are trimmed", base: map[string]string{"\u00a0BAR\u3000": "nbsp"},
			want: map[string]string{"BAR": "nbsp"}},
		{name: "ligature upper-cases to CFLAGS", base: map[string]string{"C\ufb02ags": "x"},
			want: map[string]string{}},
		{name: "dotless i and long s upper-case to ASCII", base: map[string]string{"ıFS": "i", "ſHELL": "s", "\ufb06": "st"},
			want: map[string]string{"\ufb06": "st"}},
		{name: "GIT_ALLOW_PROTOCOL entries are matched exactly", base: map[string]string{"GIT_ALLOW_PROTOCOL": " HTTPS:https: ssh :git:git:file "},
			want: map[string]string{"GIT_ALLOW_PROTOCOL": "https:git:git"}},
		{name: "lower-case git_allow_protocol is rewritten, case kept", base: map[string]string{"git_allow_protocol": "ext:ssh"},
			want: map[string]string{"git_allow_protocol": "ssh"}},
		{name: "GIT_PROTOCOL_FROM_USER +1", base: map[string]string{"GIT_PROTOCOL_FROM_USER": "+1"},
			want: map[string]string{"GIT_PROTOCOL_FROM_USER": "0"}},
		{name: "GIT_PROTOCOL_FROM_USER +-1 kept", base: map[string]string{"GIT_PROTOCOL_FROM_USER": "+-1"},
			want: map[string]string{"GIT_PROTOCOL_FROM_USER": "+-1"}},
		{name: "GIT_PROTOCOL_FROM_USER On", base: map[string]string{"GIT_PROTOCOL_FROM_USER": "On"},
			want: map[string]string{"GIT_PROTOCOL_FROM_USER": "0"}},
		{name: "GIT_PROTOCOL_FROM_USER 1.0 kept", base: map[string]string{"GIT_PROTOCOL_FROM_USER": "1.0"},
			want: map[string]string{"GIT_PROTOCOL_FROM_USER": "1.0"}},
		{name: "GIT_PROTOCOL_FROM_USER 0x1 kept", base: map[string]string{"GIT_PROTOCOL_FROM_USER": "0x1"},
			want: map[string]string{"GIT_PROTOCOL_FROM_USER": "0x1"}},
		{name: "GIT_PROTOCOL_FROM_USER -0 kept", base: map[string]string{"GIT_PROTOCOL_FROM_USER": "-0"},
			want: map[string]string{"GIT_PROTOCOL_FROM_USER": "-0"}},
		{name: "GIT_PROTOCOL_FROM_USER Arabic digit kept", base: map[string]string{"GIT_PROTOCOL_FROM_USER": "١"},
			want: map[string]string{"GIT_PROTOCOL_FROM_USER": "١"}},
		{name: "GIT_PROTOCOL_FROM_USER empty kept", base: map[string]string{"GIT_PROTOCOL_FROM_USER": ""},
			want: map[string]string{"GIT_PROTOCOL_FROM_USER": ""}},
		{name: "git_protocol_from_user YES", base: map[string]string{"git_protocol_from_user": "YES"},
			want: map[string]string{"git_protocol_from_user": "0"}},
		{name: "blocked prefixes any case", base: map[string]string{"ld_library_path": "/x", "Bash_Func_x%%": "y", "dyld_x": "z"},
			want: map[string]string{}},
		{name: "mixed-case inherited keys", base: map[string]string{"lua_init": "x", "Gem_Path": "y", "home": "h"},
			want: map[string]string{"home": "h"}},
		{name: "pager overrides any case, MANPAGER blocked", over: map[string]string{"pager": "cat", "Git_Pager": "", "MANPAGER": ""},
			want: map[string]string{"pager": "", "Git_Pager": ""}, blocked: []string{"MANPAGER"}},
		{name: "PAGER CAT blocked", over: map[string]string{"PAGER": "CAT"}, want: map[string]string{}, blocked: []string{"PAGER"}},
		{name: "PAGER ' cat' blocked", over: map[string]string{"PAGER": " cat"}, want: map[string]string{}, blocked: []string{"PAGER"}},
		{name: "override keys trimmed like JavaScript", over: map[string]string{"\ufeffFOO": "1", "FOO\u0085": "2", "\u00a0": "3"},
			want: map[string]string{"FOO": "1"}, invalid: []string{"FOO\u0085", "\u00a0"}},
		{name: "invalid keys sorted by UTF-16 code units", over: map[string]string{"𝒜": "1", "\ue000": "2", "Z-": "3", "a-": "4", "_-": "5", "(x)": "6", "X(": "7"},
			want: map[string]string{"X(": "7"}, invalid: []string{"(x)", "Z-", "_-", "a-", "𝒜", "\ue000"}},
		{name: "Windows-style keys", over: map[string]string{"Path": "/x", "PATH()": "y", "LD_()": "z"},
			want: map[string]string{"PATH()": "y"}, blocked: []string{"LD_()", "PATH"}},
		{name: "cargo target pattern", over: map[string]string{"cargo_target_x_linker": "1", "CARGO_TARGET__LINKER": "2",
			"CARGO_TARGET___LINKER": "3", "CARGO_TARGET_X_LINKER_": "4", "CARGO_TARGET_(X)_RUNNER": "5", "CARGO_TARGET_X_RUNNER()": "6"},
			want:    map[string]string{"CARGO_TARGET__LINKER": "2", "CARGO_TARGET_X_LINKER_": "4", "CARGO_TARGET_(X)_RUNNER": "5", "CARGO_TARGET_X_RUNNER()": "6"},
			blocked: []string{"CARGO_TARGET_X_LINKER", "CARGO_TARGET___LINKER"}},
		{name: "OPENCLAW_CLI override", over: map[string]string{"OPENCLAW_CLI": "0"}, want: map[string]string{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env, blocked, invalid := SanitizeHostEnv(c.base, c.over, true)
			want := maps.Clone(c.want)
			want["OPENCLAW_CLI"] = "1"
			if !maps.Equal(env, want) {
				t.Errorf("env\n got %q\nwant %q", env, want)
			}
			if !sameList(blocked, c.blocked) || !sameList(invalid, c.invalid) {
				t.Errorf("rejected blocked %q invalid %q, want %q %q", blocked, invalid, c.blocked, c.invalid)
			}
		})
	}

	for _, c := range []struct {
		key                           string
		everywhere, override, inherit bool
	}{
		{"\ufeffLD_PRELOAD", true, false, true},
		{"ld_preload\u0085", true, false, true},
		{"C\ufb02ags", false, true, true},
		{"ſhell", true, false, true},
		{"GIT_ALLOW_PROTOCOL", true, false, true},
		{" ", false, false, false},
		{"CARGO_TARGET_X_RUNNER", false, true, false},
	} {
		if got := IsDangerousHostEnvVarName(c.key); got != c.everywhere {
			t.Errorf("IsDangerousHostEnvVarName(%q) = %v", c.key, got)
		}
		if got := IsDangerousHostEnvOverrideVarName(c.key); got != c.override {
			t.Errorf("IsDangerousHostEnvOverrideVarName(%q) = %v", c.key, got)
		}
		if got := IsDangerousHostInheritedEnvVarName(c.key); got != c.inherit {
			t.Errorf("IsDangerousHostInheritedEnvVarName(%q) = %v", c.key, got)
		}
	}
}

func TestSanitizeHostEnvPrefersExactKeys(t *testing.T) {
	// JavaScript would apply colliding keys in insertion order; a Go map
	// has none, so the key that needed no trimming wins, every time.
	for range 20 {
		env, _, _ := SanitizeHostEnv(
			map[string]string{" FOO": "padded-1", "FOO ": "padded-2", "FOO": "exact", "\tBAR": "only-padded"},
			map[string]string{" X ": "padded", "X": "exact"}, true)
		want := map[string]string{"FOO": "exact", "BAR": "only-padded", "X": "exact", "OPENCLAW_CLI": "1"}
		if !maps.Equal(env, want) {
			t.Fatalf("env = %q, want %q", env, want)
		}
	}
}

func TestValidateHostEnvOverridesEmpty(t *testing.T) {
	for _, env := range []map[string]string{nil, {}, {"FOO": "bar", "TERM": "xterm", "LC_ALL": "C"}} {
		if err := ValidateHostEnvOverrides(env); err != nil {
			t.Errorf("ValidateHostEnvOverrides(%q) = %v", env, err)
		}
		if b, i := InspectEnvOverrides(env); b != nil || i != nil {
			t.Errorf("InspectEnvOverrides(%q) = %q %q, want nil nil", env, b, i)
		}
	}
}

func TestCargoTargetPatternMatchesRegexp(t *testing.T) {
	re := regexp.MustCompile(blockedOverridePattern)
	keys := []string{"CARGO_TARGET_X_LINKER", "CARGO_TARGET_X_RUNNER", "CARGO_TARGET__LINKER", "CARGO_TARGET___LINKER",
		"CARGO_TARGET_LINKER", "CARGO_TARGET_X_LINKERS", "CARGO_TARGET_X-Y_RUNNER", "CARGO_TARGET_X_Y_Z_RUNNER",
		"CARGO_TARGET_DIR", "CARGO_TARGET_", "XCARGO_TARGET_A_LINKER", "CARGO_TARGET_A_LINKER\n", "CARGO_TARGET_É_RUNNER",
		"CARGO_TARGET_1_RUNNER", "CARGO_TARGET__RUNNER_RUNNER", ""}
	for _, k := range keys {
		if got, want := isCargoTargetExecutableKey(k), re.MatchString(k); got != want {
			t.Errorf("isCargoTargetExecutableKey(%q) = %v, regexp says %v", k, got, want)
		}
	}
}

func TestFilterShellWrapperEnvOverrides(t *testing.T) {
	// Expected value from OpenClaw's sanitizeSystemRunEnvOverrides
	// ({shellWrapper: true}).
	got := FilterShellWrapperEnvOverrides(map[string]string{"TERM": "x", "lc_foo": "y", "LANG ": "z",
		"PAGER": "cat", "git_pager": "less", "FOO": "1", "BAD-KEY": "2", "OPENCLAW_SUBAGENT_EXEC": "1", "NO_COLOR": "1"})
	want := map[string]string{"TERM": "x", "lc_foo": "y", "LANG": "z", "PAGER": "", "OPENCLAW_SUBAGENT_EXEC": "1", "NO_COLOR": "1"}
	if !maps.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := FilterShellWrapperEnvOverrides(map[string]string{"FOO": "1"}); got != nil {
		t.Errorf("got %q, want nil", got)
	}
	if got := FilterShellWrapperEnvOverrides(nil); got != nil {
		t.Errorf("got %q, want nil", got)
	}
}

func TestEnvMapAndList(t *testing.T) {
	m := EnvMap([]string{"B=2", "A=1", "EMPTY=", "NOEQ", "=C:=C:\\dir", "=", "X=a=b", "A=again"})
	want := map[string]string{"A": "again", "B": "2", "EMPTY": "", "=C:": "C:\\dir", "X": "a=b"}
	if !maps.Equal(m, want) {
		t.Errorf("EnvMap = %q, want %q", m, want)
	}
	list := EnvList(m)
	wantList := []string{"=C:=C:\\dir", "A=again", "B=2", "EMPTY=", "X=a=b"}
	if !slices.Equal(list, wantList) {
		t.Errorf("EnvList = %q, want %q", list, wantList)
	}
	if back := EnvMap(list); !maps.Equal(back, m) {
		t.Errorf("round trip = %q, want %q", back, m)
	}
	if got := EnvList(nil); len(got) != 0 {
		t.Errorf("EnvList(nil) = %q", got)
	}
}

func TestJSHelpers(t *testing.T) {
	if got := jsTrim("\ufeff\u00a0\u2000 x \u200a\u3000\u2028\u2029\u202f\u205f\u1680\t\n\v\f\r"); got != "x" {
		t.Errorf("jsTrim = %q", got)
	}
	for _, s := range []string{"\u0085x", "x\u200b", "x\u180e"} {
		if got := jsTrim(s); got != s {
			t.Errorf("jsTrim(%q) = %q, want unchanged", s, got)
		}
	}
	for in, want := range map[string]string{"abc_1": "ABC_1", "straße": "STRASSE", "\ufb00\ufb01\ufb02\ufb03\ufb04\ufb05": "FFFIFLFFIFFLST",
		"ıſ": "IS", "K": "K"} {
		if got := jsToUpper(in); got != want {
			t.Errorf("jsToUpper(%q) = %q, want %q", in, got, want)
		}
	}
	// UTF-16 order puts supplementary characters (surrogates D800–DFFF)
	// before U+E000–U+FFFF, unlike byte order.
	list := []string{"\uffff", "b", "𝒜", "a", "\ue000", "a", "", "ab"}
	got := sortUniqueJS(list)
	want := []string{"", "a", "ab", "b", "𝒜", "\ue000", "\uffff"}
	if !slices.Equal(got, want) {
		t.Errorf("sortUniqueJS = %q, want %q", got, want)
	}
	if c := compareUTF16("\xff", "\xfe"); c <= 0 {
		t.Errorf("compareUTF16 of distinct invalid bytes = %d, want > 0", c)
	}
}

// TestExecmeshEnvAdditions: execmesh's own request-env blocklist refuses
// what makes an allowlisted tool run a program or write
// a file, on top of OpenClaw's lists, which stay as OpenClaw ships them
// (TestHostEnvPolicyLists); the daemon's own environment keeps these keys.
func TestExecmeshEnvAdditions(t *testing.T) {
	for _, table := range [][]string{execmeshBlockedOverrideKeys, execmeshBlockedOverridePrefixes, execmeshBlockedOverrideSuffixes, execmeshAllowedOverrideKeys} {
		if !slices.IsSorted(table) || len(slices.Compact(slices.Clone(table))) != len(table) {
			t.Errorf("table not strictly sorted: %q", table)
		}
	}
	blocked := []string{"LESS", "LESSOPEN", "lesskey", "LESSSECURE", "GIT_TRACE", "GIT_TRACE2_EVENT", "GIT_TRACE_PACKET",
		"GIT_CONFIG", "GIT_CONFIG_PARAMETERS", "GIT_SSH_VARIANT", "GIT_REDIRECT_STDOUT", "GIT_TEST_FSMONITOR",
		"GIT_MAN_VIEWER", "PERLLIB", "PERL5DB", "PERLIO", "PYTHONSTARTUP", "PYTHONWARNINGS", "PYTHONPYCACHEPREFIX",
		"RUBYOPT", "RUBY_YJIT_ENABLE", "LOCPATH", "NLSPATH", "TEXTDOMAINDIR", "TAR_OPTIONS", "TAPE", "MANOPT",
		"MANROFFOPT", "GROFF_TMAC_PATH", "SYSTEMD_PAGER", "GH_PAGER", "PSQL_PAGER", "SYSTEMD_EDITOR", "CVS_RSH",
		"RSYNC_RSH", "SSH_ASKPASS", "X_ASKPASS", "AWKPATH", "AWKLIBPATH", "VIMRUNTIME", "ASAN_OPTIONS", "PS1", "INPUTRC"}
	for _, k := range blocked {
		if !IsExecmeshBlockedOverrideVarName(k) && !IsDangerousHostEnvVarName(k) && !IsDangerousHostEnvOverrideVarName(k) {
			t.Errorf("%s is not blocked by any list", k)
		}
		err := ValidateHostEnvOverrides(map[string]string{k: "x"})
		want := "Security Violation: Environment variable '" + strings.ToUpper(k) + "' is forbidden during host execution."
		if err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", k, err, want)
		}
		if env, _, _ := SanitizeHostEnv(map[string]string{k: "x"}, nil, true); env[k] != "x" && !IsDangerousHostInheritedEnvVarName(k) {
			t.Errorf("%s dropped from the inherited environment", k)
		}
	}
	for _, k := range []string{"PAGER", "GIT_PAGER"} {
		if err := ValidateHostEnvOverrides(map[string]string{k: "cat"}); err != nil {
			t.Errorf("%s=cat: %v (OpenClaw's exception must stay)", k, err)
		}
	}
	for _, k := range []string{"PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "LANG", "LC_ALL", "TERM", "GIT_AUTHOR_NAME", "GIT_COMMITTER_EMAIL", "FOO", "NODE_ENV", "TZ"} {
		if err := ValidateHostEnvOverrides(map[string]string{k: "1"}); err != nil {
			t.Errorf("%s: %v", k, err)
		}
	}
	// OpenClaw's predicates are unchanged: LESS is not in its lists.
	if IsDangerousHostEnvVarName("LESS") || IsDangerousHostEnvOverrideVarName("LESS") {
		t.Error("OpenClaw's predicates report an execmesh addition")
	}
}
