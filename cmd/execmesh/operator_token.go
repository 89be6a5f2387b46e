package main

import (
	"net/http"
	"strings"
)

// Operator endpoints get the operator token (DESIGN.md §3.4), everything
// else the tool token: the client decides by the request, so that no
// command can send an operator call with the agent's token by mistake.

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
	case method == http.MethodPost && path == "/v1/admin/reload":
		return true
	}
	return false
}
