package bus

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func TestReconnectDelay(t *testing.T) {
	for attempt := 1; attempt <= 100; attempt++ {
		lower := reconnectMax
		if attempt < 16 {
			lower = min(reconnectBase<<(attempt-1), reconnectMax)
		}
		if d := reconnectDelay(attempt); d < lower || d >= lower+reconnectJitter {
			t.Fatalf("attempt %d: delay %s, want [%s, %s)", attempt, d, lower, lower+reconnectJitter)
		}
	}
	if d := reconnectDelay(1_000_000); d < reconnectMax || d >= reconnectMax+reconnectJitter {
		t.Fatalf("huge attempt count: %s", d)
	}
}

func TestParseChunk(t *testing.T) {
	good := map[string][2]int{"1/1": {1, 1}, "3/7": {3, 7}, "65536/65536": {65536, 65536}}
	for v, want := range good {
		i, n, err := parseChunk(v)
		if err != nil || i != want[0] || n != want[1] {
			t.Errorf("parseChunk(%q) = %d, %d, %v", v, i, n, err)
		}
	}
	for _, v := range []string{"", "1", "/", "0/1", "2/1", "-1/2", "1/65537", "a/2", "1/b", "1/2/3"} {
		if _, _, err := parseChunk(v); err == nil {
			t.Errorf("parseChunk(%q) accepted", v)
		}
	}
}

func TestIsLoopback(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.1.2.3": true, "::1": true, "localhost": true,
		"": false, "0.0.0.0": false, "::": false, "10.0.0.1": false, "example.com": false,
	} {
		if got := isLoopback(host); got != want {
			t.Errorf("isLoopback(%q) = %v", host, got)
		}
	}
}

