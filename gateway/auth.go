package gateway

import (
	"net/http"

	"github.com/execmesh/execmesh/access"
)

// authed serves h to callers with the agent's authority or more.
func (g *Gateway) authed(h http.HandlerFunc) http.HandlerFunc { return g.require(access.RoleAgent, h) }

// operator serves h to callers with the operator token only.
func (g *Gateway) operator(h http.HandlerFunc) http.HandlerFunc {
	return g.require(access.RoleOperator, h)
}

// require checks the request's bearer token against need and the failure
// limits, and answers 401, 403 or 429 itself when the check fails.
func (g *Gateway) require(need access.Role, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, err := g.guard.Authenticate(w, r, need); err != nil {
			writeError(w, err)
			return
		}
		h(w, r)
	}
}

// Protect wraps h with the gateway's browser defences
// (access.CheckBrowser), applied to every request before anything else.
// Gateway.Handler applies it; the daemon wraps what it mounts beside the
// API (/mcp, /metrics, /ui) with it.
func (g *Gateway) Protect(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.cfgMu.RLock()
		allowed, listen := g.cfg.Gateway.AllowedHosts, g.cfg.Gateway.Listen
		g.cfgMu.RUnlock()
		if err := access.CheckBrowser(r, allowed, listen); err != nil {
			writeError(w, err)
			return
		}
		h.ServeHTTP(w, r)
	})
}
