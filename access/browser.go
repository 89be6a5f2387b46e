package access

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/execmesh/execmesh/protocol"
)

// The browser defences keep web pages out of the HTTP API (DESIGN.md §3.4): a page in
// the user's browser can send requests to a loopback gateway — "simple"
// cross-origin POSTs need no CORS preflight, and a name the page's author
// controls can be rebound to 127.0.0.1 — so the API refuses what only a
// browser sends for another site. The CLI, curl and MCP clients send no
// Origin and name the gateway in Host, and are not affected.

// CheckBrowser returns the refusal of a request the browser defences
// turn away, or nil. allowedHosts is gateway.allowedHosts (normalised by
// NormalizeAllowedHost), listen the gateway's listen address. The checks,
// applied to every request before anything else:
//
//   - The Host header must name this gateway (421 misdirected_request):
//     a loopback name (localhost, 127.0.0.1, [::1], any 127.x address) or
//     the address the request arrived at, with the port it arrived on, or
//     an entry of gateway.allowedHosts. A DNS-rebinding page sends its own
//     name.
//   - A request from another origin is refused (403 forbidden): a
//     Sec-Fetch-Site other than same-origin or none, or an Origin that is
//     not the gateway's own (its scheme://Host, or an allowed host), "null"
//     included. Only following a link to the control page (a navigation
//     to GET /ui) is let through from other sites.
//   - A POST, PUT or PATCH body must be JSON (415 unsupported_media_type):
//     Content-Type application/json; a request without Content-Type must
//     have an empty body. A browser cannot send that content type to
//     another origin without a CORS preflight, which the gateway never
//     answers.
func CheckBrowser(r *http.Request, allowedHosts []string, listen string) error {
	if err := checkHost(r, allowedHosts, listen); err != nil {
		return err
	}
	if err := checkOrigin(r, allowedHosts); err != nil {
		return err
	}
	return checkContentType(r)
}

// checkHost accepts a Host header that names the gateway: a loopback name
// or the local address of the connection, on the local port, or an entry
// of allowed ("host" for any port, "host:port" for that port).
func checkHost(r *http.Request, allowed []string, listen string) error {
	host, port := splitHostPort(r.Host)
	if host == "" {
		return misdirected(r, "the request names no Host")
	}
	for _, a := range allowed {
		ah, ap := splitHostPort(a)
		if ah == host && (ap == "" || ap == port) {
			return nil
		}
	}
	localIP, localPort := localAddr(r, listen)
	if port == "" {
		port = "80"
		if r.TLS != nil {
			port = "443"
		}
	}
	if port != localPort {
		return misdirected(r, "port "+port+" is not the port this gateway serves")
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && (ip.IsLoopback() || (localIP != nil && ip.Equal(localIP))) {
		return nil
	}
	if lh, _, err := net.SplitHostPort(listen); err == nil && lh != "" && strings.EqualFold(strings.TrimSuffix(lh, "."), host) {
		return nil
	}
	return misdirected(r, "it is not one of this gateway's names")
}

func misdirected(r *http.Request, why string) error {
	return protocol.Errorf(protocol.ErrMisdirected,
		"misdirected request: Host %q does not name this gateway (%s); it answers to its listen address, localhost, 127.0.0.1 and [::1] on the port it serves, and to the names in gateway.allowedHosts. A web page that reaches the gateway through a name of its own (DNS rebinding) is refused this way",
		r.Host, why)
}

// localAddr is the address the request arrived at; without one (a
// handler called directly) the configured listen port.
func localAddr(r *http.Request, listen string) (net.IP, string) {
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok && a != nil {
		return a.IP, strconv.Itoa(a.Port)
	}
	_, port, _ := net.SplitHostPort(listen)
	return nil, port
}

// splitHostPort splits a Host value ("name", "name:port", "[::1]:port",
// "::1") into a lower-case host without a trailing dot and brackets, and
// its port ("" when none).
func splitHostPort(hp string) (host, port string) {
	hp = strings.TrimSpace(hp)
	if h, p, err := net.SplitHostPort(hp); err == nil {
		host, port = h, p
	} else {
		host = strings.TrimSuffix(strings.TrimPrefix(hp, "["), "]")
	}
	return strings.TrimSuffix(strings.ToLower(host), "."), port
}

// NormalizeAllowedHost checks a gateway.allowedHosts entry: a host name or
// IP address, with an optional port, nothing else.
func NormalizeAllowedHost(entry string) (string, error) {
	e := strings.TrimSpace(entry)
	if e == "" || strings.ContainsAny(e, "/?#@* \t") {
		return "", fmt.Errorf("invalid entry %q: want a host name or address, with an optional :port (no scheme, path or wildcard)", entry)
	}
	host, port := splitHostPort(e)
	if host == "" {
		return "", fmt.Errorf("invalid entry %q: no host", entry)
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("invalid entry %q: bad port %q", entry, port)
		}
		return net.JoinHostPort(host, port), nil
	}
	if strings.Contains(host, ":") && net.ParseIP(host) == nil {
		return "", fmt.Errorf("invalid entry %q: want host or host:port", entry)
	}
	return host, nil
}

// checkOrigin refuses requests a browser sends on behalf of another site.
func checkOrigin(r *http.Request, allowed []string) error {
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "", "same-origin", "none":
	default:
		// Following a link to the control page is fine: its files hold
		// no data, and what the page then calls is same-origin.
		if (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.Header.Get("Sec-Fetch-Mode") == "navigate" && isUIPath(r.URL.Path) {
			return nil
		}
		return crossOrigin(r, "Sec-Fetch-Site: "+site)
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return crossOrigin(r, "Origin: "+origin)
	}
	oh, op := splitHostPort(u.Host)
	rh, rp := splitHostPort(r.Host)
	if oh == rh && op == rp {
		return nil
	}
	for _, a := range allowed {
		ah, ap := splitHostPort(a)
		if ah == oh && (ap == "" || ap == op) {
			return nil
		}
	}
	return crossOrigin(r, "Origin: "+origin)
}

func crossOrigin(r *http.Request, what string) error {
	return protocol.Errorf(protocol.ErrForbidden,
		"forbidden: cross-origin request refused (%s): a web page may not call the gateway; only its own control page (%s/ui/) may, from a browser. To serve the page under another name, add the name to gateway.allowedHosts",
		what, "http://"+r.Host)
}

func isUIPath(p string) bool { return p == "/ui" || strings.HasPrefix(p, "/ui/") }

// checkContentType requires a JSON body on POST, PUT and PATCH.
func checkContentType(r *http.Request) error {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
	default:
		return nil
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		if r.ContentLength == 0 {
			return nil // nothing to read
		}
		return unsupportedMedia(r, "no Content-Type")
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return unsupportedMedia(r, "Content-Type "+strconv.Quote(ct))
	}
	return nil
}

func unsupportedMedia(r *http.Request, got string) error {
	return protocol.Errorf(protocol.ErrUnsupportedMedia,
		"unsupported media type: a %s body must be JSON with Content-Type: application/json (got %s; with curl add -H 'Content-Type: application/json')",
		r.Method, got)
}
