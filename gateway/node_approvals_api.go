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
		n, err := g.nodes.Resolve(req.PathValue("id"))
		if err != nil {
			writeError(w, err)
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
		data, err := g.nodes.Host(n).Request(req.Context(), endpoint, body, nodeApprovalsTimeout)
		if err != nil {
			writeError(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(data)
	}
}
