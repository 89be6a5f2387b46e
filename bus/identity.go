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
)

// NodeKeyFile is the name of a node's nkey seed file in its state dir.
const NodeKeyFile = "node.nkey"

// nodeIDLen is the length of a node id: 16 base32 characters of the
// public key carry 77 bits of it (the first character after the 'U' holds
// only 2 key bits), plenty to keep ids of one installation apart.
const nodeIDLen = 16

// Identity is a node's NATS identity: an nkey user key pair.
type Identity struct {
	// PublicKey is the nkey user public key ("U…", 56 characters); the
	// server's NKeyUser entry names it.
	PublicKey string
	// Seed is the secret seed ("SU…"); it signs the server's nonce at
	// connect (ClientConfig.NKeySeed). Never log it.
	Seed []byte
	// NodeID is derived from PublicKey (NodeIDFromPublicKey).
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
// <stateDir>/node.nkey, creating it on first use. The state dir is
// created (0700) if missing. A new seed is written to a temporary file
// with mode 0600, synced, and then hard-linked into place, so the file
// appears complete or not at all, and when two processes race the first
// one wins and the second loads its key.
func LoadOrCreateNodeIdentity(stateDir string) (Identity, error) {
	return LoadOrCreateIdentityFile(filepath.Join(stateDir, NodeKeyFile))
}

// LoadOrCreateIdentityFile is LoadOrCreateNodeIdentity for an nkey seed
// file of any name (a gateway's identity, say); its directory is created
// (0700) if missing.
func LoadOrCreateIdentityFile(path string) (Identity, error) {
	if id, err := loadIdentity(path); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return id, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return Identity{}, fmt.Errorf("bus: node identity: %w", err)
	}
	id, err := NewIdentity()
	if err != nil {
		return Identity{}, err
	}
	if err := writeNew(path, append(append([]byte(nil), id.Seed...), '\n')); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return loadIdentity(path)
		}
		return Identity{}, fmt.Errorf("bus: node identity: %w", err)
	}
	return id, nil
}

func loadIdentity(path string) (Identity, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Identity{}, err
	}
	if !fi.Mode().IsRegular() {
		return Identity{}, fmt.Errorf("bus: node identity: %s is not a regular file", path)
	}
	seed, err := os.ReadFile(path)
	if err != nil {
		return Identity{}, fmt.Errorf("bus: node identity: %w", err)
	}
	id, err := IdentityFromSeed(seed)
	if err != nil {
		return Identity{}, fmt.Errorf("bus: node identity %s: %w", path, err)
	}
	return id, nil
}

// writeNew creates path with data and mode 0600, failing with fs.ErrExist
// if it already exists.
func writeNew(path string, data []byte) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		_ = os.Remove(tmp) // after Link the name is not needed; on error it is garbage
	}()
	// CreateTemp already uses 0600; Chmod keeps that true whatever the umask.
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Link(tmp, path); err != nil {
		return err
	}
	// Make the new directory entry durable too.
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
