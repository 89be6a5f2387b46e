package host

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/execmesh/execmesh/protocol"
)

// Errors of VerifyDecision.
var (
	ErrUntrustedKey    = errors.New("signed by a key this host does not trust")
	ErrBadSignature    = errors.New("the signature does not verify")
	ErrDecisionExpired = errors.New("the decision expired")
)

// SignDecision signs d with the gateway's key pair: the signature covers
// d's JSON encoding, which is deterministic for a given value.
func SignDecision(kp nkeys.KeyPair, d protocol.Decision) (protocol.SignedDecision, error) {
	pub, err := kp.PublicKey()
	if err != nil {
		return protocol.SignedDecision{}, fmt.Errorf("host: sign decision: %w", err)
	}
	b, err := json.Marshal(d)
	if err != nil {
		return protocol.SignedDecision{}, fmt.Errorf("host: sign decision: %w", err)
	}
	sig, err := kp.Sign(b)
	if err != nil {
		return protocol.SignedDecision{}, fmt.Errorf("host: sign decision: %w", err)
	}
	return protocol.SignedDecision{Decision: d, GatewayKey: pub, Signature: base64.RawURLEncoding.EncodeToString(sig)}, nil
}

// VerifyDecision checks a signed decision: its key is one of trusted, the
// signature verifies over the decision as received, and it has not expired
// at now.
func VerifyDecision(sd protocol.SignedDecision, trusted []string, now time.Time) error {
	if sd.GatewayKey == "" || !slices.Contains(trusted, sd.GatewayKey) {
		return ErrUntrustedKey
	}
	kp, err := nkeys.FromPublicKey(sd.GatewayKey)
	if err != nil {
		return ErrUntrustedKey
	}
	sig, err := base64.RawURLEncoding.DecodeString(sd.Signature)
	if err != nil {
		return ErrBadSignature
	}
	b, err := json.Marshal(sd.Decision)
	if err != nil {
		return ErrBadSignature
	}
	if kp.Verify(b, sig) != nil {
		return ErrBadSignature
	}
	if now.UnixMilli() > sd.Decision.ExpiresAtMs {
		return ErrDecisionExpired
	}
	return nil
}
