package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/protocol"
)

func TestStreamNames(t *testing.T) {
	got := bus.StreamNamesFor(bus.DefaultPrefix)
	want := bus.StreamNames{Exit: "EXECMESH_EXIT", Events: "EXECMESH_EVENTS", Nodes: "execmesh_nodes", Sessions: "execmesh_sessions",
		Approvals: "execmesh_approvals", Joins: "execmesh_joins", Cursors: "execmesh_evcursor", Gateways: "execmesh_gateways", Control: "execmesh_control", Idem: "execmesh_idem"}
	if got != want {
		t.Fatalf("StreamNamesFor(%q) = %+v", bus.DefaultPrefix, got)
	}
	if got := bus.StreamNamesFor("acme-prod"); got.Exit != "ACME-PROD_EXIT" || got.Sessions != "acme-prod_sessions" {
		t.Fatalf("names for acme-prod = %+v", got)
	}
}

func TestEnsureStreamsIdempotent(t *testing.T) {
	s := bustest.StartServer(t)
	nc := bustest.Connect(t, s, bus.ClientConfig{})
	js := bustest.JetStream(t, nc)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for range 3 {
		if err := bus.EnsureStreams(ctx, js, bus.DefaultPrefix, 1); err != nil {
			t.Fatal(err)
		}
	}
	names := bus.StreamNamesFor(bus.DefaultPrefix)
	st, err := js.Stream(ctx, names.Exit)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if cfg.Duplicates != bus.ExitDuplicateWindow || cfg.Storage != jetstream.FileStorage ||
		len(cfg.Subjects) != 1 || cfg.Subjects[0] != "execmesh.events.exit.*" {
		t.Fatalf("exit stream config %+v", cfg)
	}
	streams := 0
	for range js.StreamNames(ctx).Name() {
		streams++
	}
	if want := 2 + len(names.Buckets()); streams != want { // exit, events and the KV streams
		t.Fatalf("%d streams after three EnsureStreams, want %d", streams, want)
	}

	// KV semantics the other packages rely on.
	idem, err := js.KeyValue(ctx, names.Sessions)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Create(ctx, "k1", []byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Create(ctx, "k1", []byte("b")); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Fatalf("second Create = %v, want ErrKeyExists", err)
	}
	// Per-key TTLs work (LimitMarkerTTL is set).
	if _, err := idem.Create(ctx, "short", []byte("x"), jetstream.KeyTTL(time.Second)); err != nil {
		t.Fatalf("Create with KeyTTL: %v", err)
	}
}

func TestExitEventDeduplicated(t *testing.T) {
	s := bustest.StartServer(t)
	nc := bustest.Connect(t, s, bus.ClientConfig{})
	js := bustest.JetStream(t, nc)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := bus.EnsureStreams(ctx, js, bus.DefaultPrefix, 1); err != nil {
		t.Fatal(err)
	}
	code := 3
	ev := protocol.ExitEvent{SessionID: "nimble-coral", NodeID: "abcdefgh23456789", Status: "completed", ExitCode: &code, StartedAt: 1700000000000}
	ack1, err := bus.PublishExitEvent(ctx, js, bus.DefaultPrefix, ev)
	if err != nil {
		t.Fatal(err)
	}
	ack2, err := bus.PublishExitEvent(ctx, js, bus.DefaultPrefix, ev)
	if err != nil {
		t.Fatal(err)
	}
	if ack1.Duplicate || !ack2.Duplicate {
		t.Fatalf("duplicate flags %v %v, want false true", ack1.Duplicate, ack2.Duplicate)
	}
	// Same slug on another node is a different event.
	ev.NodeID = "zzzzzzzzzzzzzzzz"
	if ack, err := bus.PublishExitEvent(ctx, js, bus.DefaultPrefix, ev); err != nil || ack.Duplicate {
		t.Fatalf("other node's event: %v %v", ack, err)
	}
	st, err := js.Stream(ctx, bus.StreamNamesFor(bus.DefaultPrefix).Exit)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("%d messages stored, want 2", info.State.Msgs)
	}
	msg, err := st.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := msg.Header.Get(jetstream.MsgIDHeader); got != "abcdefgh23456789:nimble-coral:1700000000000:exit" {
		t.Fatalf("msg id %q", got)
	}
	if msg.Subject != "execmesh.events.exit.abcdefgh23456789" {
		t.Fatalf("subject %q", msg.Subject)
	}
}

func TestPublishExitEventRejectsBadNodeID(t *testing.T) {
	s := bustest.StartServer(t)
	nc := bustest.Connect(t, s, bus.ClientConfig{})
	_, err := bus.PublishExitEvent(t.Context(), bustest.JetStream(t, nc), bus.DefaultPrefix, protocol.ExitEvent{NodeID: "*"})
	if err == nil {
		t.Fatal("published with node id *")
	}
}

func TestEnsureStreamsWithoutJetStreamFails(t *testing.T) {
	s := bustest.StartServer(t, bustest.WithoutJetStream())
	nc := bustest.Connect(t, s, bus.ClientConfig{})
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if err := bus.EnsureStreams(ctx, bustest.JetStream(t, nc), bus.DefaultPrefix, 1); err == nil {
		t.Fatal("EnsureStreams succeeded without JetStream")
	}
}
