package gateway

import (
	"fmt"
	"slices"
	"strings"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/protocol"
)

// Effective hosts.
const (
	hostSandbox = "sandbox"
	hostGateway = "gateway"
	hostNode    = "node"
)

// configuredHost is the agent's tools.exec.host, else the global one.
func configuredHost(cfg *config.Config, agentID string) string {
	if a, ok := cfg.Agent(agentID); ok && a.Tools.Exec.Host != "" {
		return a.Tools.Exec.Host
	}
	if cfg.Tools.Exec.Host == "" {
		return "auto"
	}
	return cfg.Tools.Exec.Host
}

// parseRequestedHost normalises a per-call host; "" and "auto" mean "not
// requested".
func parseRequestedHost(v string) (string, error) {
	h := strings.ToLower(strings.TrimSpace(v))
	if h == "" || h == "auto" {
		return "", nil
	}
	if !config.ValidHost(h) {
		return "", protocol.Errorf(protocol.ErrInvalidRequest, "Invalid exec host %q. Allowed values: auto, sandbox, gateway, node.", v)
	}
	return h, nil
}

// resolveHost applies spec §4: a requested host may differ from the
// configured one only when that is auto, and then not gateway or node
// while a sandbox runtime is active. elevated moves everything but node to
// the gateway. host=sandbox without a sandbox runtime is refused. The
// result is the effective host: sandbox, gateway or node.
func resolveHost(configured, requested string, sandboxAvailable, elevated bool) (string, error) {
	if requested != "" && requested != configured {
		allowed := configured == "auto" && !(sandboxAvailable && (requested == hostGateway || requested == hostNode))
		if !allowed {
			var list []string
			switch {
			case configured == "auto" && sandboxAvailable:
				list = []string{requested}
			default:
				list = []string{requested, "auto"}
			}
			return "", protocol.Errorf(protocol.ErrHostNotAllowed,
				"exec host not allowed (requested %s; configured host is %s; set tools.exec.host=%s to allow this override).",
				requested, configured, strings.Join(list, " or "))
		}
	}
	selected := configured
	if requested != "" {
		selected = requested
	}
	if elevated && selected != hostNode {
		selected = hostGateway
	}
	if selected == "auto" {
		if sandboxAvailable {
			return hostSandbox, nil
		}
		return hostGateway, nil
	}
	if selected == hostSandbox && !sandboxAvailable {
		// DESIGN.md §3.3: no request runs with less policy than
		// host=gateway applies unless a real sandbox contains it.
		return "", host.SandboxOffError()
	}
	return selected, nil
}

// resolveTarget is the host of a call that may name a node (exec,
// apply_patch), for every front end alike (HTTP, NATS, the CLI, MCP, the
// control page): DESIGN.md §3.3. A command never runs on another machine
// than the caller named. requested is the call's host as
// parseRequestedHost gives it, or the session's default host; node is the
// call's own node, trimmed. A node given while the host is auto (neither
// the call, the session nor the configuration chose one, and no sandbox
// runtime makes auto mean sandbox) means host=node. A node given while the
// host resolves to the gateway or the sandbox is refused, since running
// there would silently ignore it. Whether the node exists is the node
// registry's check (nodes.Registry.Select), made before anything runs.
func resolveTarget(configured, requested, node string, sandboxAvailable, elevated bool) (string, error) {
	if node != "" && requested == "" && configured == "auto" && !sandboxAvailable {
		requested = hostNode
	}
	target, err := resolveHost(configured, requested, sandboxAvailable, elevated)
	if err != nil {
		return "", err
	}
	if node != "" && target != hostNode {
		return "", protocol.Errorf(protocol.ErrHostNotAllowed, "exec host not allowed (node %q given, but host resolves to %s)", node, target)
	}
	return target, nil
}

// elevatedError names the failing gate (spec §5.3).
func elevatedError(gate, runtime, sessionKey string) error {
	lines := []string{fmt.Sprintf("elevated is not available right now (runtime=%s).", runtime)}
	switch gate {
	case "enabled":
		lines = append(lines, "Failing gates: enabled (tools.elevated.enabled / agents.list[].tools.elevated.enabled)")
	default:
		lines = append(lines, "Failing gates: allowFrom (tools.elevated.allowFrom / agents.list[].tools.elevated.allowFrom)")
	}
	lines = append(lines,
		fmt.Sprintf("Context: session=%s", sessionKey),
		"Fix-it keys:",
		"- tools.elevated.enabled",
		"- tools.elevated.allowFrom",
		"- agents.list[].tools.elevated.enabled",
	)
	return protocol.Errorf(protocol.ErrHostNotAllowed, "%s", strings.Join(lines, "\n"))
}

// checkElevated applies the elevated gates for agentID.
func checkElevated(cfg *config.Config, agentID, sessionKey string) error {
	runtime := "direct"
	if cfg.Sandbox.Mode != "off" {
		runtime = "sandboxed"
	}
	enabled := cfg.Tools.Elevated.Enabled
	if a, ok := cfg.Agent(agentID); ok && a.Tools.Elevated != nil && a.Tools.Elevated.Enabled != nil {
		enabled = enabled && *a.Tools.Elevated.Enabled
	}
	if !enabled {
		return elevatedError("enabled", runtime, sessionKey)
	}
	if from := cfg.Tools.Elevated.AllowFrom; len(from) > 0 && !slices.Contains(from, "*") && !slices.Contains(from, agentID) {
		return elevatedError("allowFrom", runtime, sessionKey)
	}
	return nil
}
