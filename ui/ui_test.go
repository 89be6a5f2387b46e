package ui

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
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
		{"/ui/xterm/xterm.js", "javascript", "Terminal"},
		{"/ui/xterm/addon-fit.js", "javascript", "FitAddon"},
		{"/ui/xterm/addon-canvas.js", "javascript", "CanvasAddon"},
		{"/ui/xterm/xterm.css", "text/css", ".xterm"},
		{"/ui/xterm/LICENSE", "text/plain", "MIT"},
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
	for _, p := range []string{"/ui/nope.js", "/uix", "/", "/ui/assets/app.js", "/ui/../ui.go", "/ui/xterm/SHA256SUMS", "/ui/xterm/xterm.js.map", "/ui/xterm/", "/ui/xterm"} {
		if rec := get(t, h, http.MethodGet, p); rec.Code != http.StatusNotFound && rec.Code != http.StatusMovedPermanently {
			t.Errorf("GET %s: %d, want 404", p, rec.Code)
		}
	}
	if rec := get(t, h, http.MethodPost, "/ui/"); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /ui/: %d", rec.Code)
	}
}

// TestPageHasNoRemoteOrInlineCode checks what the CSP also enforces: the
// page, xterm.js included, loads nothing from elsewhere and has no inline
// script or handler, no HTML sink and no eval.
func TestPageHasNoRemoteOrInlineCode(t *testing.T) {
	t.Parallel()
	var names []string
	if err := fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			names = append(names, p)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
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

// TestVendoredXterm holds the embedded xterm.js files to
// assets/xterm/SHA256SUMS, which scripts/vendor-xterm.sh writes from the
// pinned, integrity-checked npm releases: the files are the releases'
// own, unedited, and every one is listed.
func TestVendoredXterm(t *testing.T) {
	t.Parallel()
	f, err := os.Open("assets/xterm/SHA256SUMS")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("SHA256SUMS line %q", sc.Text())
		}
		want[name] = sum
	}
	embedded, err := fs.ReadDir(assets, "assets/xterm")
	if err != nil {
		t.Fatal(err)
	}
	if len(embedded) != len(want) {
		t.Errorf("%d files embedded under assets/xterm, %d in SHA256SUMS", len(embedded), len(want))
	}
	for _, e := range embedded {
		b, err := fs.ReadFile(assets, "assets/xterm/"+e.Name())
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); got != want[e.Name()] {
			t.Errorf("assets/xterm/%s: sha256 %s, SHA256SUMS says %q (run scripts/vendor-xterm.sh)", e.Name(), got, want[e.Name()])
		}
	}
	for _, name := range []string{"xterm.js", "xterm.css", "addon-fit.js", "addon-canvas.js", "LICENSE"} {
		if _, ok := want[name]; !ok {
			t.Errorf("%s is not vendored", name)
		}
	}
}
