package gateway

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/execmesh/execmesh/config"
)

// TestReloadEndpoint: POST /v1/admin/reload does what SIGHUP does, for
// the operator only; it answers the file the gateway reads, and a
// configuration the gateway refuses is a 400 that leaves the old one.
func TestReloadEndpoint(t *testing.T) {
	next := config.Default()
	var loadErr error
	tg := startGateway(t, func(c *config.Config, o *Options) {
		c.Gateway.Auth.Token = "tool-tok"
		o.ConfigPath = "/etc/execmesh/config.json"
		o.Load = func() (config.Config, error) { return next, loadErr }
	})
	next.StateDir = tg.g.Config().StateDir
	next.Gateway.Auth.Token = "tool-tok"
	next.Tools.Deny = []string{"exec"}
	tests := []struct {
		name   string
		header http.Header
		fail   error
		status int
		has    string // substring of the answer
		denied int    // len(tools.deny) in force after the call
	}{
		{name: "tool token", header: http.Header{"Authorization": {"Bearer tool-tok"}}, status: http.StatusForbidden, has: "operator", denied: 0},
		{name: "no token", header: http.Header{"Authorization": {""}}, status: http.StatusUnauthorized, denied: 0},
		{name: "operator", status: http.StatusOK, has: `"configPath":"/etc/execmesh/config.json"`, denied: 1},
		{name: "refused", fail: errors.New("tools.exec.host: invalid value"), status: http.StatusBadRequest, has: "the old configuration stays in force: tools.exec.host", denied: 1},
	}
	for _, tt := range tests {
		loadErr = tt.fail
		r := tg.do("POST", "/v1/admin/reload", []byte(`{}`), tt.header)
		if r.Status != tt.status || !strings.Contains(string(r.Raw), tt.has) {
			t.Errorf("%s: %d %s, want %d with %q", tt.name, r.Status, r.Raw, tt.status, tt.has)
		}
		if got := len(tg.g.Config().Tools.Deny); got != tt.denied {
			t.Errorf("%s: tools.deny has %d entries, want %d", tt.name, got, tt.denied)
		}
	}
	if r := tg.do("GET", "/v1/admin/reload", nil, nil); r.Status != http.StatusMethodNotAllowed && r.Status != http.StatusNotFound {
		t.Errorf("GET: %d %s", r.Status, r.Raw)
	}
}
