package nodeagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/nats-io/nkeys"

	"github.com/execmesh/execmesh/internal/atomicfile"
)

// GatewayKeysFile holds, in the node's state dir, the public keys of the
// gateways whose signed approval decisions the node acts on.
const GatewayKeysFile = "gateway-keys.json"

// trustedKeys are the gateway keys a node trusts: those configured, those
// of the join code it redeemed, and, for a node paired through the approve
// flow, those of the first pairing notice (trust on first use: the node's
// own subject accepts only gateway identities). Later notices never
// replace keys the node already has.
type trustedKeys struct {
	path string // "" without a state dir: nothing is persisted

	mu   sync.Mutex
	keys []string
}

// loadTrustedKeys reads the keys file and adds the configured keys.
func loadTrustedKeys(stateDir string, configured []string) (*trustedKeys, error) {
	t := &trustedKeys{}
	if stateDir != "" {
		t.path = filepath.Join(stateDir, GatewayKeysFile)
		b, err := os.ReadFile(t.path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return nil, fmt.Errorf("nodeagent: %w", err)
		default:
			var f struct {
				Keys []string `json:"keys"`
			}
			if err := json.Unmarshal(b, &f); err != nil {
				return nil, fmt.Errorf("nodeagent: %s: %w", t.path, err)
			}
			for _, k := range f.Keys {
				if nkeys.IsValidPublicKey(k) {
					t.keys = append(t.keys, k)
				}
			}
		}
	}
	for _, k := range configured {
		if !nkeys.IsValidPublicKey(k) {
			return nil, fmt.Errorf("nodeagent: GatewayKeys: %q is not an nkey public key", k)
		}
		if !slices.Contains(t.keys, k) {
			t.keys = append(t.keys, k)
		}
	}
	return t, nil
}

// list returns the trusted keys.
func (t *trustedKeys) list() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.keys)
}

// add trusts keys (a join code's) and saves them.
func (t *trustedKeys) add(keys ...string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	changed := false
	for _, k := range keys {
		if nkeys.IsValidPublicKey(k) && !slices.Contains(t.keys, k) {
			t.keys = append(t.keys, k)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return t.saveLocked()
}

// adopt trusts keys only when none are trusted yet (first use).
func (t *trustedKeys) adopt(keys []string) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.keys) > 0 {
		return false, nil
	}
	for _, k := range keys {
		if nkeys.IsValidPublicKey(k) && !slices.Contains(t.keys, k) {
			t.keys = append(t.keys, k)
		}
	}
	if len(t.keys) == 0 {
		return false, nil
	}
	return true, t.saveLocked()
}

func (t *trustedKeys) saveLocked() error {
	if t.path == "" {
		return nil
	}
	b, err := json.MarshalIndent(struct {
		Keys []string `json:"keys"`
	}{t.keys}, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(t.path, append(b, '\n'), 0o600)
}
