package ui

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

// assets are the page's files: no build step, nothing loaded from
// elsewhere, so the page works offline. The one third-party code is
// xterm.js (assets/xterm: the releases' own minified files and their MIT
// licences, fetched and checked by scripts/vendor-xterm.sh, held to
// assets/xterm/SHA256SUMS by TestVendoredXterm).
//
//go:embed assets/index.html assets/app.js assets/visible.js assets/style.css
//go:embed assets/xterm/*.js assets/xterm/*.css assets/xterm/LICENSE*
var assets embed.FS

// Prefix is the path the page is served under.
const Prefix = "/ui"

// contentSecurityPolicy allows the page's own script and style only: no
// inline code, no other origin, no framing. With every server text set
// through textContent this is a second line of defence, not the first.
// connect-src 'self' covers the attach WebSocket too (ws: and wss: of the
// page's own host). xterm.js runs under it unchanged: the page renders
// with its canvas addon, so xterm writes no <style> element.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the control page at /ui/ (/ui redirects there): the page,
// its scripts and styles, and xterm.js under /ui/xterm/. It needs no credentials: the files hold no data,
// and the page asks for the gateway's token before calling the API. Mount
// it at "/ui/" and at "/ui" beside the gateway's API, which the page calls
// with absolute paths (/tools/invoke, /v1/...).
func Handler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		rest, ok := strings.CutPrefix(r.URL.Path, Prefix)
		switch {
		case !ok || (rest != "" && !strings.HasPrefix(rest, "/")):
			http.NotFound(w, r)
			return
		case rest == "":
			http.Redirect(w, r, Prefix+"/", http.StatusMovedPermanently)
			return
		case rest == "/index.html":
			// FileServer would redirect this to ./; serve "/" directly.
			rest = "/"
		case rest != "/" && strings.HasSuffix(rest, "/"):
			// No directory listings (/ui/xterm/).
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		// The files change with the binary; always revalidate.
		h.Set("Cache-Control", "no-cache")
		r2 := r.Clone(r.Context())
		r2.URL.Path = rest
		r2.URL.RawPath = ""
		files.ServeHTTP(w, r2)
	})
}
