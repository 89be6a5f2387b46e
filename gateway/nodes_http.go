package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/nodes"
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
	Server      string `json:"server"`
	Version     string `json:"version,omitempty"`
	PublicKey   string `json:"publicKey,omitempty"`
	Joined      bool   `json:"joined,omitempty"`
	Containment string `json:"containment,omitempty"`
	// Confinement is how the node holds security allowlist runs:
	// "landlock" (the kernel) or "ask" (with the reason).
	Confinement       string `json:"confinement,omitempty"`
	ConfinementReason string `json:"confinementReason,omitempty"`
}

func nodeView(n nodes.Node) NodeView {
	v := NodeView{
		ID: n.ID, Name: n.Name, Status: "unreachable", Paired: n.Pairing == protocol.NodePairingPaired, Pairing: n.Pairing,
		Platform: n.Platform, Sessions: n.Sessions, Server: n.Server, Version: n.Version,
		PublicKey: n.PublicKey, Joined: n.Joined, Containment: n.Containment,
		Confinement: n.Confinement, ConfinementReason: n.ConfinementReason,
	}
	if n.Live {
		v.Status = "connected"
	}
	if !n.LastSeen.IsZero() {
		v.LastSeen = n.LastSeen.UnixMilli()
	}
	if v.Name == "" {
		v.Name = n.ID
	}
	return v
}

// Nodes returns the node registry as GET /v1/nodes shows it.
func (g *Gateway) Nodes() []NodeView {
	list := g.nodes.List()
	out := make([]NodeView, 0, len(list))
	for _, n := range list {
		out = append(out, nodeView(n))
	}
	return out
}

// SetEmbeddedServer tells the gateway that its embedded NATS server was
// started again in this process: node identities and join codes are given
// to the new one.
func (g *Gateway) SetEmbeddedServer(srv *bus.Server) { g.nodes.SetServer(srv) }

// NodeRegistry returns the gateway's node registry.
func (g *Gateway) NodeRegistry() *nodes.Registry { return g.nodes }

// nodeRoutes are the /v1/nodes routes.
func (g *Gateway) nodeRoutes() []route {
	return []route{
		{pattern: "GET /v1/nodes", handler: g.handleNodeList},
		{pattern: "GET /v1/nodes/{id}", handler: g.handleNodeGet},
		// Pairing is the operator's: a join code admits a NATS identity.
		{pattern: "POST /v1/nodes/invite", handler: g.handleInvite, operator: true},
		{pattern: "POST /v1/nodes/{id}/approve", handler: g.handleDecide(protocol.NodePairingPaired), operator: true},
		{pattern: "POST /v1/nodes/{id}/reject", handler: g.handleDecide(protocol.NodePairingRejected), operator: true},
	}
}

func (g *Gateway) handleNodeList(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"nodes": g.Nodes()})
}

func (g *Gateway) handleNodeGet(w http.ResponseWriter, req *http.Request) {
	n, err := g.nodes.Resolve(req.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"node": nodeView(n)})
}

func (g *Gateway) handleDecide(pairing string) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		n, err := g.nodes.Decide(req.Context(), req.PathValue("id"), pairing)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"node": nodeView(n)})
	}
}

// ApproveNode pairs the node with this id (it need not have been seen
// yet: `execmesh up` approves its own local node before its first
// heartbeat).
func (g *Gateway) ApproveNode(id string) error {
	_, err := g.nodes.Approve(g.bg, id)
	return err
}

// AdmitNode pairs the node holding publicKey as if it had joined by code:
// the embedded server admits its key with permissions confined to its own
// subjects. `execmesh up` admits its local node this way.
func (g *Gateway) AdmitNode(publicKey, name string) error {
	_, err := g.nodes.Admit(g.bg, publicKey, name)
	return err
}

// inviteRequest is the body of POST /v1/nodes/invite.
type inviteRequest struct {
	Name  string `json:"name"`
	TTLMs int64  `json:"ttlMs"`
	// Local: the node runs on this machine, so the embedded server's
	// loopback address is fine.
	Local bool `json:"local"`
}

func (g *Gateway) handleInvite(w http.ResponseWriter, req *http.Request) {
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
			writeError(w, protocol.Errorf(protocol.ErrInvalidRequest, "invalid body: %v (expected {\"name\",\"ttlMs\",\"local\"})", err))
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
	inv, err := g.Invite(req, in.Name, time.Duration(in.TTLMs)*time.Millisecond, in.Local)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, inv)
}

// Invite issues a join code. With the embedded server listening on
// loopback only (and no join URLs configured), no other machine could use
// it: that is refused unless local says the node runs on this machine.
func (g *Gateway) Invite(req *http.Request, name string, ttl time.Duration, local bool) (nodes.Invite, error) {
	if srv := g.nodes.Server(); srv != nil && !local && g.configuredJoinURLs() == nil && srv.ListensOnLoopback() {
		// A code whose URLs are nats://127.0.0.1:… works on no other machine.
		return nodes.Invite{}, protocol.Errorf(protocol.ErrConflict,
			"the embedded NATS server listens on loopback only (%s), so a join code would work on no other machine: restart the gateway with --nats-listen 0.0.0.0:4222 (or an address the new machine can reach) and a --token, or set EXECMESH_NODE_JOIN_URLS to an address that reaches this server (for a node on this machine: nodes invite --local)", srv.ListenAddr())
	}
	return g.nodes.Invite(req.Context(), name, ttl)
}

// joinURLs are the URLs join codes carry.
func (g *Gateway) joinURLs() []string {
	if urls := g.configuredJoinURLs(); urls != nil {
		return urls
	}
	return embeddedJoinURLs(g.nodes.Server())
}

// configuredJoinURLs are the join URLs an operator set
// (EXECMESH_NODE_JOIN_URLS, Options.JoinURLs), nil when none.
func (g *Gateway) configuredJoinURLs() []string {
	if v := strings.TrimSpace(g.opts.Getenv("EXECMESH_NODE_JOIN_URLS")); v != "" {
		var out []string
		for u := range strings.SplitSeq(v, ",") {
			if u = strings.TrimSpace(u); u != "" {
				out = append(out, u)
			}
		}
		return out
	}
	if g.opts.JoinURLs != nil {
		return g.opts.JoinURLs()
	}
	return nil
}

// embeddedJoinURLs returns the URLs of the embedded server a join code
// carries: its address, or, when it listens on every interface, every
// routable address, loopback last.
func embeddedJoinURLs(srv *bus.Server) []string {
	if srv == nil {
		return nil
	}
	local := srv.ClientURL()
	addr, ok := srv.NATSServer().Addr().(*net.TCPAddr)
	if !ok || addr == nil || local == "" {
		return nil
	}
	if !addr.IP.IsUnspecified() {
		return []string{local}
	}
	scheme, _, _ := strings.Cut(local, "://")
	var urls []string
	if ifaddrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range ifaddrs {
			ipn, ok := a.(*net.IPNet)
			if !ok || ipn.IP.IsLoopback() || ipn.IP.IsLinkLocalUnicast() || ipn.IP.IsMulticast() {
				continue
			}
			urls = append(urls, scheme+"://"+net.JoinHostPort(ipn.IP.String(), strconv.Itoa(addr.Port)))
		}
	}
	return append(urls, local)
}
