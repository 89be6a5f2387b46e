package gateway

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

// role is what a request's credential allows (DESIGN.md §3.4).
type role int

const (
	// roleAgent may call tools and read events, sessions and the node
	// registry: the tool token, or no token on a token-less gateway.
	roleAgent role = iota + 1
	// roleOperator may also decide approvals, pair nodes, edit node
	// approvals files and change configuration: the operator token.
	roleOperator
)

// authed serves h to callers with the agent's authority or more.
func (g *Gateway) authed(h http.HandlerFunc) http.HandlerFunc { return g.require(roleAgent, h) }

// operator serves h to callers with the operator token only.
func (g *Gateway) operator(h http.HandlerFunc) http.HandlerFunc { return g.require(roleOperator, h) }

// require checks the request's bearer token against need and the failure
// limits, and answers 401, 403 or 429 itself when the check fails.
func (g *Gateway) require(need role, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, ok := g.authenticate(w, r, need); ok {
			h(w, r)
		}
	}
}

// authenticate returns the caller's role when it is at least need;
// otherwise it writes the refusal and returns false. A request that
// presents a token must present a valid one, whatever it asks for; a
// request without one has the agent's authority only on a gateway without
// a tool token. Wrong tokens count against the failure limits, and while
// a limit is reached no token is even compared.
func (g *Gateway) authenticate(w http.ResponseWriter, r *http.Request, need role) (role, bool) {
	header := r.Header.Get("Authorization")
	toolToken, operatorToken := g.tokens()
	if header == "" && toolToken == "" && need == roleAgent {
		return roleAgent, true
	}
	addr := clientAddr(r)
	if wait, blocked := g.limiter.blocked(addr); blocked {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(max(wait, time.Second).Seconds()))))
		writeError(w, protocol.Errorf(protocol.ErrRateLimited, "too many failed authentications; retry later"))
		return 0, false
	}
	var got role
	switch {
	case header == "":
		if toolToken == "" {
			got = roleAgent
		}
	case tokenMatches(header, operatorToken):
		got = roleOperator
	case toolToken != "" && tokenMatches(header, toolToken):
		got = roleAgent
	}
	switch {
	case got == 0:
		if header != "" {
			g.limiter.fail(addr)
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="execmesh"`)
		writeError(w, protocol.Errorf(protocol.ErrUnauthorized, "unauthorized: missing or invalid bearer token"))
		return 0, false
	case got < need:
		writeError(w, protocol.Errorf(protocol.ErrForbidden,
			"forbidden: %s %s is an operator action and needs the operator token (Authorization: Bearer <operator token>: gateway.auth.operatorToken, or when that is unset the file operator.token in the gateway's state dir); the tool token only calls tools",
			r.Method, r.URL.Path))
		return got, false
	}
	return got, true
}

// toolTokenOK reports whether a NATS tool call's Authorization header
// passes: any header on a gateway without a tool token, else the tool
// or the operator token.
func (g *Gateway) toolTokenOK(header string) bool {
	token, operatorToken := g.tokens()
	return token == "" || tokenMatches(header, token) || tokenMatches(header, operatorToken)
}

// authLimiter counts failed authentications per client address and over
// all addresses, and refuses authentication while either count is at its
// limit within the window: authFailureLimit per address, or
// authFailureGlobalLimit together (a guesser that rotates source
// addresses, 127.0.0.0/8 on loopback, meets the second).
type authLimiter struct {
	mu       sync.Mutex
	failures map[string][]time.Time // per address, oldest first
	all      []time.Time            // every address, oldest first
	now      func() time.Time
}

func newAuthLimiter() *authLimiter {
	return &authLimiter{failures: map[string][]time.Time{}, now: time.Now}
}

// blocked reports whether addr may not authenticate now, and for how long.
func (l *authLimiter) blocked(addr string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = l.pruneLocked(l.all)
	if n := len(l.all); n >= authFailureGlobalLimit {
		return l.all[n-authFailureGlobalLimit].Add(authFailureWindowSec * time.Second).Sub(l.now()), true
	}
	recent := l.addrLocked(addr)
	if n := len(recent); n >= authFailureLimit {
		return recent[n-authFailureLimit].Add(authFailureWindowSec * time.Second).Sub(l.now()), true
	}
	return 0, false
}

func (l *authLimiter) fail(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.failures[addr] = append(l.addrLocked(addr), now)
	l.all = append(l.pruneLocked(l.all), now)
	// Memory stays bounded: failures are only recorded while the global
	// count is below its limit, so at most that many addresses have any
	// within the window; older ones are dropped here.
	if len(l.failures) > authFailureGlobalLimit {
		for k := range l.failures {
			l.addrLocked(k)
		}
	}
}

// addrLocked returns addr's failures within the window, forgetting addr
// when there are none. l.mu must be held.
func (l *authLimiter) addrLocked(addr string) []time.Time {
	ts := l.pruneLocked(l.failures[addr])
	if len(ts) == 0 {
		delete(l.failures, addr)
		return nil
	}
	l.failures[addr] = ts
	return ts
}

// pruneLocked drops the failures older than the window. l.mu must be held.
func (l *authLimiter) pruneLocked(ts []time.Time) []time.Time {
	cutoff := l.now().Add(-authFailureWindowSec * time.Second)
	i := 0
	for i < len(ts) && ts[i].Before(cutoff) {
		i++
	}
	return ts[i:]
}

// tokenMatches compares the bearer token in constant time. An empty token
// matches nothing.
func tokenMatches(header, token string) bool {
	const prefix = "Bearer "
	if token == "" || len(header) < len(prefix) || !strings.EqualFold(header[:len(prefix)], prefix) {
		return false
	}
	got := strings.TrimSpace(header[len(prefix):])
	return subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// isLoopbackListen reports whether a listen address only accepts loopback
// connections.
func isLoopbackListen(addr string) bool {
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
