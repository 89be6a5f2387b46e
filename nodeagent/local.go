package nodeagent

import (
	"encoding/json"
)

// The agent's parts that a node-host protocol other than execmesh's NATS
// one serves (package openclawnode): which, the approvals file, and a
// start without NATS.

// Which finds binaries on the node's own PATH: name -> absolute path, for
// the names found.
func (a *Agent) Which(bins []string) map[string]string { return a.which(bins) }

// ApprovalsGet returns the node's exec-approvals.json as OpenClaw's
// system.execApprovals.get answers it: {path, exists, hash, file}, the
// socket token removed.
func (a *Agent) ApprovalsGet() (json.RawMessage, error) {
	v, err := a.readApprovals()
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// ApprovalsSet replaces the node's exec-approvals.json given the hash of
// the file it replaces, and returns the new one as ApprovalsGet does.
func (a *Agent) ApprovalsSet(file json.RawMessage, baseHash string) (json.RawMessage, error) {
	v, err := a.writeApprovals(approvalsSet{File: file, BaseHash: baseHash})
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// StartLocal starts the agent without NATS: its host (Host) serves
// another protocol's connection only. Exit events go to Config.OnExit and
// nowhere else; what a crashed earlier run left is logged and told there.
func (a *Agent) StartLocal() error {
	if err := a.begin(true); err != nil {
		return err
	}
	a.log.Info("node agent started without NATS", "name", a.name, "platform", a.platform)
	a.reportLost()
	return nil
}
