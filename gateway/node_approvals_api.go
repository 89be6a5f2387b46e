package gateway

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// nodeApprovalsTimeout bounds a node approvals read or write.
const nodeApprovalsTimeout = 15 * time.Second

// handleNodeApprovals serves GET and PUT /v1/nodes/{id}/approvals: a
// node's own exec-approvals.json, {path, exists, hash, file}; a PUT body
// {file, baseHash} replaces it only when baseHash is the hash the caller
// read (optimistic concurrency, spec §19.3).
func (g *Gateway) handleNodeApprovals(endpoint string) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		r := g.router()
		if r == nil {
			writeError(w, protocol.Errorf(protocol.ErrNotFound, "no node backend: the gateway is not attached to NATS"))
			return
		}
		n, ok := r.nodeSnapshot(req.PathValue("id"))
		if !ok {
			writeError(w, protocol.Errorf(protocol.ErrNotFound, "unknown node %q", req.PathValue("id")))
			return
		}
		body := []byte("{}")
		if endpoint == protocol.NodeEndpointApprovalsSet {
			var set struct {
				File     json.RawMessage `json:"file"`
				BaseHash string          `json:"baseHash"`
			}
			if err := decodeStrict(w, req, &set); err != nil {
				writeError(w, err)
				return
			}
			body, _ = json.Marshal(set)
		}
		m, err := r.call(req.Context(), n, endpoint, body, nil, nodeApprovalsTimeout)
		if err != nil {
			writeError(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(m.Data)
	}
}
