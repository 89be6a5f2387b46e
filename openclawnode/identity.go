package openclawnode

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/execmesh/execmesh/internal/atomicfile"
)

// Files in the node's state dir.
const (
	// IdentityFile holds the node's OpenClaw device identity: an Ed25519
	// key pair, created on first use.
	IdentityFile = "openclaw-device.json"
	// DeviceTokenFile holds the device token of the gateway's last
	// hello-ok, used when no gateway token is configured.
	DeviceTokenFile = "openclaw-device-token.json"
)

// Identity is an OpenClaw device identity: an Ed25519 key and the device
// id derived from it.
type Identity struct {
	// DeviceID is hex(sha256(raw public key)), as OpenClaw derives it
	// (dist/device-identity-*.mjs).
	DeviceID   string
	PublicKey  ed25519.PublicKey
	PrivateKey ed25519.PrivateKey
}

// NewIdentity returns the identity of key.
func NewIdentity(key ed25519.PrivateKey) Identity {
	id := Identity{PublicKey: key.Public().(ed25519.PublicKey), PrivateKey: key}
	id.DeviceID = id.derivedID()
	return id
}

// PublicKeyBase64URL is the raw public key, base64url without padding:
// the connect request's device.publicKey.
func (id Identity) PublicKeyBase64URL() string {
	return base64.RawURLEncoding.EncodeToString(id.PublicKey)
}

// Sign signs payload and returns the signature as base64url without
// padding: the connect request's device.signature.
func (id Identity) Sign(payload string) string {
	return base64.RawURLEncoding.EncodeToString(ed25519.Sign(id.PrivateKey, []byte(payload)))
}

// SignatureParams are the fields of the v3 device signature.
type SignatureParams struct {
	DeviceID, ClientID, ClientMode, Role string
	Scopes                               []string
	SignedAtMs                           int64
	Token, Nonce                         string
	Platform, DeviceFamily               string
}

// SignaturePayload builds the string a device signs in protocol 4 (v3 of
// OpenClaw's buildDeviceAuthPayloadV3): fields joined with "|", scopes
// joined with ",", platform and device family trimmed and with A-Z
// lowered (and nothing else: OpenClaw lowers ASCII only).
func SignaturePayload(p SignatureParams) string {
	return strings.Join([]string{
		"v3", p.DeviceID, p.ClientID, p.ClientMode, p.Role, strings.Join(p.Scopes, ","),
		strconv.FormatInt(p.SignedAtMs, 10), p.Token, p.Nonce,
		normalizeMetadata(p.Platform), normalizeMetadata(p.DeviceFamily),
	}, "|")
}

func normalizeMetadata(s string) string {
	s = strings.TrimSpace(s)
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 32
		}
	}
	return string(b)
}

// identityFile is IdentityFile's content.
type identityFile struct {
	Version  int    `json:"version"`
	DeviceID string `json:"deviceId"`
	// Seed is the Ed25519 seed, base64url.
	Seed string `json:"seed"`
}

// LoadOrCreateIdentity reads the identity in dir, creating it (mode 0600)
// when there is none. A file that does not hold a valid key, or whose
// device id does not match its key, is an error: replacing it would make
// the node a new device the gateway has to pair again.
func LoadOrCreateIdentity(dir string) (Identity, error) {
	path := filepath.Join(dir, IdentityFile)
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		_, key, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return Identity{}, fmt.Errorf("openclawnode: generate device key: %w", err)
		}
		id := NewIdentity(key)
		out, _ := json.MarshalIndent(identityFile{Version: 1, DeviceID: id.DeviceID,
			Seed: base64.RawURLEncoding.EncodeToString(key.Seed())}, "", "  ")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return Identity{}, fmt.Errorf("openclawnode: state dir: %w", err)
		}
		if err := atomicfile.WriteNew(path, append(out, '\n'), 0o600); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return LoadOrCreateIdentity(dir) // another process won
			}
			return Identity{}, fmt.Errorf("openclawnode: save device identity: %w", err)
		}
		return id, nil
	case err != nil:
		return Identity{}, fmt.Errorf("openclawnode: read device identity: %w", err)
	}
	var f identityFile
	if err := json.Unmarshal(data, &f); err != nil {
		return Identity{}, fmt.Errorf("openclawnode: %s: %w", path, err)
	}
	seed, err := base64.RawURLEncoding.DecodeString(f.Seed)
	if err != nil || len(seed) != ed25519.SeedSize {
		return Identity{}, fmt.Errorf("openclawnode: %s: seed is not a base64url Ed25519 seed", path)
	}
	id := NewIdentity(ed25519.NewKeyFromSeed(seed))
	if f.DeviceID != id.DeviceID {
		return Identity{}, fmt.Errorf("openclawnode: %s: deviceId %q does not match its key (%s)", path, f.DeviceID, id.DeviceID)
	}
	return id, nil
}

// deviceToken is DeviceTokenFile's content: the token a gateway issued
// to this device, for that gateway only.
type deviceToken struct {
	Gateway  string   `json:"gateway"`
	DeviceID string   `json:"deviceId"`
	Role     string   `json:"role"`
	Token    string   `json:"token"`
	Scopes   []string `json:"scopes,omitempty"`
}

// loadDeviceToken returns the device token saved for gateway, or "".
func loadDeviceToken(dir, gateway, deviceID string) (string, error) {
	data, err := os.ReadFile(filepath.Join(dir, DeviceTokenFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("openclawnode: read device token: %w", err)
	}
	var t deviceToken
	if err := json.Unmarshal(data, &t); err != nil {
		return "", fmt.Errorf("openclawnode: %s: %w", DeviceTokenFile, err)
	}
	if t.Gateway != gateway || t.DeviceID != deviceID {
		return "", nil
	}
	return t.Token, nil
}

// saveDeviceToken keeps the device token of a hello-ok (mode 0600).
func saveDeviceToken(dir string, t deviceToken) error {
	out, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, DeviceTokenFile), append(out, '\n'), 0o600); err != nil {
		return fmt.Errorf("openclawnode: save device token: %w", err)
	}
	return nil
}

// derivedID is hex(sha256(public key)).
func (id Identity) derivedID() string {
	sum := sha256.Sum256(id.PublicKey)
	return hex.EncodeToString(sum[:])
}
