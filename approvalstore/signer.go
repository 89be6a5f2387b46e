package approvalstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/protocol"
)

// signingSeedKey is the key of the approval signing seed in the control
// bucket.
const signingSeedKey = "approval-signing-seed"

// Signer holds the key the gateways of a deployment sign approval
// decisions with. It lives in the control bucket, which only gateway
// identities may read: the first gateway creates it, every other (and a
// gateway restarted on an empty state dir) reads the same, so nodes trust
// one key whichever gateway decides. Its methods are safe for concurrent
// use; Run must run for it to have a key.
type Signer struct {
	js       jetstream.JetStream
	prefix   string
	replicas int
	log      *slog.Logger

	mu    sync.Mutex
	kp    nkeys.KeyPair
	pub   string
	ready chan struct{} // closed once kp is set
}

// NewSigner returns the signer of the deployment with this subject prefix
// (its control bucket created with replicas when missing).
func NewSigner(js jetstream.JetStream, prefix string, replicas int, log *slog.Logger) *Signer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Signer{js: js, prefix: prefix, replicas: replicas, log: log, ready: make(chan struct{})}
}

// Run loads (or creates) the seed, retrying while JetStream is not there,
// and returns once it has the key or ctx ends.
func (s *Signer) Run(ctx context.Context) {
	for attempt := 1; ctx.Err() == nil; attempt++ {
		kp, err := s.load(ctx)
		if err == nil {
			pub, _ := kp.PublicKey()
			s.mu.Lock()
			s.kp, s.pub = kp, pub
			s.mu.Unlock()
			close(s.ready)
			return
		}
		s.log.Warn("approval signing key not available; retrying", "attempt", attempt, "err", err)
		if !bus.Backoff(ctx, attempt) {
			return
		}
	}
}

func (s *Signer) load(ctx context.Context) (nkeys.KeyPair, error) {
	kv, err := bus.OpenKeyValue(ctx, s.js, s.prefix, s.replicas, bus.StreamNamesFor(s.prefix).Control)
	if err != nil {
		return nil, err
	}
	if e, err := kv.Get(ctx, signingSeedKey); err == nil {
		return nkeys.FromSeed(e.Value())
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("read the signing seed: %w", err)
	}
	kp, err := nkeys.CreateAccount()
	if err != nil {
		return nil, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	if _, err := kv.Create(ctx, signingSeedKey, seed); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("store the signing seed: %w", err)
		}
		// Another gateway made it first: use that one.
		e, gerr := kv.Get(ctx, signingSeedKey)
		if gerr != nil {
			return nil, gerr
		}
		return nkeys.FromSeed(e.Value())
	}
	s.log.Info("approval signing key created")
	return kp, nil
}

// Trusted returns the signing public key once known (the keys hosts
// trust), else nil.
func (s *Signer) Trusted() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pub == "" {
		return nil
	}
	return []string{s.pub}
}

// PublicKey waits (within ctx) for the key and returns its public half.
func (s *Signer) PublicKey(ctx context.Context) (string, error) {
	select {
	case <-s.ready:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pub, nil
}

// Sign signs a decision; before the key is loaded it is a retryable 503.
func (s *Signer) Sign(ctx context.Context, d protocol.Decision) (protocol.SignedDecision, error) {
	if _, err := s.PublicKey(ctx); err != nil {
		return protocol.SignedDecision{}, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: "the approval signing key is not available yet (JetStream starting)"}
	}
	s.mu.Lock()
	kp := s.kp
	s.mu.Unlock()
	return host.SignDecision(kp, d)
}
