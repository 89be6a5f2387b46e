package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/internal/atomicfile"
	"github.com/execmesh/execmesh/protocol"
)

// ExecNodeBinding is the default node of all agents (tools.exec.node) and
// of each agent (agents.list[].tools.exec.node), as the control page edits it.
type ExecNodeBinding struct {
	Default string            `json:"default"`
	Agents  map[string]string `json:"agents"`
}

// ExecNodeBinding returns the node bindings in force.
func (g *Gateway) ExecNodeBinding() ExecNodeBinding {
	cfg := g.Config()
	b := ExecNodeBinding{Default: cfg.Tools.Exec.Node, Agents: map[string]string{}}
	for _, a := range cfg.Agents.List {
		b.Agents[a.ID] = a.Tools.Exec.Node
	}
	return b
}

// SetExecNode binds agentID ("" for every agent) to node ("" unbinds). The
// change is applied at once and, when the gateway has a configuration
// file, written to it (validated first, atomically).
func (g *Gateway) SetExecNode(agentID, node string) error {
	g.cfgMu.Lock()
	defer g.cfgMu.Unlock()
	cfg := g.cfg
	cfg.Agents.List = append([]config.Agent(nil), cfg.Agents.List...)
	if agentID == "" {
		cfg.Tools.Exec.Node = node
	} else {
		if !config.ValidAgentID(agentID) {
			return protocol.Errorf(protocol.ErrInvalidRequest, "invalid agent id %q", agentID)
		}
		found := false
		for i := range cfg.Agents.List {
			if cfg.Agents.List[i].ID == agentID {
				cfg.Agents.List[i].Tools.Exec.Node = node
				found = true
			}
		}
		if !found {
			cfg.Agents.List = append(cfg.Agents.List, config.Agent{ID: agentID, Tools: config.AgentTools{Exec: config.AgentExec{Node: node}}})
		}
	}
	if err := cfg.Validate(); err != nil {
		return protocol.Errorf(protocol.ErrInvalidRequest, "%v", err)
	}
	if g.opts.ConfigPath != "" {
		if err := writeExecNode(g.opts.ConfigPath, agentID, node); err != nil {
			return fmt.Errorf("writing %s: %w", g.opts.ConfigPath, err)
		}
	}
	g.cfg = cfg
	return nil
}

// writeExecNode edits the JSON file by key path, keeping every other key.
func writeExecNode(path, agentID, node string) error {
	doc := map[string]any{}
	if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
		if err := json.Unmarshal(b, &doc); err != nil {
			return err
		}
	} else if err != nil && !os.IsNotExist(err) {
		return err
	}
	obj := func(m map[string]any, k string) map[string]any {
		if v, ok := m[k].(map[string]any); ok {
			return v
		}
		v := map[string]any{}
		m[k] = v
		return v
	}
	if agentID == "" {
		obj(obj(doc, "tools"), "exec")["node"] = node
	} else {
		agents := obj(doc, "agents")
		list, _ := agents["list"].([]any)
		var entry map[string]any
		for _, e := range list {
			if m, ok := e.(map[string]any); ok && m["id"] == agentID {
				entry = m
			}
		}
		if entry == nil {
			entry = map[string]any{"id": agentID}
			list = append(list, entry)
			agents["list"] = list
		}
		obj(obj(entry, "tools"), "exec")["node"] = node
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	if _, err := config.Decode(b); err != nil {
		return err
	}
	return atomicfile.Write(path, append(b, '\n'), 0o600)
}

func (g *Gateway) handleGetExecNode(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, g.ExecNodeBinding())
}

func (g *Gateway) handlePutExecNode(w http.ResponseWriter, r *http.Request) {
	var body struct {
		AgentID string `json:"agentId"`
		Node    string `json:"node"`
	}
	if err := decodeStrict(w, r, &body); err != nil {
		writeError(w, err)
		return
	}
	if err := g.SetExecNode(body.AgentID, body.Node); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, g.ExecNodeBinding())
}
