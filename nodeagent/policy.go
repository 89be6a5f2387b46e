package nodeagent

import (
	"encoding/json"
	"errors"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/protocol"
)

// approvalsView is the answer of approvals.get: OpenClaw's
// system.execApprovals.get shape, {path, exists, hash, file}, with the
// socket token removed.
type approvalsView struct {
	Path   string          `json:"path"`
	Exists bool            `json:"exists"`
	Hash   string          `json:"hash"`
	File   *approvals.File `json:"file"`
}

// approvalsSet is the request of approvals.set: the new file and the hash
// of the file it replaces ("" when there is none).
type approvalsSet struct {
	File     json.RawMessage `json:"file"`
	BaseHash string          `json:"baseHash"`
}

func (a *Agent) approvalsPath() (string, error) {
	if a.cfg.StateDir == "" {
		return "", protocol.Errorf(protocol.ErrConflict, "node %s has no state dir, so no exec approvals file", a.id.NodeID)
	}
	return approvals.Path(a.cfg.StateDir), nil
}

func (a *Agent) readApprovals() (approvalsView, error) {
	path, err := a.approvalsPath()
	if err != nil {
		return approvalsView{}, err
	}
	f, hash, err := approvals.Load(path)
	if err != nil {
		return approvalsView{}, protocol.Errorf(protocol.ErrConflict, "exec approvals file: %v", err)
	}
	if f.Socket != nil {
		s := *f.Socket
		s.Token = ""
		f.Socket = &s
	}
	return approvalsView{Path: path, Exists: hash != "", Hash: hash, File: f}, nil
}

func (a *Agent) writeApprovals(req approvalsSet) (approvalsView, error) {
	path, err := a.approvalsPath()
	if err != nil {
		return approvalsView{}, err
	}
	if len(req.File) == 0 || string(req.File) == "null" {
		return approvalsView{}, protocol.Errorf(protocol.ErrInvalidRequest, "approvals.set: file is required")
	}
	file, err := approvals.Parse(req.File)
	if err != nil {
		return approvalsView{}, protocol.Errorf(protocol.ErrInvalidRequest, "approvals.set: %v", err)
	}
	cur, err := a.readApprovals()
	if err != nil {
		return approvalsView{}, err
	}
	switch {
	case cur.Exists && req.BaseHash == "":
		return approvalsView{}, protocol.Errorf(protocol.ErrInvalidRequest, "INVALID_REQUEST: exec approvals base hash required; reload and retry")
	case req.BaseHash != cur.Hash:
		return approvalsView{}, protocol.Errorf(protocol.ErrConflict, "INVALID_REQUEST: exec approvals changed; reload and retry")
	}
	// The socket section is the node's own; a client cannot set it.
	old, _, _ := approvals.Load(path)
	file.Socket = old.Socket
	if _, err := approvals.Save(path, file, req.BaseHash); err != nil {
		if errors.Is(err, approvals.ErrConflict) {
			return approvalsView{}, protocol.Errorf(protocol.ErrConflict, "INVALID_REQUEST: exec approvals changed; reload and retry")
		}
		return approvalsView{}, protocol.Errorf(protocol.ErrConflict, "exec approvals: %v", err)
	}
	return a.readApprovals()
}
