package bus_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
)

// TestIdentityChangesDuringJetStreamWork admits and removes nodes while a
// client creates streams and buckets. nats-server reads its options
// unlocked while it creates a stream, so identity changes made by a
// configuration reload were a data race there (found by -race in CI);
// they must not touch the server's options at all.
func TestIdentityChangesDuringJetStreamWork(t *testing.T) {
	gwUser := bus.User{Name: "gateway", Password: "gw-secret"}
	s := bustest.StartServer(t, bustest.WithUsers(gwUser))
	gw := bustest.Connect(t, s, bus.ClientConfig{InProcess: s, User: gwUser.Name, Password: gwUser.Password})
	js := bustest.JetStream(t, gw)

	const rounds = 30
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var jsErr error
	wg.Go(func() {
		for i := range rounds {
			if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: fmt.Sprintf("S%d", i), Subjects: []string{fmt.Sprintf("s.%d.>", i)}}); err != nil {
				jsErr = err
				return
			}
			if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: fmt.Sprintf("kv%d", i)}); err != nil {
				jsErr = err
				return
			}
		}
	})
	var last bus.Identity
	for range 3 * rounds {
		last = newIdentity(t)
		if err := s.AddNKeyUser(nodeUser(t, last)); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if jsErr != nil {
		t.Fatalf("jetstream work next to identity changes: %v", jsErr)
	}
	names := map[string]bool{}
	for name := range js.StreamNames(ctx).Name() {
		names[name] = true
	}
	if len(names) != 2*rounds {
		t.Fatalf("streams and buckets after the run: %v, want %d", names, 2*rounds)
	}
	nodeClient(t, s, last)
	if _, nk := s.Users(); len(nk) != 3*rounds {
		t.Fatalf("nkey users = %d, want %d", len(nk), 3*rounds)
	}
}

// TestNKeySignatureChecked: a client that names an admitted node's public
// key but signs the nonce with another key, or not at all, is refused.
func TestNKeySignatureChecked(t *testing.T) {
	admitted, other := newIdentity(t), newIdentity(t)
	s := bustest.StartServer(t, bustest.WithNKeys(nodeUser(t, admitted)))
	signWith := func(seed []byte) nats.SignatureHandler {
		return func(nonce []byte) ([]byte, error) {
			kp, err := nkeys.FromSeed(seed)
			if err != nil {
				return nil, err
			}
			return kp.Sign(nonce)
		}
	}
	for _, tc := range []struct {
		name string
		sign nats.SignatureHandler
		ok   bool
	}{
		{"own key", signWith([]byte(admitted.Seed)), true},
		{"another key's signature", signWith([]byte(other.Seed)), false},
		{"no signature", func([]byte) ([]byte, error) { return nil, nil }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := nats.Connect(s.ClientURL(), nats.Nkey(admitted.PublicKey, tc.sign), nats.NoReconnect(), nats.Timeout(5*time.Second))
			if tc.ok {
				if err != nil {
					t.Fatalf("connect with the node's own key: %v", err)
				}
				nc.Close()
				return
			}
			if err == nil {
				nc.Close()
				t.Fatal("connected without the node's key")
			}
			if !errors.Is(err, nats.ErrAuthorization) {
				t.Fatalf("err = %v, want an authorization violation", err)
			}
		})
	}
}

