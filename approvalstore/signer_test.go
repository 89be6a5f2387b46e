package approvalstore

import (
	"context"
	"testing"
	"time"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/protocol"
)

// TestSignersShareOneKey: two gateways' signers on one JetStream end with
// one key (whoever created it first), a decision signed by either is
// trusted with the other's key, and a signer without its key yet answers
// a retryable 503 instead of signing.
func TestSignersShareOneKey(t *testing.T) {
	srv := bustest.StartServer(t)
	js := bustest.JetStream(t, bustest.Connect(t, srv, bus.ClientConfig{}))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	a := NewSigner(js, "execmesh", 1, nil)
	b := NewSigner(js, "execmesh", 1, nil)
	if b.Trusted() != nil {
		t.Fatal("a signer trusts a key before it has one")
	}
	short, scancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := b.Sign(short, protocol.Decision{ApprovalID: "x"})
	scancel()
	if pe := protocol.AsError(err); pe == nil || pe.Type != protocol.ErrUnavailable || !pe.Retryable {
		t.Fatalf("sign before the key: %v", err)
	}
	go a.Run(ctx)
	go b.Run(ctx)
	ka, err := a.PublicKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := b.PublicKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ka != kb || ka == "" {
		t.Fatalf("keys %q and %q, want one", ka, kb)
	}
	d := protocol.Decision{ApprovalID: "appr-1", Decision: "allow-once", ExpiresAtMs: time.Now().Add(time.Minute).UnixMilli()}
	sd, err := a.Sign(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if err := host.VerifyDecision(sd, b.Trusted(), time.Now()); err != nil {
		t.Fatalf("A's decision with B's key: %v", err)
	}
	// A third signer (a gateway restarted on an empty state dir) reads
	// the same key.
	c := NewSigner(js, "execmesh", 1, nil)
	go c.Run(ctx)
	if kc, err := c.PublicKey(ctx); err != nil || kc != ka {
		t.Fatalf("restarted signer: %q %v, want %q", kc, err, ka)
	}
}
