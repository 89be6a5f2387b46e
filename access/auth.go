// Package access decides who may call the gateway's HTTP API: the
// browser defences that keep web pages out (CheckBrowser), the two roles
// a bearer token gives (the agent's tool token, the operator's token),
// the limits on failed authentications, and the operator token the
// gateway keeps in its state dir when none is configured.
package access

import (
	"crypto/subtle"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// Role is what a request's credential allows (DESIGN.md §3.4).
type Role int

const (
	// RoleAgent may call tools and read events, sessions and the node
	// registry: the tool token, or no token on a token-less gateway.
	RoleAgent Role = iota + 1
	// RoleOperator may also decide approvals, pair nodes, edit node
	// approvals files and change configuration: the operator token.
	RoleOperator
)

// Failed authentications within FailureWindow: FailureLimit from one
// address, or GlobalFailureLimit from all addresses together, and
// authentication is refused (429) until the window moves on (DESIGN.md
// §7).
const (
	FailureLimit       = 10
	GlobalFailureLimit = 100
	FailureWindow      = 60 * time.Second
)

// Guard checks the bearer tokens of requests against the tokens in force
// and keeps the failure limits. Its methods are safe for concurrent use.
type Guard struct {
	tokens  func() (tool, operator string)
	limiter *limiter
}

// NewGuard returns a Guard; tokens returns the tool token ("" for none)
// and the operator token in force, on every check (a reload may change
// them).
func NewGuard(tokens func() (tool, operator string)) *Guard {
	return &Guard{tokens: tokens, limiter: newLimiter()}
}

// Authenticate returns the caller's role when it is at least need;
// otherwise the refusal (401, 403 or 429), with the headers it needs set
// on w (Retry-After, WWW-Authenticate). A request that presents a token
// must present a valid one, whatever it asks for; a request without one
// has the agent's authority only on a gateway without a tool token. Wrong
// tokens count against the failure limits, and while a limit is reached
// no token is even compared.
func (g *Guard) Authenticate(w http.ResponseWriter, r *http.Request, need Role) (Role, *protocol.Error) {
	header := r.Header.Get("Authorization")
	toolToken, operatorToken := g.tokens()
	if header == "" && toolToken == "" && need == RoleAgent {
		return RoleAgent, nil
	}
	addr := clientAddr(r)
	if wait, blocked := g.limiter.blocked(addr); blocked {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(max(wait, time.Second).Seconds()))))
		return 0, protocol.Errorf(protocol.ErrRateLimited, "too many failed authentications; retry later")
	}
	var got Role
	switch {
	case header == "":
		if toolToken == "" {
			got = RoleAgent
		}
	case TokenMatches(header, operatorToken):
		got = RoleOperator
	case toolToken != "" && TokenMatches(header, toolToken):
		got = RoleAgent
	}
	switch {
	case got == 0:
		if header != "" {
			g.limiter.fail(addr)
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="execmesh"`)
		return 0, protocol.Errorf(protocol.ErrUnauthorized, "unauthorized: missing or invalid bearer token")
	case got < need:
		return got, protocol.Errorf(protocol.ErrForbidden,
			"forbidden: %s %s is an operator action and needs the operator token (Authorization: Bearer <operator token>: gateway.auth.operatorToken, or when that is unset the file operator.token in the gateway's state dir); the tool token only calls tools",
			r.Method, r.URL.Path)
	}
	return got, nil
}

// ToolCallOK reports whether a NATS tool call's Authorization header
// passes: any header on a gateway without a tool token, else the tool or
// the operator token.
func (g *Guard) ToolCallOK(header string) bool {
	token, operatorToken := g.tokens()
	return token == "" || TokenMatches(header, token) || TokenMatches(header, operatorToken)
}

// limiter counts failed authentications per client address and over all
// addresses, and refuses authentication while either count is at its
// limit within the window: FailureLimit per address, or
// GlobalFailureLimit together (a guesser that rotates source addresses,
// 127.0.0.0/8 on loopback, meets the second).
type limiter struct {
	mu       sync.Mutex
	failures map[string][]time.Time // per address, oldest first
	all      []time.Time            // every address, oldest first
	now      func() time.Time
}

func newLimiter() *limiter {
	return &limiter{failures: map[string][]time.Time{}, now: time.Now}
}

// blocked reports whether addr may not authenticate now, and for how long.
func (l *limiter) blocked(addr string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = l.pruneLocked(l.all)
	if n := len(l.all); n >= GlobalFailureLimit {
		return l.all[n-GlobalFailureLimit].Add(FailureWindow).Sub(l.now()), true
	}
	recent := l.addrLocked(addr)
	if n := len(recent); n >= FailureLimit {
		return recent[n-FailureLimit].Add(FailureWindow).Sub(l.now()), true
	}
	return 0, false
}

func (l *limiter) fail(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.failures[addr] = append(l.addrLocked(addr), now)
	l.all = append(l.pruneLocked(l.all), now)
	// Memory stays bounded: failures are only recorded while the global
	// count is below its limit, so at most that many addresses have any
	// within the window; older ones are dropped here.
	if len(l.failures) > GlobalFailureLimit {
		for k := range l.failures {
			l.addrLocked(k)
		}
	}
}

// addrLocked returns addr's failures within the window, forgetting addr
// when there are none. l.mu must be held.
func (l *limiter) addrLocked(addr string) []time.Time {
	ts := l.pruneLocked(l.failures[addr])
	if len(ts) == 0 {
		delete(l.failures, addr)
		return nil
	}
	l.failures[addr] = ts
	return ts
}

// pruneLocked drops the failures older than the window. l.mu must be held.
func (l *limiter) pruneLocked(ts []time.Time) []time.Time {
	cutoff := l.now().Add(-FailureWindow)
	i := 0
	for i < len(ts) && ts[i].Before(cutoff) {
		i++
	}
	return ts[i:]
}

// TokenMatches compares the bearer token of an Authorization header with
// token in constant time. An empty token matches nothing.
func TokenMatches(header, token string) bool {
	const prefix = "Bearer "
	if token == "" || len(header) < len(prefix) || !strings.EqualFold(header[:len(prefix)], prefix) {
		return false
	}
	got := strings.TrimSpace(header[len(prefix):])
	return subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

// clientAddr is the address a request came from (the failure limits
// count per address).
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// IsLoopbackListen reports whether a listen address only accepts loopback
// connections.
func IsLoopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
