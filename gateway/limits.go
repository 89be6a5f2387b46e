package gateway

import (
	"strconv"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/protocol"
)

// effectiveLimits resolves the resource limits of one exec call:
// tools.exec.limits, each limit the agent's agents.list[].tools.exec.limits
// sets in place of the global one, then the call's "limits", which may only
// tighten the result.
func effectiveLimits(cfg *config.Config, agentID string, call *protocol.Limits) (protocol.Limits, error) {
	l := cfg.Tools.Exec.Limits
	if a, ok := cfg.Agent(agentID); ok {
		if al := a.Tools.Exec.Limits; al != nil {
			l = l.Override(*al)
		}
	}
	if call == nil {
		return l, nil
	}
	return l.Tighten(*call, func(k string) string { return protocol.ToolExec + ` parameter "limits.` + k + `"` })
}

// configuredLimits lists every limit the configuration sets, by key, for
// the start-up check against the session core's controllers.
func configuredLimits(cfg *config.Config) map[string]protocol.Limits {
	out := map[string]protocol.Limits{}
	if !cfg.Tools.Exec.Limits.IsZero() {
		out["tools.exec.limits"] = cfg.Tools.Exec.Limits
	}
	for i, a := range cfg.Agents.List {
		if a.Tools.Exec.Limits != nil && !a.Tools.Exec.Limits.IsZero() {
			out["agents.list["+strconv.Itoa(i)+"].tools.exec.limits"] = *a.Tools.Exec.Limits
		}
	}
	return out
}
