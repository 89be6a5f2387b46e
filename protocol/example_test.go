package protocol_test

import (
	"fmt"

	"github.com/execmesh/execmesh/protocol"
)

// A host exec request is refused before anything runs when its env sets
// PATH, a loader or interpreter hook, a credential or configuration
// variable, or a key that is not a portable name.
func ExampleValidateHostEnvOverrides() {
	for _, env := range []map[string]string{
		{"GREETING": "hi", "PAGER": "cat"},
		{"PATH": "/tmp/evil"},
		{"ld_preload": "/tmp/evil.so"},
		{"HOME": "/h", "EDITOR": "vim", "BAD-KEY": "1"},
		{"PATH": "/x", "NODE_OPTIONS": "--require evil"},
	} {
		if err := protocol.ValidateHostEnvOverrides(env); err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println("ok")
	}
	// Output:
	// ok
	// Security Violation: Custom 'PATH' variable is forbidden during host execution.
	// Security Violation: Environment variable 'LD_PRELOAD' is forbidden during host execution.
	// Security Violation: blocked override keys: EDITOR, HOME; invalid non-portable override keys: BAD-KEY.
	// Security Violation: Custom 'PATH' variable is forbidden during host execution (blocked override keys: NODE_OPTIONS, PATH).
}

// The daemon's own environment is filtered before a command inherits it,
// then the request's accepted overrides are applied.
func ExampleSanitizeHostEnv() {
	base := map[string]string{
		"PATH":               "/usr/bin:/bin",
		"HOME":               "/home/op",
		"NODE_OPTIONS":       "--require /tmp/hook.js",
		"GITHUB_TOKEN":       "secret",
		"GIT_ALLOW_PROTOCOL": "file:https:ssh",
	}
	env, blocked, _ := protocol.SanitizeHostEnv(base, map[string]string{"GREETING": "hi", "HOME": "/tmp"}, true)
	for _, kv := range protocol.EnvList(env) {
		fmt.Println(kv)
	}
	fmt.Println("rejected:", blocked)
	// Output:
	// GIT_ALLOW_PROTOCOL=https:ssh
	// GREETING=hi
	// HOME=/home/op
	// OPENCLAW_CLI=1
	// PATH=/usr/bin:/bin
	// rejected: [HOME]
}

func ExampleMergePathPrepend() {
	fmt.Println(protocol.MergePathPrepend([]string{"/custom/bin", " /opt/oss/bin ", ""}, "/usr/bin:/custom/bin"))
	// Output: /custom/bin:/opt/oss/bin:/usr/bin
}

func ExampleSubjects() {
	s := protocol.Subjects(protocol.DefaultSubjectPrefix)
	fmt.Println(s.Invoke)
	fmt.Println(s.Node("build-1", protocol.NodeEndpointExec))
	fmt.Println(s.GatewayEventsFor("agent:main:main"))
	// Output:
	// execmesh.gw.invoke
	// execmesh.node.build-1.exec
	// execmesh.gw.events.YWdlbnQ6bWFpbjptYWlu
}
