package gateway

import (
	"fmt"
	"path/filepath"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/access"
)

// OperatorTokenFile is access.OperatorTokenFile, the file in the state dir
// that holds the generated operator token.
const OperatorTokenFile = access.OperatorTokenFile

// operatorToken is the operator's token in force: the configured one,
// else the generated one.
func (g *Gateway) operatorToken() string {
	_, op := g.tokens()
	return op
}

// tokens returns the tool token ("" for none) and the operator token in
// force, without copying the whole configuration.
func (g *Gateway) tokens() (tool, operator string) {
	g.cfgMu.RLock()
	tool, operator = g.cfg.Gateway.Auth.Token, g.cfg.Gateway.Auth.OperatorToken
	g.cfgMu.RUnlock()
	if operator == "" {
		g.opMu.Lock()
		operator = g.opFileToken
		g.opMu.Unlock()
	}
	return tool, operator
}

// ensureOperatorToken loads (or generates) the operator.token file when
// the configuration sets no operator token. New and Reload call it.
func (g *Gateway) ensureOperatorToken(cfg config.Config) error {
	if cfg.Gateway.Auth.OperatorToken != "" {
		return nil
	}
	g.opMu.Lock()
	defer g.opMu.Unlock()
	if g.opFileToken != "" {
		return nil
	}
	tok, refused, err := access.LoadOrCreateOperatorToken(cfg.StateDir)
	if err != nil {
		return fmt.Errorf("gateway.auth.operatorToken (unset, so the gateway keeps one in %s): %w", filepath.Join(cfg.StateDir, OperatorTokenFile), err)
	}
	if refused != nil {
		g.log.Warn("replaced the operator token file with a new token: the old one could not be trusted", "reason", refused)
	}
	g.opFileToken = tok
	return nil
}
