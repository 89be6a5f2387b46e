package gateway

import (
	"crypto/subtle"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// authLimiter counts failed authentications per client address and refuses
// an address after authFailureLimit failures within the window.
type authLimiter struct {
	mu       sync.Mutex
	failures map[string][]time.Time
	now      func() time.Time
}

func newAuthLimiter() *authLimiter {
	return &authLimiter{failures: map[string][]time.Time{}, now: time.Now}
}

// blocked reports whether addr is over the limit, and for how long.
func (l *authLimiter) blocked(addr string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	recent := l.pruneLocked(addr)
	if len(recent) < authFailureLimit {
		return 0, false
	}
	return recent[0].Add(authFailureWindowSec * time.Second).Sub(l.now()), true
}

func (l *authLimiter) fail(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failures[addr] = append(l.pruneLocked(addr), l.now())
	if len(l.failures) > 10000 { // bound memory under a spray of addresses
		for k := range l.failures {
			if len(l.pruneLocked(k)) == 0 {
				delete(l.failures, k)
			}
		}
	}
}

// pruneLocked drops failures older than the window. l.mu must be held.
func (l *authLimiter) pruneLocked(addr string) []time.Time {
	cutoff := l.now().Add(-authFailureWindowSec * time.Second)
	ts := l.failures[addr]
	i := 0
	for i < len(ts) && ts[i].Before(cutoff) {
		i++
	}
	ts = ts[i:]
	if len(ts) == 0 {
		delete(l.failures, addr)
		return nil
	}
	l.failures[addr] = ts
	return ts
}

// tokenMatches compares the bearer token in constant time.
func tokenMatches(header, token string) bool {
	const prefix = "Bearer "
	if len(header) < len(prefix) || !strings.EqualFold(header[:len(prefix)], prefix) {
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
