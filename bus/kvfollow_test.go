package bus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
)

// TestWatchKeyValue: a watch hands over the current values, says when it
// has, then every put, delete and key removed by its TTL, the same over
// the network and in process, through kv.Watch's consumer (its idle
// heartbeat 5 s).
func TestWatchKeyValue(t *testing.T) {
	s := bustest.StartServer(t)
	for _, c := range []struct {
		name string
		cfg  bus.ClientConfig
		hb   time.Duration
	}{
		{"network", bus.ClientConfig{}, 5 * time.Second},
		{"in process", bus.ClientConfig{InProcess: s}, 5 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			js := bustest.JetStream(t, bustest.Connect(t, s, c.cfg))
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			name := "w_" + fmt.Sprint(time.Now().UnixNano())
			if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name, TTL: time.Second, LimitMarkerTTL: time.Minute}); err != nil {
				t.Fatal(err)
			}
			kv, err := bus.OpenKeyValue(ctx, js, "execmesh", 1, name)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := kv.Put(ctx, "a", []byte("1")); err != nil {
				t.Fatal(err)
			}
			got := make(chan string, 16)
			ended := make(chan error, 1)
			go func() {
				ended <- bus.WatchKeyValue(ctx, kv, ">", func() { got <- "loaded" }, func(e jetstream.KeyValueEntry) {
					got <- fmt.Sprintf("%s %s=%s", e.Operation(), e.Key(), e.Value())
				})
			}()
			want := func(w string) {
				t.Helper()
				select {
				case g := <-got:
					if g != w {
						t.Fatalf("got %q, want %q", g, w)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("no %q", w)
				}
			}
			want("KeyValuePutOp a=1")
			want("loaded")
			if _, err := kv.Put(ctx, "b", []byte("2")); err != nil {
				t.Fatal(err)
			}
			want("KeyValuePutOp b=2")
			if err := kv.Delete(ctx, "b"); err != nil {
				t.Fatal(err)
			}
			want("KeyValueDeleteOp b=")
			want("KeyValuePurgeOp a=") // a's TTL passed: the marker
			st, err := js.Stream(ctx, "KV_"+name)
			if err != nil {
				t.Fatal(err)
			}
			infos := st.ListConsumers(ctx)
			n := 0
			for ci := range infos.Info() {
				n++
				if ci.Config.IdleHeartbeat != c.hb {
					t.Errorf("the watch's consumer sends heartbeats every %s, want %s", ci.Config.IdleHeartbeat, c.hb)
				}
			}
			if n != 1 {
				t.Errorf("%d consumers, want the watch's", n)
			}
			cancel()
			select {
			case err := <-ended:
				if err != nil {
					t.Errorf("watch ended with %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the watch did not end with its context")
			}
		})
	}
}
