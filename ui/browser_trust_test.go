package ui

import (
	"context"
	"encoding/json"
	"html"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"

	"github.com/chromedp/chromedp"

	"github.com/execmesh/execmesh/gateway"
)

// attackPage is a web page of another site that tries to drive the gateway
// at base ("" for its own origin, as after a DNS rebinding): a "simple"
// no-cors POST with Content-Type text/plain (no CORS preflight), a JSON
// POST (preflighted), a form POST of JSON-looking text into an iframe, and
// reads of the API. Each try touches its own marker file; what the page
// got back is left in window.results, window.done is set at the end.
func attackPage(base, dir string) string {
	touch := func(name string) string {
		b, _ := json.Marshal(map[string]any{"tool": "exec", "args": map[string]any{"command": "touch " + filepath.Join(dir, name)}})
		return string(b)
	}
	// The form's text/plain body is name=value: name ends inside a JSON
	// string that value closes, so the body is the JSON of a tool call
	// (with sessionKey "agent:main:=x").
	formName := strings.TrimSuffix(touch("form"), "}") + `,"sessionKey":"agent:main:`
	return `<!doctype html><html><head><meta charset="utf-8"><title>evil</title></head><body>
<form id="f" method="POST" enctype="text/plain" target="sink" action="` + html.EscapeString(base) + `/tools/invoke">
<input type="hidden" name="` + html.EscapeString(formName) + `" value="x&quot;}"></form>
<iframe name="sink" id="sink"></iframe>
<script>
const base = ` + strconv.Quote(base) + `;
window.results = {};
async function attempt(name, url, init) {
  try {
    const r = await fetch(url, init);
    let text = '';
    try { text = await r.text(); } catch (e) { text = 'unreadable: ' + e; }
    window.results[name] = { type: r.type, status: r.status, text: text };
  } catch (e) {
    window.results[name] = { error: String(e) };
  }
}
(async () => {
  await attempt('simple', base + '/tools/invoke', { method: 'POST', mode: 'no-cors', headers: { 'Content-Type': 'text/plain' }, body: ` + strconv.Quote(touch("simple")) + ` });
  await attempt('json', base + '/tools/invoke', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: ` + strconv.Quote(touch("json")) + ` });
  await attempt('nodes', base + '/v1/nodes', {});
  await attempt('approvals', base + '/v1/approvals', {});
  await attempt('events', base + '/v1/events?sessionKey=agent:main:main', {});
  const sink = document.getElementById('sink');
  const loaded = new Promise((resolve) => sink.addEventListener('load', resolve, { once: true }));
  document.getElementById('f').submit();
  await Promise.race([loaded, new Promise((resolve) => setTimeout(resolve, 5000))]);
  window.done = true;
})();
</script></body></html>`
}

// TestBrowserCrossOriginRefused (class A, in a real browser):
// pages of other sites in headless Chromium try to run commands on a
// loopback gateway without a token and with security full — from another
// origin (http://evil.example:<port>, resolved to 127.0.0.1) and through a
// rebound name (http://rebind.evil.example:<gateway's port>, the page's
// own origin). Nothing runs, and the pages read no answer: cross-origin
// reads fail in the browser, and the rebound name only gets the 421 that
// refuses it. The gateway's own control page still works (see
// TestBrowserControlPage).
func TestBrowserCrossOriginRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	chrome := findChromium(t)
	dir := t.TempDir()
	cfg := config.Default()
	cfg.StateDir = dir
	cfg.Tools.Exec.Security = "full"
	cfg.Tools.Exec.Ask = "off"
	ns := bustest.StartServer(t)
	g, err := gateway.New(t.Context(), cfg, gateway.Options{
		Conn:           bustest.Connect(t, ns, bus.ClientConfig{Name: "gateway"}),
		Server:         ns,
		Cwd:            dir,
		Environ:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir, "SHELL=/bin/sh", "LANG=C"},
		Getenv:         testGatewayEnv,
		LoginShellPath: func() string { return "" },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = g.Close(ctx)
	})
	gwSrv := httptest.NewServer(g.Handler())
	t.Cleanup(gwSrv.Close)

	markers := t.TempDir()
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(attackPage(gwSrv.URL, filepath.Join(markers, "cross"))))
	}))
	t.Cleanup(evil.Close)
	// The rebinding site: its page, and (once the name points at the
	// gateway's address) the gateway itself, on one origin.
	rebound := http.NewServeMux()
	rebound.HandleFunc("GET /evil.html", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(attackPage("", filepath.Join(markers, "rebind"))))
	})
	rebound.Handle("/", g.Handler())
	rebindSrv := httptest.NewServer(rebound)
	t.Cleanup(rebindSrv.Close)
	for _, d := range []string{"cross", "rebind"} {
		if err := os.MkdirAll(filepath.Join(markers, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}

	ctx := browser(t, chrome, chromedp.Flag("host-resolver-rules", "MAP evil.example 127.0.0.1, MAP rebind.evil.example 127.0.0.1"))
	port := func(u string) string { _, p, _ := net.SplitHostPort(strings.TrimPrefix(u, "http://")); return p }
	for _, site := range []struct{ name, url string }{
		{"cross", "http://evil.example:" + port(evil.URL) + "/evil.html"},
		{"rebind", "http://rebind.evil.example:" + port(rebindSrv.URL) + "/evil.html"},
	} {
		do(t, ctx, "open "+site.url, chromedp.Navigate(site.url))
		waitJS(t, ctx, site.name+" attacks done", `window.done === true`)
		raw := eval[string](t, ctx, `JSON.stringify(window.results)`)
		var results map[string]struct {
			Type   string `json:"type"`
			Status int    `json:"status"`
			Text   string `json:"text"`
			Error  string `json:"error"`
		}
		if err := json.Unmarshal([]byte(raw), &results); err != nil {
			t.Fatalf("%s: results %s: %v", site.name, raw, err)
		}
		t.Logf("%s: %s", site.name, raw)
		for name, r := range results {
			// What a page may see: a network error, an opaque answer
			// (no status, no body), or the gateway's refusal.
			switch {
			case r.Error != "", r.Type == "opaque" && r.Status == 0 && r.Text == "":
			case r.Status == http.StatusMisdirectedRequest && strings.Contains(r.Text, "misdirected_request"):
			default:
				t.Errorf("%s page, %s: the page read an answer: %+v", site.name, name, r)
			}
		}
		if len(results) != 5 {
			t.Errorf("%s: %d results, want 5: %s", site.name, len(results), raw)
		}
		// The form posts into an iframe; its answer is not for the page.
		time.Sleep(200 * time.Millisecond)
		ents, _ := os.ReadDir(filepath.Join(markers, site.name))
		for _, e := range ents {
			t.Errorf("%s page: a command ran: %s was created", site.name, e.Name())
		}
	}
	// The browser reached the gateway (the refusals came from it): the
	// API still answers its own origin.
	res, err := http.Get(gwSrv.URL + "/v1/whoami")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("whoami from the gateway's own origin: %d", res.StatusCode)
	}
}
