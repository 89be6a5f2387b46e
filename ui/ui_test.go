package ui

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, method, path string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec
}

func TestHandlerFiles(t *testing.T) {
	t.Parallel()
	h := Handler()
	for _, tc := range []struct {
		path, ctype, contains string
	}{
		{"/ui/", "text/html", `id="token-input"`},
		{"/ui/index.html", "text/html", `<script src="app.js" defer></script>`},
		{"/ui/app.js", "javascript", "sessionStorage"},
		{"/ui/style.css", "text/css", ":root"},
	} {
		rec := get(t, h, http.MethodGet, tc.path)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Header().Get("Content-Type"), tc.ctype) || !strings.Contains(rec.Body.String(), tc.contains) {
			t.Errorf("GET %s: %d %q, body has %q: %v", tc.path, rec.Code, rec.Header().Get("Content-Type"), tc.contains, strings.Contains(rec.Body.String(), tc.contains))
		}
		csp := rec.Header().Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") {
			t.Errorf("GET %s: CSP %q", tc.path, csp)
		}
		if rec.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: no nosniff", tc.path)
		}
	}
	if rec := get(t, h, http.MethodGet, "/ui"); rec.Code != http.StatusMovedPermanently || rec.Header().Get("Location") != "/ui/" {
		t.Errorf("GET /ui: %d %q", rec.Code, rec.Header().Get("Location"))
	}
	for _, p := range []string{"/ui/nope.js", "/uix", "/", "/ui/assets/app.js", "/ui/../ui.go"} {
		if rec := get(t, h, http.MethodGet, p); rec.Code != http.StatusNotFound && rec.Code != http.StatusMovedPermanently {
			t.Errorf("GET %s: %d, want 404", p, rec.Code)
		}
	}
	if rec := get(t, h, http.MethodPost, "/ui/"); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /ui/: %d", rec.Code)
	}
}

// TestPageHasNoRemoteOrInlineCode checks what the CSP also enforces: the
// page loads nothing from elsewhere and has no inline script or handler.
func TestPageHasNoRemoteOrInlineCode(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"assets/index.html", "assets/app.js", "assets/visible.js", "assets/style.css"} {
		f, err := assets.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(f)
		f.Close()
		s := string(b)
		if regexp.MustCompile(`(?i)(src|href)\s*=\s*"(https?:)?//`).MatchString(s) || strings.Contains(s, "@import") {
			t.Errorf("%s loads something from elsewhere", name)
		}
		if strings.HasSuffix(name, ".html") && (regexp.MustCompile(`<script>|<script [^>]*>[^<]`).MatchString(s) || regexp.MustCompile(`\son[a-z]+=`).MatchString(s)) {
			t.Errorf("%s has inline script", name)
		}
		if strings.HasSuffix(name, ".js") && regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function`).MatchString(s) {
			t.Errorf("%s uses an HTML sink or eval", name)
		}
	}
}
