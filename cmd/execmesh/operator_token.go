package main

import (
	"net/http"
	"strings"

	"github.com/execmesh/execmesh/gateway"
)

// This file is the CLI's side of the operator token (DESIGN.md §3.4), kept
// small and apart: operator endpoints get the operator token, everything
// else the tool token.

// operatorTokenFor returns the operator token for the client commands:
// $EXECMESH_OPERATOR_TOKEN or gateway.auth.operatorToken (LoadConfig put
// the variable over the file), else the token the gateway generated in
// the state dir (--state-dir, $EXECMESH_STATE_DIR, ~/.execmesh, or the
// configuration's stateDir), else "".
func (f *clientFlags) operatorTokenFor(c *cli, cfg gateway.Config) string {
	if cfg.Gateway.Auth.OperatorToken != "" {
		return cfg.Gateway.Auth.OperatorToken
	}
	for _, dir := range []string{f.resolveStateDir(c), cfg.StateDir} {
		if tok, err := gateway.ReadOperatorTokenFile(dir); err == nil {
			return tok
		}
	}
	return ""
}

// isOperatorRequest reports whether method and path name an operator
// endpoint: approval decisions, node pairing, node approvals files and
// configuration changes.
func isOperatorRequest(method, path string) bool {
	switch {
	case method == http.MethodPost && strings.HasPrefix(path, "/v1/approvals/"):
		return true
	case method == http.MethodPost && strings.HasPrefix(path, "/v1/nodes/"):
		return true // invite, approve, reject
	case strings.HasPrefix(path, "/v1/nodes/") && strings.HasSuffix(path, "/approvals"):
		return true
	case method == http.MethodPut && path == "/v1/config/exec-node":
		return true
	}
	return false
}
