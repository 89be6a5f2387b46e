package gateway

import (
	"net/http"

	"github.com/execmesh/execmesh/protocol"
)

// reloadAnswer is the answer of POST /v1/admin/reload.
type reloadAnswer struct {
	OK bool `json:"ok"`
	// ConfigPath is the file the gateway reads, so that a client that
	// edited a file can tell whether it is this gateway's.
	ConfigPath string `json:"configPath"`
	// HostID names the gateway's view of the file system (as /healthz
	// does): a path means the same file only to a client that sees it.
	HostID string `json:"hostId,omitempty"`
}

// handleReload serves POST /v1/admin/reload (operator only): it does what
// SIGHUP does, re-reading the configuration file, so that an operator
// (`execmesh reload`, `execmesh config set`) applies an edit without
// signalling a process it may not own. A configuration the gateway
// refuses leaves the old one in force and is answered 400 with the reason.
func (g *Gateway) handleReload(w http.ResponseWriter, r *http.Request) {
	if err := g.Reload(); err != nil {
		g.log.Error("reload failed; keeping the old configuration", "err", err, "by", "api")
		writeError(w, protocol.Errorf(protocol.ErrInvalidRequest, "reload failed; the old configuration stays in force: %v", err))
		return
	}
	writeJSON(w, http.StatusOK, reloadAnswer{OK: true, ConfigPath: g.configPath(), HostID: g.hostID})
}