// TestChangedIdentityDisconnects: re-admitting a node with the same
// permissions keeps its connection; new permissions or a new password
// close the identity's connections (and only those), and the permissions
// a reconnected client holds are the new ones.
func TestChangedIdentityDisconnects(t *testing.T) {
	gwUser := bus.User{Name: "gateway", Password: "gw-secret"}
	helper := bus.User{Name: "helper", Password: "one"}
	node := newIdentity(t)
	s := bustest.StartServer(t, bustest.WithUsers(gwUser, helper), bustest.WithNKeys(nodeUser(t, node)))
	gw := bustest.Connect(t, s, bus.ClientConfig{InProcess: s, User: gwUser.Name, Password: gwUser.Password})
	nc, sink := nodeClient(t, s, node)
	hc := bustest.Connect(t, s, bus.ClientConfig{User: helper.Name, Password: helper.Password})
	reconnects := func(c *nats.Conn) uint64 { return c.Stats().Reconnects }

	// Same permissions: nothing to do.
	if err := s.AddNKeyUser(nodeUser(t, node)); err != nil {
		t.Fatal(err)
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n := reconnects(nc); n != 0 || !nc.IsConnected() {
		t.Fatalf("node reconnected %d times after an unchanged re-admission", n)
	}

	// The node may now also publish on "extra".
	u := nodeUser(t, node)
	u.Permissions.Publish.Allow = append(u.Permissions.Publish.Allow, "extra")
	nc.Publish("extra", []byte("before"))
	nc.Flush()
	bustest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if sink.violations("extra") == 0 {
			return errors.New("publishing on extra was not refused before the change")
		}
		return nil
	})
	if err := s.AddNKeyUser(u); err != nil {
		t.Fatal(err)
	}
	bustest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if reconnects(nc) == 0 || !nc.IsConnected() {
			return errors.New("node not yet disconnected and reconnected")
		}
		return nil
	})
	got := make(chan string, 1)
	sub, err := gw.Subscribe("extra", func(m *nats.Msg) { got <- string(m.Data) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	gw.Flush()
	nc.Publish("extra", []byte("after"))
	nc.Flush()
	select {
	case m := <-got:
		if m != "after" {
			t.Fatalf("got %q", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the reconnected node does not hold its new permissions: %v", sink.all())
	}

	// A new password closes the helper's connection, which cannot come
	// back with the old one; the gateway is untouched.
	if err := s.AddUser(bus.User{Name: helper.Name, Password: "two", Permissions: &server.Permissions{}}); err != nil {
		t.Fatal(err)
	}
	bustest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if hc.IsConnected() {
			return errors.New("helper still connected with its old password")
		}
		return nil
	})
	if _, err := nats.Connect(s.ClientURL(), nats.UserInfo(helper.Name, "one"), nats.NoReconnect()); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("old password: %v, want an authorization violation", err)
	}
	roundTrip(t, gw, gw)
	if n := reconnects(gw); n != 0 {
		t.Fatalf("gateway reconnected %d times", n)
	}
}

// TestIdentityChangeKeepsAnswersInFlight: a node answers the gateway under
// allow_responses permissions, which nats-server tracks per delivered
// request. A configuration reload re-registered every client's
// permissions and so refused the answer to a request in flight; admitting
// and removing other identities must leave it alone.
func TestIdentityChangeKeepsAnswersInFlight(t *testing.T) {
	gwUser := bus.User{Name: "gateway", Password: "gw-secret"}
	node := newIdentity(t)
	s := bustest.StartServer(t, bustest.WithUsers(gwUser), bustest.WithNKeys(nodeUser(t, node)))
	gw := bustest.Connect(t, s, bus.ClientConfig{User: gwUser.Name, Password: gwUser.Password})
	nc, sink := nodeClient(t, s, node)

	subject := prefix + ".node." + node.NodeID + ".exec"
	received := make(chan *nats.Msg, 1)
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) { received <- m })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	answer := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		m, err := bus.RequestChunked(ctx, gw, subject, []byte("run"), nil)
		if err == nil && string(m.Data) != "done" {
			err = fmt.Errorf("answer %q", m.Data)
		}
		answer <- err
	}()
	var req *nats.Msg
	select {
	case req = <-received:
	case <-time.After(10 * time.Second):
		t.Fatal("the node never got the request")
	}
	// While the request is open: a join code's user comes and goes, a
	// new node is admitted and another removed.
	other := newIdentity(t)
	if err := s.AddUser(bus.User{Name: "join-1", Password: "x", Permissions: &server.Permissions{}}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddNKeyUser(nodeUser(t, other)); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveUser("join-1"); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveNKeyUser(other.PublicKey); err != nil {
		t.Fatal(err)
	}
	if err := bus.RespondChunked(nc, req.Reply, []byte("done"), nil); err != nil {
		t.Fatal(err)
	}
	if err := <-answer; err != nil {
		t.Fatalf("the answer in flight was lost: %v (node errors: %v)", err, sink.all())
	}
}
