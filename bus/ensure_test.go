package bus_test

import (
	"testing"
	"time"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
)

// TestEnsureStreamAndBucket: ensuring creates what is missing, leaves
// what matches as it is, and updates a setting that changed (a queue
// limit, a bucket's TTL), also on a second process's view.
func TestEnsureStreamAndBucket(t *testing.T) {
	srv := bustest.StartServer(t)
	js := bustest.JetStream(t, bustest.Connect(t, srv, bus.ClientConfig{}))
	other := bustest.JetStream(t, bustest.Connect(t, srv, bus.ClientConfig{Name: "other"}))
	ctx := t.Context()
	cfg := bus.EventStreamConfig("execmesh", 1, 10, time.Hour)
	for _, j := range []struct {
		name string
		want int64
	}{{"create", 10}, {"again", 10}} {
		s, err := bus.EnsureStream(ctx, js, cfg)
		if err != nil || s.CachedInfo().Config.MaxMsgsPerSubject != j.want {
			t.Fatalf("%s: %v", j.name, err)
		}
	}
	cfg.MaxMsgsPerSubject = 20
	if _, err := bus.EnsureStream(ctx, other, cfg); err != nil {
		t.Fatal(err)
	}
	if s, err := js.Stream(ctx, cfg.Name); err != nil || s.CachedInfo().Config.MaxMsgsPerSubject != 20 {
		t.Fatalf("changed limit not applied: %v", err)
	}
	kc, _ := bus.KeyValueConfigFor("execmesh", 1, bus.StreamNamesFor("execmesh").Idem)
	if _, err := bus.EnsureKeyValue(ctx, js, kc); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.EnsureKeyValue(ctx, other, kc); err != nil {
		t.Fatal(err)
	}
	kc.TTL = 2 * time.Hour
	kv, err := bus.EnsureKeyValue(ctx, js, kc)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := kv.Status(ctx); err != nil || st.TTL() != 2*time.Hour {
		t.Fatalf("bucket TTL after the change: %v", err)
	}
	if err := bus.EnsureStreams(ctx, js, "execmesh", 1); err != nil {
		t.Fatal(err)
	}
}
