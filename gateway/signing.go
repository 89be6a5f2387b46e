package gateway

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/protocol"
)

// signingSeedKey is the key of the approval signing seed in the control
// bucket.
const signingSeedKey = "approval-signing-seed"

// signer holds the key the gateways of a deployment sign approval
// decisions with. It lives in the control bucket, which only gateway
// identities may read: the first gateway creates it, every other (and a
// gateway restarted on an empty state dir) reads the same, so nodes trust
// one key whichever gateway decides.
type signer struct {
	js       jetstream.JetStream
	prefix   string
	replicas int
	log      *slog.Logger

	mu    sync.Mutex
	kp    nkeys.KeyPair
	pub   string
	ready chan struct{}
}

func newSigner(js jetstream.JetStream, prefix string, replicas int, log *slog.Logger) *signer {
	return &signer{js: js, prefix: prefix, replicas: replicas, log: log, ready: make(chan struct{})}
}

// run loads (or creates) the seed, retrying while JetStream is not there.
func (s *signer) run(ctx context.Context) {
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
		t := time.NewTimer(min(time.Duration(attempt)*500*time.Millisecond, 10*time.Second))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (s *signer) load(ctx context.Context) (nkeys.KeyPair, error) {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	kv, err := controlBucket(actx, s.js, s.prefix, s.replicas)
	if err != nil {
		return nil, err
	}
	if e, err := kv.Get(actx, signingSeedKey); err == nil {
		return nkeys.FromSeed(e.Value())
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, err
	}
	kp, err := nkeys.CreateAccount()
	if err != nil {
		return nil, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	if _, err := kv.Create(actx, signingSeedKey, seed); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			// Another gateway made it first: use that one.
			e, gerr := kv.Get(actx, signingSeedKey)
			if gerr != nil {
				return nil, gerr
			}
			return nkeys.FromSeed(e.Value())
		}
		return nil, err
	}
	s.log.Info("approval signing key created")
	return kp, nil
}

// controlBucket opens the control bucket, creating it when missing.
func controlBucket(ctx context.Context, js jetstream.JetStream, prefix string, replicas int) (jetstream.KeyValue, error) {
	name := bus.StreamNamesFor(prefix).Control
	kv, err := js.KeyValue(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		for _, c := range bus.KeyValueConfigs(prefix, replicas) {
			if c.Bucket == name {
				return js.CreateOrUpdateKeyValue(ctx, c)
			}
		}
	}
	return kv, err
}

// trusted returns the signing public key, once known (the keys hosts
// trust).
func (s *signer) trusted() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pub == "" {
		return nil
	}
	return []string{s.pub}
}

// publicKey waits for the key.
func (s *signer) publicKey(ctx context.Context) (string, error) {
	select {
	case <-s.ready:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pub, nil
}

// sign signs a decision.
func (s *signer) sign(ctx context.Context, d protocol.Decision) (protocol.SignedDecision, error) {
	if _, err := s.publicKey(ctx); err != nil {
		return protocol.SignedDecision{}, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: "the approval signing key is not available yet (JetStream starting)"}
	}
	s.mu.Lock()
	kp := s.kp
	s.mu.Unlock()
	return host.SignDecision(kp, d)
}
