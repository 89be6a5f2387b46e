package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// NodeView is one entry of GET /v1/nodes.
type NodeView struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Status string `json:"status"` // connected or unreachable
	Paired bool   `json:"paired"`
	// Pairing is pending, paired or rejected.
	Pairing  string `json:"pairing"`
	Platform string `json:"platform"`
	// LastSeen is the unix time in ms of the last heartbeat, 0 when none
	// arrived since the gateway started.
	LastSeen int64 `json:"lastSeen"`
	// Sessions is the number of sessions the node reported holding.
	Sessions int `json:"sessions"`
	// Server is the NATS server the node is connected to.
	Server    string `json:"server"`
	Version   string `json:"version,omitempty"`
	PublicKey string `json:"publicKey,omitempty"`
	Joined    bool   `json:"joined,omitempty"`
	// Containment is how the node holds process trees ("cgroup" or
	// "process-group"), from its heartbeats; empty before the first.
	Containment string `json:"containment,omitempty"`
}

func nodeView(n nodeInfo) NodeView {
	v := NodeView{
		ID: n.id, Name: n.name, Status: "unreachable", Paired: n.pairing == protocol.NodePairingPaired, Pairing: n.pairing,
		Platform: n.platform, Sessions: n.sessions, Server: n.server, Version: n.version,
		PublicKey: n.publicKey, Joined: n.joined, Containment: n.contain,
	}
	if n.live {
		v.Status = "connected"
	}
	if !n.lastSeen.IsZero() {
		v.LastSeen = n.lastSeen.UnixMilli()
	}
	if v.Name == "" {
		v.Name = n.id
	}
	return v
}

// Nodes returns the node registry as GET /v1/nodes shows it, or nil
// before ServeNATS.
func (g *Gateway) Nodes() []NodeView {
	r := g.router()
	if r == nil {
		return nil
	}
	nodes := r.allNodes()
	out := make([]NodeView, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, nodeView(n))
	}
	return out
}

// routes are the /v1/nodes routes of the node backend.
func (r *nodeRouter) routes() []route {
	return []route{
		{"GET /v1/nodes", r.handleList},
		{"GET /v1/nodes/{id}", r.handleGet},
		{"POST /v1/nodes/invite", r.handleInvite},
		{"POST /v1/nodes/{id}/approve", r.handleDecide(protocol.NodePairingPaired)},
		{"POST /v1/nodes/{id}/reject", r.handleDecide(protocol.NodePairingRejected)},
	}
}

func (r *nodeRouter) handleList(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"nodes": r.g.Nodes()})
}

func (r *nodeRouter) handleGet(w http.ResponseWriter, req *http.Request) {
	n, ok := r.nodeSnapshot(req.PathValue("id"))
	if !ok {
		writeError(w, protocol.Errorf(protocol.ErrNotFound, "unknown node %q", req.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"node": nodeView(n)})
}

func (r *nodeRouter) handleDecide(pairing string) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		id := req.PathValue("id")
		if _, ok := r.nodeSnapshot(id); !ok {
			writeError(w, protocol.Errorf(protocol.ErrNotFound, "unknown node %q", id))
			return
		}
		n, err := r.decide(req.Context(), id, pairing, false)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"node": nodeView(n)})
	}
}

// inviteRequest is the body of POST /v1/nodes/invite.
type inviteRequest struct {
	Name  string `json:"name"`
	TTLMs int64  `json:"ttlMs"`
}

func (r *nodeRouter) handleInvite(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, 64<<10))
	if err != nil {
		writeError(w, protocol.Errorf(protocol.ErrInvalidRequest, "reading request body: %v", err))
		return
	}
	var in inviteRequest
	if t := bytes.TrimSpace(body); len(t) > 0 {
		dec := json.NewDecoder(bytes.NewReader(t))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			writeError(w, protocol.Errorf(protocol.ErrInvalidRequest, "invalid body: %v (expected {\"name\",\"ttlMs\"})", err))
			return
		}
	}
	if in.TTLMs < 0 {
		writeError(w, protocol.Errorf(protocol.ErrInvalidRequest, "ttlMs must not be negative"))
		return
	}
	in.Name = strings.TrimSpace(in.Name)
	if len(in.Name) > 128 {
		writeError(w, protocol.Errorf(protocol.ErrInvalidRequest, "name is longer than 128 characters"))
		return
	}
	reply, err := r.createInvite(in.Name, time.Duration(in.TTLMs)*time.Millisecond)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, reply)
}
