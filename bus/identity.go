package bus

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nkeys"

	"github.com/execmesh/execmesh/internal/atomicfile"
)

// Seed files in a state dir, each an nkey user seed on one line, mode 0600.
const (
	// NodeKeyFile is a node's identity (its node id derives from it).
	NodeKeyFile = "node.nkey"
	// GatewayKeyFile is the gateway's identity on its embedded NATS
	// server: the gateway connects with it, and only it may send requests
	// to nodes' subjects there. Its public key is the gateway's
	// public identity (nodes can verify what the gateway signs with it).
	GatewayKeyFile = "gateway.nkey"
	// OperatorKeyFile is the operator's identity on the embedded server,
	// for the nats CLI (`nats --nkey <state-dir>/operator.nkey …`),
	// confined by OperatorPermissions.
	OperatorKeyFile = "operator.nkey"
)

// nodeIDLen is the length of a node id: 16 base32 characters of the
// public key carry 77 bits of it (the first character after the 'U' holds
// only 2 key bits), plenty to keep ids of one installation apart.
const nodeIDLen = 16

// Identity is a NATS identity: an nkey user key pair (a node's, the
// gateway's or the operator's).
type Identity struct {
	// PublicKey is the nkey user public key ("U…", 56 characters); the
	// server's NKeyUser entry names it.
	PublicKey string
	// Seed is the secret seed ("SU…"); it signs the server's nonce at
	// connect (ClientConfig.NKeySeed). Never log it.
	Seed []byte
	// NodeID is derived from PublicKey (NodeIDFromPublicKey); it names
	// nothing for the gateway's and the operator's identities.
	NodeID string
}

// LogValue keeps the seed out of logs.
func (id Identity) LogValue() slog.Value {
	return slog.GroupValue(slog.String("nodeId", id.NodeID), slog.String("publicKey", id.PublicKey))
}

// NodeIDFromPublicKey derives the node id from an nkey user public key:
// the 16 characters after the 'U' prefix, lower-cased. The result is
// stable, short enough to read, and only letters a–z and digits 2–7, so it
// is always one safe NATS subject token. The gateway derives the id from
// the key a node presents, never from what the node claims, so a node
// cannot pick another node's id.
func NodeIDFromPublicKey(publicKey string) (string, error) {
	if !nkeys.IsValidPublicUserKey(publicKey) {
		return "", fmt.Errorf("bus: %q is not an nkey user public key", publicKey)
	}
	return strings.ToLower(publicKey[1 : 1+nodeIDLen]), nil
}

// NewIdentity creates a fresh node identity (not persisted).
func NewIdentity() (Identity, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return Identity{}, fmt.Errorf("bus: create nkey: %w", err)
	}
	defer kp.Wipe()
	seed, err := kp.Seed()
	if err != nil {
		return Identity{}, fmt.Errorf("bus: create nkey: %w", err)
	}
	return identityFromSeed(seed)
}

// IdentityFromSeed parses a user seed into an Identity.
func IdentityFromSeed(seed []byte) (Identity, error) {
	return identityFromSeed(bytes.TrimSpace(seed))
}

func identityFromSeed(seed []byte) (Identity, error) {
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		return Identity{}, fmt.Errorf("bus: parse nkey seed: %w", err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return Identity{}, fmt.Errorf("bus: parse nkey seed: %w", err)
	}
	id, err := NodeIDFromPublicKey(pub)
	if err != nil {
		return Identity{}, fmt.Errorf("bus: nkey seed is not a user seed: %w", err)
	}
	return Identity{PublicKey: pub, Seed: append([]byte(nil), seed...), NodeID: id}, nil
}

// LoadOrCreateNodeIdentity returns the identity stored in
// <stateDir>/node.nkey, creating it on first use (LoadOrCreateIdentity).
func LoadOrCreateNodeIdentity(stateDir string) (Identity, error) {
	return LoadOrCreateIdentity(filepath.Join(stateDir, NodeKeyFile))
}

// LoadOrCreateGatewayIdentity returns the gateway's identity stored in
// <stateDir>/gateway.nkey, creating it on first use.
func LoadOrCreateGatewayIdentity(stateDir string) (Identity, error) {
	return LoadOrCreateIdentity(filepath.Join(stateDir, GatewayKeyFile))
}

// LoadOrCreateIdentity returns the identity whose seed is in path,
// creating it on first use. The directory is created (0700) if missing.
// A new seed appears complete or not at all, with mode 0600, and when two
// processes race the first one wins and the second loads its key
// (atomicfile.WriteNew).
func LoadOrCreateIdentity(path string) (Identity, error) {
	if id, err := loadIdentity(path); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return id, err
	}
	id, err := NewIdentity()
	if err != nil {
		return Identity{}, err
	}
	if err := atomicfile.WriteNew(path, append(append([]byte(nil), id.Seed...), '\n'), 0o600); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return loadIdentity(path)
		}
		return Identity{}, fmt.Errorf("bus: identity %s: %w", path, err)
	}
	return id, nil
}

func loadIdentity(path string) (Identity, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Identity{}, err
	}
	if !fi.Mode().IsRegular() {
		return Identity{}, fmt.Errorf("bus: identity: %s is not a regular file", path)
	}
	seed, err := os.ReadFile(path)
	if err != nil {
		return Identity{}, fmt.Errorf("bus: identity: %w", err)
	}
	id, err := IdentityFromSeed(seed)
	if err != nil {
		return Identity{}, fmt.Errorf("bus: identity %s: %w", path, err)
	}
	return id, nil
}
