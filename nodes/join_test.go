package nodes

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/protocol"
)

// testClock is a settable clock for join-code expiry.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// decodeCode reads a join code as a node does.
func decodeCode(t *testing.T, code string) protocol.JoinCode {
	t.Helper()
	raw, err := base64.RawURLEncoding.DecodeString(code)
	if err != nil {
		t.Fatal(err)
	}
	var jc protocol.JoinCode
	if err := json.Unmarshal(raw, &jc); err != nil {
		t.Fatal(err)
	}
	return jc
}

// joinRequest is the join request of node id for code, signed with
// signer's key (id's own unless a test forges it).
func joinRequest(t *testing.T, id, signer bus.Identity, code protocol.JoinCode, name string) protocol.NodePairRequest {
	t.Helper()
	kp, err := nkeys.FromSeed(signer.Seed)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := kp.Sign(protocol.JoinSignedText(code.Secret, id.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	return protocol.NodePairRequest{
		Type: protocol.NodePairJoin, NodeID: id.NodeID, PublicKey: id.PublicKey, Name: name, Platform: "linux",
		JoinUser: code.User, JoinSecret: code.Secret, Signature: base64.RawURLEncoding.EncodeToString(sig),
	}
}

// redeem sends a join request over NATS as the code's one-time user (or
// as the gateway on a server without authentication).
func redeem(t *testing.T, srv *bus.Server, code protocol.JoinCode, req protocol.NodePairRequest) protocol.NodePairResponse {
	t.Helper()
	cc := bus.ClientConfig{Name: "joiner"}
	if code.User != "" {
		// As a joining node: the user may read replies only under its
		// own inbox prefix.
		cc.User, cc.Password, cc.InboxPrefix = code.User, code.Secret, bus.InboxPrefix(code.User)
	} else if users, _ := srv.Users(); len(users) > 0 {
		cc.User, cc.Password = gatewayUser.Name, gatewayUser.Password
	}
	nc := bustest.Connect(t, srv, cc)
	defer nc.Close()
	b, _ := json.Marshal(req)
	m, err := nc.Request(protocol.Subjects(protocol.DefaultSubjectPrefix).PairRequest, b, 10*time.Second)
	if err != nil {
		t.Fatalf("join request: %v", err)
	}
	var resp protocol.NodePairResponse
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		t.Fatalf("join answer %s: %v", m.Data, err)
	}
	return resp
}

func newIdentity(t *testing.T) bus.Identity {
	t.Helper()
	id, err := bus.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestJoinCodes: a join code is issued with the URLs, one-time user and
// gateway keys a node needs; the embedded server admits its one-time
// user; it is redeemed once (the same node asking again is answered as
// joined, another node is refused), not after it expired, and never with
// a forged signature or someone else's node id.
func TestJoinCodes(t *testing.T) {
	t.Parallel()
	srv := bustest.StartServer(t, bustest.WithUsers(gatewayUser))
	clock := &testClock{t: time.Now()}
	r := startRegistry(t, srv, func(o *Options) {
		o.Server = srv
		o.JoinURLs = func() []string { return []string{"nats://gw.example:4222"} }
		o.GatewayKeys = func() []string { return []string{"UGATEWAYKEY"} }
		o.Now = clock.Now
	})

	inv, err := r.Invite(t.Context(), "builder", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	code := decodeCode(t, inv.Code)
	if inv.Command != "execmesh node --join "+inv.Code || inv.ExpiresAtMs != clock.Now().Add(time.Minute).UnixMilli() ||
		code.V != 1 || !slices.Equal(code.URLs, []string{"nats://gw.example:4222"}) || code.User == "" || len(code.Secret) < 32 ||
		code.Name != "builder" || code.ExpiresAt != inv.ExpiresAtMs || !slices.Equal(code.GatewayKeys, []string{"UGATEWAYKEY"}) {
		t.Fatalf("invite %+v, code %+v", inv, code)
	}
	users, _ := srv.Users()
	if !slices.ContainsFunc(users, func(u bus.User) bool {
		return u.Name == code.User && u.PasswordSHA256 == secretKey(code.Secret) && u.Password == ""
	}) {
		t.Fatalf("the code's one-time user is not admitted (by the secret's hash only): %v", users)
	}

	a, b, c := newIdentity(t), newIdentity(t), newIdentity(t)
	other, _ := r.Invite(t.Context(), "", time.Minute)
	otherCode := decodeCode(t, other.Code)
	for _, tc := range []struct {
		name    string
		code    protocol.JoinCode
		req     protocol.NodePairRequest
		errType protocol.ErrorType
		errText string
	}{
		{"forged signature", otherCode, joinRequest(t, c, b, otherCode, ""), protocol.ErrDenied, "signature"},
		{"another node's id", otherCode, func() protocol.NodePairRequest {
			req := joinRequest(t, c, c, otherCode, "")
			req.NodeID = a.NodeID
			return req
		}(), protocol.ErrInvalidRequest, "does not match"},
		{"unknown secret", otherCode, joinRequest(t, c, c, protocol.JoinCode{User: otherCode.User, Secret: strings.Repeat("0", 64)}, ""), protocol.ErrNotFound, "not valid"},
		{"redeemed", code, joinRequest(t, a, a, code, ""), "", ""},
		{"same node again", code, joinRequest(t, a, a, code, ""), "", ""},
		{"second node", code, joinRequest(t, b, b, code, ""), protocol.ErrConflict, "already used (by node " + a.NodeID},
	} {
		resp := redeem(t, srv, tc.code, tc.req)
		if tc.errType != "" {
			if resp.Error == nil || resp.Error.Type != tc.errType || !strings.Contains(resp.Error.Message, tc.errText) || resp.Status != "" {
				t.Errorf("%s: %+v, want a %s error mentioning %q", tc.name, resp, tc.errType, tc.errText)
			}
			continue
		}
		if resp.Error != nil || resp.Status != protocol.NodePairingPaired || resp.NodeID != tc.req.NodeID || !slices.Equal(resp.GatewayKeys, []string{"UGATEWAYKEY"}) {
			t.Errorf("%s: %+v", tc.name, resp)
		}
	}
	n, ok := r.Get(a.NodeID)
	if !ok || n.Pairing != protocol.NodePairingPaired || !n.Joined || n.Name != "builder" || n.PublicKey != a.PublicKey {
		t.Errorf("the joined node: %+v %v", n, ok)
	}
	if _, ok := r.Get(b.NodeID); ok {
		t.Errorf("a refused node is listed")
	}
	if _, nk := srv.Users(); !slices.ContainsFunc(nk, func(u bus.NKeyUser) bool { return u.PublicKey == a.PublicKey && u.Permissions != nil }) {
		t.Errorf("the joined node's key is not admitted, confined: %v", nk)
	}

	// Expired: refused, and an expired code's user is gone.
	clock.Add(2 * time.Minute)
	resp := redeem(t, srv, otherCode, joinRequest(t, c, c, otherCode, ""))
	if resp.Error == nil || resp.Error.Type != protocol.ErrConflict || !strings.Contains(resp.Error.Message, "expired") {
		t.Errorf("expired code: %+v", resp)
	}
	r.expireInvite(secretKey(otherCode.Secret)) // what its timer does at the expiry
	if users, _ := srv.Users(); slices.ContainsFunc(users, func(u bus.User) bool { return u.Name == otherCode.User }) {
		t.Errorf("an expired code's one-time user is still admitted")
	}
}

// TestJoinCodeOnce: two gateways serving the same pairing subject and two
// nodes redeeming one code at the same time: exactly one node joins, and
// both gateways agree.
func TestJoinCodeOnce(t *testing.T) {
	t.Parallel()
	srv := bustest.StartServer(t)
	urls := func(o *Options) { o.JoinURLs = func() []string { return []string{srv.ClientURL()} } }
	r1 := startRegistry(t, srv, urls)
	r2 := startRegistry(t, srv, urls)
	for round := range 5 {
		inv, err := r1.Invite(t.Context(), "", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		code := decodeCode(t, inv.Code)
		ids := []bus.Identity{newIdentity(t), newIdentity(t)}
		resps := make([]protocol.NodePairResponse, len(ids))
		var wg sync.WaitGroup
		for i, id := range ids {
			wg.Go(func() { resps[i] = redeem(t, srv, code, joinRequest(t, id, id, code, "racer")) })
		}
		wg.Wait()
		won := -1
		for i, resp := range resps {
			if resp.Status == protocol.NodePairingPaired {
				if won >= 0 {
					t.Fatalf("round %d: both nodes joined with one code: %+v", round, resps)
				}
				won = i
			}
		}
		if won < 0 {
			t.Fatalf("round %d: no node joined: %+v", round, resps)
		}
		for _, r := range []*Registry{r1, r2} {
			checkFor(t, 10*time.Second, func() error {
				if n, _ := r.Get(ids[won].NodeID); n.Pairing != protocol.NodePairingPaired {
					return fmt.Errorf("the winner is %q", n.Pairing)
				}
				if n, ok := r.Get(ids[1-won].NodeID); ok {
					return fmt.Errorf("the loser is listed: %+v", n)
				}
				return nil
			})
		}
	}
}

// TestInviteTTLAndRefusal: a code's lifetime is the default when none is
// asked, clamped to [MinInviteTTL, MaxInviteTTL]; without join URLs no
// code is issued.
func TestInviteTTLAndRefusal(t *testing.T) {
	t.Parallel()
	srv := bustest.StartServer(t)
	clock := &testClock{t: time.Now()}
	r := startRegistry(t, srv, func(o *Options) {
		o.JoinURLs = func() []string { return []string{srv.ClientURL()} }
		o.Now = clock.Now
	})
	for _, tc := range []struct{ ask, want time.Duration }{
		{0, DefaultInviteTTL},
		{time.Millisecond, MinInviteTTL},
		{time.Hour, time.Hour},
		{48 * time.Hour, MaxInviteTTL},
	} {
		inv, err := r.Invite(t.Context(), "", tc.ask)
		if err != nil || inv.ExpiresAtMs != clock.Now().Add(tc.want).UnixMilli() {
			t.Errorf("Invite(ttl %v): expires in %v (%v), want %v", tc.ask, time.UnixMilli(inv.ExpiresAtMs).Sub(clock.Now()), err, tc.want)
		}
		if code := decodeCode(t, inv.Code); code.User != "" {
			t.Errorf("a server without authentication got a one-time user %q", code.User)
		}
	}
	none := startRegistry(t, srv, nil)
	if _, err := none.Invite(t.Context(), "x", 0); protocol.AsError(err) == nil || protocol.AsError(err).Type != protocol.ErrConflict {
		t.Errorf("Invite without join URLs: %v, want a conflict", err)
	}
}

// TestSetServerReplay: a registry given a new embedded server (one
// started again in the same process) admits there what it admits: the
// keys of paired nodes (joined by code or approved with a known key) and
// the one-time users of open join codes; not a rejected node's key, not
// an expired code's user. Later decisions reach the new server.
func TestSetServerReplay(t *testing.T) {
	t.Parallel()
	srv1 := bustest.StartServer(t, bustest.WithUsers(gatewayUser))
	clock := &testClock{t: time.Now()}
	r := startRegistry(t, srv1, func(o *Options) {
		o.Server = srv1
		o.JoinURLs = func() []string { return []string{srv1.ClientURL()} }
		o.Now = clock.Now
	})
	expired, err := r.Invite(t.Context(), "", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Minute)
	open, err := r.Invite(t.Context(), "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	joined := newIdentity(t)
	if _, err := r.Admit(t.Context(), joined.PublicKey, "joined"); err != nil {
		t.Fatal(err)
	}
	approved := newTestNode(t, srv1, "approved")
	rejected := newTestNode(t, srv1, "rejected")
	for _, n := range []*testNode{approved, rejected} {
		n.startBeating()
		waitLive(t, r, n.id.NodeID, true, 10*time.Second)
	}
	if _, err := r.Decide(t.Context(), "approved", protocol.NodePairingPaired); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Decide(t.Context(), "rejected", protocol.NodePairingRejected); err != nil {
		t.Fatal(err)
	}

	srv2 := bustest.StartServer(t, bustest.WithUsers(gatewayUser))
	r.SetServer(srv2)
	if r.Server() != srv2 {
		t.Fatal("Server() is not the new server")
	}
	users, nk := srv2.Users()
	hasUser := func(name string) bool {
		return slices.ContainsFunc(users, func(u bus.User) bool { return u.Name == name })
	}
	hasKey := func(pub string) bool {
		return slices.ContainsFunc(nk, func(u bus.NKeyUser) bool { return u.PublicKey == pub })
	}
	if !hasUser(decodeCode(t, open.Code).User) || hasUser(decodeCode(t, expired.Code).User) {
		t.Errorf("one-time users on the new server: %v (open %s, expired %s)", users, decodeCode(t, open.Code).User, decodeCode(t, expired.Code).User)
	}
	if !hasKey(joined.PublicKey) || !hasKey(approved.id.PublicKey) || hasKey(rejected.id.PublicKey) {
		t.Errorf("node keys on the new server: %v", nk)
	}
	// Later decisions are kept on the new server.
	if _, err := r.Decide(t.Context(), "approved", protocol.NodePairingRejected); err != nil {
		t.Fatal(err)
	}
	if _, nk := srv2.Users(); slices.ContainsFunc(nk, func(u bus.NKeyUser) bool { return u.PublicKey == approved.id.PublicKey }) {
		t.Errorf("a node rejected after SetServer keeps its key on the new server")
	}
}

// TestJoinWhileAnotherGatewayIsNotReady: every gateway answers a join
// request and the first answer counts, so a gateway that cannot read the
// join codes yet (its JetStream is not reachable) must not answer that
// the code is unknown before the one that can answers.
func TestJoinWhileAnotherGatewayIsNotReady(t *testing.T) {
	t.Parallel()
	srv := bustest.StartServer(t)
	r1 := startRegistry(t, srv, func(o *Options) { o.JoinURLs = func() []string { return []string{srv.ClientURL()} } })
	nc := bustest.Connect(t, srv, bus.ClientConfig{Name: "gateway-2"})
	// A JetStream API nobody serves: its buckets never open.
	js, err := jetstream.NewWithAPIPrefix(nc, "$NOJS.API")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := Start(Options{Conn: nc, JS: js, PresenceTTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r2.Close(ctx)
	})
	inv, err := r1.Invite(t.Context(), "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	code := decodeCode(t, inv.Code)
	id := newIdentity(t)
	if resp := redeem(t, srv, code, joinRequest(t, id, id, code, "")); resp.Status != protocol.NodePairingPaired {
		t.Fatalf("join: %+v", resp)
	}
}