// startTestServer is a minimal stand-in for bustest (which imports bus and
// so cannot be used here).
func startTestServer(t *testing.T, maxPayload int) *nats.Conn {
	t.Helper()
	s, err := StartServer(t.Context(), ServerConfig{Listen: "127.0.0.1:-1", MaxPayload: maxPayload})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	nc, err := Connect(t.Context(), ClientConfig{InProcess: s}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestFlowControlBoundsInFlight: a requester that never acknowledges gets
// two windows and no more, and the responder gives up with ErrFlowStalled.
func TestFlowControlBoundsInFlight(t *testing.T) {
	nc := startTestServer(t, 4096)
	size := ChunkSize(nc) - headerSize(nil)
	const window = 4
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	payload := make([]byte, 20*size)
	done := make(chan error, 1)
	go func() { done <- respondChunked(nc, inbox, payload, nil, window*size, 2*time.Second) }()

	got, withReply := 0, 0
	for {
		m, err := sub.NextMsg(time.Second)
		if err != nil {
			break
		}
		got++
		if m.Reply != "" {
			withReply++
		}
	}
	if got != 2*window || withReply != 2 {
		t.Fatalf("received %d parts (%d asking for an ack); want %d and 2", got, withReply, 2*window)
	}
	if err := <-done; !errors.Is(err, ErrFlowStalled) {
		t.Fatalf("responder: %v, want ErrFlowStalled", err)
	}
}

// TestFlowControlRoundTrip: RequestChunked acknowledges windows, so many
// small windows get through intact.
func TestFlowControlRoundTrip(t *testing.T) {
	nc := startTestServer(t, 4096)
	size := ChunkSize(nc) - headerSize(nil)
	payload := make([]byte, 50*size+17)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	errs := make(chan error, 1)
	sub, err := nc.Subscribe("flow", func(m *nats.Msg) {
		go func() { errs <- respondChunked(nc, m.Reply, payload, nil, 3*size, 5*time.Second) }()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	m, err := RequestChunked(t.Context(), nc, "flow", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.Data, payload) {
		t.Fatal("payload differs")
	}
	if err := <-errs; err != nil {
		t.Fatalf("responder: %v", err)
	}
}

// TestFlowControlRequesterGone: the responder stops as soon as the
// requester's inbox has no subscriber.
func TestFlowControlRequesterGone(t *testing.T) {
	nc := startTestServer(t, 4096)
	size := ChunkSize(nc) - headerSize(nil)
	start := time.Now()
	err := respondChunked(nc, nc.NewInbox(), make([]byte, 20*size), nil, 2*size, 10*time.Second)
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("err = %v, want ErrUnreachable", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %s", d)
	}
}

// TestFlowControlUnderNodePermissions: acknowledgements flow both ways
// between the gateway and a confined node: the gateway acks into the
// node's inbox, and the node acks the gateway's parts through
// allow_responses.
func TestFlowControlUnderNodePermissions(t *testing.T) {
	id, err := NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	nu, err := NodeUser(DefaultPrefix, id.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	s, err := StartServer(t.Context(), ServerConfig{
		Listen: "127.0.0.1:-1", MaxPayload: 4096,
		Users: []User{{Name: "gw", Password: "pw"}}, NKeys: []NKeyUser{nu},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	var mu sync.Mutex
	var asyncErrs []error
	connect := func(cfg ClientConfig) *nats.Conn {
		cfg.URLs = []string{s.ClientURL()}
		cfg.ErrorHandler = func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			asyncErrs = append(asyncErrs, err)
			mu.Unlock()
		}
		nc, err := Connect(t.Context(), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	gw := connect(ClientConfig{User: "gw", Password: "pw"})
	node := connect(ClientConfig{NKeySeed: id.Seed, InboxPrefix: InboxPrefix(id.NodeID)})
	size := ChunkSize(gw) - headerSize(nil)
	payload := make([]byte, 30*size)
	for i := range payload {
		payload[i] = byte(i)
	}
	respond := func(nc *nats.Conn, subject string) {
		sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
			go func() {
				if err := respondChunked(nc, m.Reply, payload, nil, 2*size, 5*time.Second); err != nil {
					t.Errorf("respond on %s: %v", subject, err)
				}
			}()
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sub.Unsubscribe() })
		nc.Flush()
	}
	nodeSubj := DefaultPrefix + ".node." + id.NodeID + ".log"
	pairSubj := DefaultPrefix + ".pair.request"
	respond(node, nodeSubj)
	respond(gw, pairSubj)
	for _, c := range []struct {
		nc      *nats.Conn
		subject string
	}{{gw, nodeSubj}, {node, pairSubj}} {
		m, err := RequestChunked(t.Context(), c.nc, c.subject, nil, nil)
		if err != nil {
			t.Fatalf("request %s: %v", c.subject, err)
		}
		if !bytes.Equal(m.Data, payload) {
			t.Fatalf("request %s: payload differs", c.subject)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asyncErrs) != 0 {
		t.Fatalf("async errors: %v", asyncErrs)
	}
}

// TestServerWatchCallsInARowDoNotKick: the first call after a pause
// has Run look again (pings every Interval now, not IdleInterval); calls
// that follow it, each ended before the next began, find Run set for that
// and do not wake it (a wake-up per call on the exec path).
func TestServerWatchCallsInARowDoNotKick(t *testing.T) {
	nc := startTestServer(t, 0)
	w := NewServerWatch(nc, ServerWatchOptions{Interval: time.Hour, IdleInterval: 2 * time.Hour, Timeout: time.Second})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	kicks := func() int {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.kicks
	}
	waitDue := func(what string, idle bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			w.mu.Lock()
			set := !w.due.IsZero() && w.dueIdle == idle
			w.mu.Unlock()
			if set {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitDue("Run set no idle pause after its first ping", true)
	k0 := kicks()
	for i := range 20 {
		_, release := w.Watch(t.Context())
		if i == 0 {
			// Run takes the kick and works out the pause of a call
			// waiting, while this one does.
			waitDue("Run did not take the first call's kick", false)
		}
		release()
	}
	if got := kicks() - k0; got != 1 {
		t.Errorf("20 calls in a row kicked Run %d times, want 1 (the first)", got)
	}
}
