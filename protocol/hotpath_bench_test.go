package protocol

import (
	"encoding/json"
	"slices"
	"testing"
)

// Micro-benchmarks of per-call protocol work, each with a baseline
// ("baseline") that does the least the same job needs. `make bench` runs
// them; alone:
//
//	go test -run '^$' -bench 'Benchmark(EnvFilter|DecodeExecArgs)' -benchmem ./protocol

// benchEnviron is a daemon environment of typical size.
var benchEnviron = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/home/dev", "USER=dev",
	"LOGNAME=dev", "SHELL=/bin/bash", "LANG=en_US.UTF-8", "LC_ALL=en_US.UTF-8", "TERM=xterm-256color",
	"PWD=/home/dev/src", "OLDPWD=/home/dev", "EDITOR=vim", "PAGER=less", "LESS=-R", "TZ=UTC",
	"XDG_RUNTIME_DIR=/run/user/1000", "XDG_CONFIG_HOME=/home/dev/.config", "XDG_CACHE_HOME=/home/dev/.cache",
	"GOPATH=/home/dev/go", "GOFLAGS=-mod=mod", "CARGO_HOME=/home/dev/.cargo", "NVM_DIR=/home/dev/.nvm",
	"NODE_OPTIONS=--max-old-space-size=4096", "PYTHONPATH=/home/dev/lib", "SSH_AUTH_SOCK=/tmp/ssh-agent.sock",
	"DISPLAY=:0", "COLORTERM=truecolor", "HISTSIZE=10000", "HOSTNAME=devbox", "MAIL=/var/mail/dev",
	"SHLVL=1", "LS_COLORS=rs=0:di=01;34:ln=01;36:mh=00:pi=40;33", "DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus",
	"GIT_EDITOR=vim", "MANPATH=/usr/share/man", "JAVA_HOME=/usr/lib/jvm/default", "BASH_ENV=/home/dev/.bashenv",
	"LD_LIBRARY_PATH=/opt/lib", "VISUAL=vim", "EXECMESH_STATE_DIR=/home/dev/.execmesh", "_=/usr/bin/execmesh",
}

var benchOverrides = map[string]string{"NODE_ENV": "production", "FOO": "bar", "CI": "1"}

// BenchmarkEnvFilter: building a gateway-host command's environment
// (override validation, inherited-env sanitising, the list form), against
// copying the environment and appending the overrides unfiltered.
func BenchmarkEnvFilter(b *testing.B) {
	b.Run("host-env/execmesh", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := ValidateHostEnvOverrides(benchOverrides); err != nil {
				b.Fatal(err)
			}
			env, _, _ := SanitizeHostEnv(EnvMap(benchEnviron), benchOverrides, true)
			if len(EnvList(env)) == 0 {
				b.Fatal("empty env")
			}
		}
	})
	b.Run("host-env/baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			env := slices.Grow(slices.Clone(benchEnviron), len(benchOverrides))
			for k, v := range benchOverrides {
				env = append(env, k+"="+v)
			}
			if len(env) == 0 {
				b.Fatal("empty env")
			}
		}
	})
}

// BenchmarkDecodeExecArgs: strict decoding of exec arguments (unknown keys
// refused with hints, numbers clamped), against encoding/json into the
// same struct.
func BenchmarkDecodeExecArgs(b *testing.B) {
	raw := []byte(`{"command":"npm run build -- --watch=false","workdir":"/home/dev/src/app","env":{"NODE_ENV":"production","CI":"1"},"yieldMs":2000,"timeout":600,"host":"node","node":"build-1"}`)
	b.Run("exec/execmesh", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeExecArgs(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("exec/baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var a ExecArgs
			if err := json.Unmarshal(raw, &a); err != nil {
				b.Fatal(err)
			}
		}
	})
}
