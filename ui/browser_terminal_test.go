package ui

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/coder/websocket"

	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/protocol"
)

// termTextJS is the text of the page's terminal: every line of its
// buffer (scrollback included), as xterm.js holds it.
const termTextJS = `(() => { const t = document.getElementById('term-screen').terminal; if (!t) return ''; const b = t.buffer.active; const lines = []; for (let i = 0; i < b.length; i++) lines.push(b.getLine(i).translateToString(true)); return lines.join('\n'); })()`

// termCard is the terminal panel, whose data attributes say how the
// attachment stands (state, mode, size, exitCode, closeCode).
const termCard = `document.getElementById('term-card')`

// termHas is the expression "the terminal shows s".
func termHas(s string) string {
	return termTextJS + `.includes(` + strconv.Quote(s) + `)`
}

// cspWatch records the page's Content-Security-Policy violations in
// window.cspViolations, from before the page's first script.
const cspWatch = `window.cspViolations = []; document.addEventListener('securitypolicyviolation', (e) => window.cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));`

// sockets keeps the connections the server's WebSockets took over, so
// that a test can cut them as a network failure would.
type sockets struct {
	mu    sync.Mutex
	conns []net.Conn
}

// hijackRecorder hands a hijacked connection to sockets.
type hijackRecorder struct {
	http.ResponseWriter
	s *sockets
}

func (h hijackRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err == nil {
		h.s.mu.Lock()
		h.s.conns = append(h.s.conns, c)
		h.s.mu.Unlock()
	}
	return c, rw, err
}

func (h hijackRecorder) Unwrap() http.ResponseWriter { return h.ResponseWriter }

// Flush keeps the session stream (server-sent events) working through
// the wrapper.
func (h hijackRecorder) Flush() { _ = http.NewResponseController(h.ResponseWriter).Flush() }

// cut closes every WebSocket connection abruptly (no close frame).
func (s *sockets) cut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
	s.conns = nil
}

// termPage serves g's API and the control page, starts a browser that
// records CSP violations, and signs in with token. The sockets served are
// kept in the sockets returned.
func termPage(t *testing.T, g *gateway.Gateway, chrome, token string) (context.Context, *httptest.Server, *sockets) {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/", g.Handler())
	mux.Handle("/ui/", Handler())
	socks := &sockets{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(hijackRecorder{w, socks}, r)
	}))
	t.Cleanup(srv.Close)
	ctx := browser(t, chrome)
	if err := chromedp.Do(ctx, func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, tg, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: cspWatch})
		return chromedp.Void{}, err
	}); err != nil {
		t.Fatalf("add the CSP watch: %v", err)
	}
	do(t, ctx, "open /ui", chromedp.Navigate(srv.URL+"/ui/"))
	waitJS(t, ctx, "the token prompt", `!document.getElementById('login').hidden`)
	do(t, ctx, "token", chromedp.SendKeys(chromedp.ID("token-input"), token), chromedp.Click(chromedp.ID("token-submit")))
	do(t, ctx, "app", chromedp.WaitVisible(chromedp.ID("app")))
	return ctx, srv, socks
}

// noCSPViolations fails the test when the page broke its CSP (xterm.js
// writing a <style> element, a script from elsewhere, a socket the
// policy does not allow).
func noCSPViolations(t *testing.T, ctx context.Context) {
	t.Helper()
	if v := eval[[]string](t, ctx, `window.cspViolations`); len(v) != 0 {
		t.Errorf("Content-Security-Policy violations: %q", v)
	}
}

// invokeHTTP runs a tool call through POST /tools/invoke as an agent (the
// tool token, sessionKey agent:main:main).
func invokeHTTP(t *testing.T, base, token, tool, args string) protocol.Result {
	t.Helper()
	body := `{"tool":` + strconv.Quote(tool) + `,"sessionKey":"agent:main:main","args":` + args + `}`
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/tools/invoke", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", tool, args, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var ans struct {
		OK     bool            `json:"ok"`
		Result protocol.Result `json:"result"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &ans) != nil || !ans.OK {
		t.Fatalf("%s %s: %d %s", tool, args, resp.StatusCode, b)
	}
	return ans.Result
}

// typeKeys types into the page's terminal as a user does: a click on it,
// then, per key, a key press with its text and a release, to the focused
// element (xterm.js's input textarea). (chromedp.KeyEvent sends the text
// as a separate char event, which the browser delivers even when the page
// handled the key down, as xterm.js does: every key would arrive twice.)
func typeKeys(t *testing.T, ctx context.Context, keys string) {
	t.Helper()
	press := func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		for _, r := range keys {
			evs := kb.Encode(r)
			if len(evs) == 3 && evs[1].Type == kb.KeyChar {
				down := *evs[0]
				down.Text, down.UnmodifiedText = evs[1].Text, evs[1].UnmodifiedText
				evs = []*input.DispatchKeyEventParams{&down, evs[2]}
			}
			for _, e := range evs {
				if _, err := cdp.Call(ctx, tg, input.DispatchKeyEvent, *e); err != nil {
					return chromedp.Void{}, err
				}
			}
		}
		return chromedp.Void{}, nil
	}
	do(t, ctx, "type "+strconv.Quote(keys), chromedp.Click(chromedp.ID("term-screen")), press)
}

// resizeWindow sets the browser window's size.
func resizeWindow(t *testing.T, ctx context.Context, width, height int64) {
	t.Helper()
	err := chromedp.Do(ctx, func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		w, err := cdp.Call(ctx, tg, cdpbrowser.GetWindowForTarget, cdpbrowser.GetWindowForTargetParams{})
		if err != nil {
			return chromedp.Void{}, err
		}
		_, err = cdp.Call(ctx, tg, cdpbrowser.SetWindowBounds, cdpbrowser.SetWindowBoundsParams{WindowID: w.WindowID, Bounds: &cdpbrowser.Bounds{Width: width, Height: height}})
		return chromedp.Void{}, err
	})
	if err != nil {
		t.Fatalf("resize the window to %dx%d: %v", width, height, err)
	}
}

// remoteSize types a command that prints the PTY's size as the session
// sees it (stty size: rows, then columns) and returns it once shown.
func remoteSize(t *testing.T, ctx context.Context, marker string) string {
	t.Helper()
	typeKeys(t, ctx, "echo "+marker+"-$(stty size | tr ' ' x)\r")
	re := regexp.MustCompile(regexp.QuoteMeta(marker) + `-(\d+x\d+)`)
	var got string
	waitFor(t, 30*time.Second, func() error {
		if m := re.FindStringSubmatch(eval[string](t, ctx, termTextJS)); m != nil {
			got = m[1]
			return nil
		}
		return fmt.Errorf("no %s line in the terminal", marker)
	})
	return got
}

// termSize is the page's terminal grid as stty prints it: rows x cols.
func termSize(t *testing.T, ctx context.Context) string {
	t.Helper()
	return eval[string](t, ctx, `(() => { const t = document.getElementById('term-screen').terminal; return t.rows + 'x' + t.cols; })()`)
}

// TestBrowserTerminal drives the terminal of the control page in headless
// Chromium against a real gateway: an agent's PTY shell, attached from
// the session table read-write after its retained log; typed keystrokes
// reach the shell (the agent reads them back through the tool API); a
// window resize reaches the PTY; the panel detaches cleanly; with another
// client holding the input the page attaches read-only and says so, shows
// that client's output, and shows the exit status.
func TestBrowserTerminal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	chrome := findChromium(t)
	const token = "ui-term-token"
	g, _ := startNodeGateway(t, token)
	res := invokeOK(t, g, "exec", `{"command":"sh","pty":true,"background":true}`)
	if res.Status() != "running" {
		t.Fatalf("pty sh: %v", res)
	}
	id := res.SessionID()
	ctx, srv, socks := termPage(t, g, chrome, token)

	// Output from before the terminal opens: the page shows it from the
	// session's log.
	invokeHTTP(t, srv.URL, token, "process", `{"action":"write","sessionId":"`+id+`","data":"echo early-$((1+1))\n"}`)
	waitFor(t, 20*time.Second, func() error {
		if !strings.Contains(invokeHTTP(t, srv.URL, token, "process", `{"action":"log","sessionId":"`+id+`"}`).Text(), "early-2") {
			return fmt.Errorf("early-2 not in the log yet")
		}
		return nil
	})

	clickRow(t, ctx, "the terminal button", "terminal-"+id)
	waitJS(t, ctx, "the terminal attached read-write", termCard+`.dataset.state === 'attached' && `+termCard+`.dataset.mode === 'rw'`)
	if got := eval[string](t, ctx, `document.getElementById('term-title').textContent`); got != id {
		t.Errorf("terminal title %q, want %q", got, id)
	}
	waitJS(t, ctx, "the retained log on the screen", termHas("early-2"))
	// The page sent its size once attached.
	waitJS(t, ctx, "the first resize", termCard+`.dataset.size === `+`(() => { const t = document.getElementById('term-screen').terminal; return t.cols + 'x' + t.rows; })()`)

	typeKeys(t, ctx, "echo typed-$((6*7))\r")
	waitJS(t, ctx, "the typed command's output", termHas("typed-42"))

	// The agent sees the line typed in the page in its own session.
	if log := invokeHTTP(t, srv.URL, token, "process", `{"action":"log","sessionId":"`+id+`"}`).Text(); !strings.Contains(log, "echo typed-$((6*7))") || !strings.Contains(log, "typed-42") {
		t.Errorf("process log after typing: %q", log)
	}
	if poll := invokeHTTP(t, srv.URL, token, "process", `{"action":"poll","sessionId":"`+id+`"}`); poll.Status() != "running" || !strings.Contains(poll.Text(), "typed-42") {
		t.Errorf("process poll after typing: %s %q", poll.Status(), poll.Text())
	}

	// The PTY has the terminal's size, and follows a window resize.
	before := remoteSize(t, ctx, "size-a")
	if want := termSize(t, ctx); before != want {
		t.Errorf("stty size %s, the page's terminal %s", before, want)
	}
	resizeWindow(t, ctx, 900, 1000)
	waitJS(t, ctx, "the terminal to follow the window", `(() => { const t = document.getElementById('term-screen').terminal; return t.rows + 'x' + t.cols !== `+strconv.Quote(before)+` && `+termCard+`.dataset.size === t.cols + 'x' + t.rows; })()`)
	after := remoteSize(t, ctx, "size-b")
	if after == before || after != termSize(t, ctx) {
		t.Errorf("stty size after the window resize: %s (before %s), the page's terminal %s", after, before, termSize(t, ctx))
	}

	// A screenshot of the page, and the terminal drew text (its canvas is
	// not one flat colour).
	dir := t.TempDir()
	shot, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	p := filepath.Join(dir, "terminal.png")
	if err := os.WriteFile(p, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(shot, []byte("\x89PNG\r\n\x1a\n")) || len(shot) < 20_000 {
		t.Errorf("screenshot %s: %d bytes, PNG header %v", p, len(shot), bytes.HasPrefix(shot, []byte("\x89PNG")))
	}
	if d := os.Getenv("ARTIFACTS_DIR"); d != "" {
		_ = os.WriteFile(filepath.Join(artifactDir(t), "ui-5-terminal.png"), shot, 0o644)
	}
	// (The canvas renderer draws at the next animation frame: a shot
	// taken in between may show the grid cleared.)
	var ink, tries int
	waitFor(t, 20*time.Second, func() error {
		tries++
		termShot, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.ID("term-screen")))
		if err != nil {
			t.Fatalf("terminal screenshot: %v", err)
		}
		if ink = inkPixels(t, termShot); ink < 500 {
			_ = os.WriteFile(filepath.Join(dir, "terminal-blank.png"), termShot, 0o644)
			return fmt.Errorf("the terminal's screenshot has %d pixels off its background: nothing drawn", ink)
		}
		return nil
	})
	if tries > 1 {
		t.Logf("the terminal's screenshot showed text at try %d", tries)
	}

	// A socket cut on the way is said so, and attached again on request:
	// the screen starts again from the log.
	socks.cut()
	waitJS(t, ctx, "the lost connection", termCard+`.dataset.state === 'closed' && `+termCard+`.dataset.closeCode === '1006' && !document.getElementById('term-reattach').hidden`)
	if got := eval[string](t, ctx, `document.getElementById('term-status').textContent`); !strings.Contains(got, "connection was lost") {
		t.Errorf("status after the cut: %q", got)
	}
	waitJS(t, ctx, "the cut said in the terminal", termHas("[disconnected (1006"))
	do(t, ctx, "attach again", chromedp.Click(chromedp.ID("term-reattach")))
	waitJS(t, ctx, "the terminal attached again", termCard+`.dataset.state === 'attached' && `+termCard+`.dataset.mode === 'rw' && `+termHas("size-b-")+` && !`+termHas("[disconnected"))
	typeKeys(t, ctx, "echo again-$((2*3))\r")
	waitJS(t, ctx, "typing after the new attach", termHas("again-6"))

	// Closing the panel detaches (the shell runs on) and lets another
	// client take the input.
	do(t, ctx, "close the terminal", chromedp.Click(chromedp.ID("term-close")))
	waitJS(t, ctx, "the panel to close", termCard+`.hidden`)
	if p := invokeHTTP(t, srv.URL, token, "process", `{"action":"poll","sessionId":"`+id+`"}`); p.Status() != "running" {
		t.Fatalf("after the page detached: %s %q", p.Status(), p.Text())
	}
	wsURL := "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/sessions/" + id + "/attach?sessionKey=agent:main:main&write=1"
	var writer *websocket.Conn
	waitFor(t, 20*time.Second, func() error {
		c, resp, err := websocket.Dial(t.Context(), wsURL, &websocket.DialOptions{
			HTTPHeader:   http.Header{"Authorization": {"Bearer " + token}},
			Subprotocols: []string{"execmesh.attach.v1"},
		})
		if err != nil {
			if resp != nil && resp.StatusCode == http.StatusConflict {
				return fmt.Errorf("the page still holds the input: %v", err)
			}
			t.Fatalf("attach as a writer: %v", err)
		}
		writer = c
		return nil
	})
	t.Cleanup(func() { writer.CloseNow() })
	wctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, b, err := writer.Read(wctx); err != nil || !strings.Contains(string(b), `"writer":true`) {
		t.Fatalf("writer's started frame: %s %v", b, err)
	}
	// Keep reading, as a client must, so the session is never held up.
	go func() {
		for {
			if _, _, err := writer.Read(t.Context()); err != nil {
				return
			}
		}
	}()

	// Opened again, the page attaches read-only and says why.
	clickRow(t, ctx, "the terminal button again", "terminal-"+id)
	waitJS(t, ctx, "the read-only terminal", termCard+`.dataset.state === 'attached' && `+termCard+`.dataset.mode === 'ro'`)
	if got := eval[string](t, ctx, `document.getElementById('term-status').textContent`); !strings.Contains(got, "another client holds") {
		t.Errorf("read-only status %q", got)
	}
	waitJS(t, ctx, "the log of the earlier typing", termHas("typed-42"))
	stdin := func(s string) {
		t.Helper()
		if err := writer.Write(wctx, websocket.MessageBinary, append([]byte{protocol.FrameStdin}, s...)); err != nil {
			t.Fatal(err)
		}
	}
	stdin("echo from-writer-$((5*5))\r")
	waitJS(t, ctx, "the other client's output", termHas("from-writer-25"))
	// Keys typed in a read-only terminal go nowhere.
	typeKeys(t, ctx, "echo ro-$((3*3))\r")
	stdin("exit 7\r")
	waitJS(t, ctx, "the exit status", termCard+`.dataset.state === 'exited' && `+termCard+`.dataset.exitCode === '7'`)
	if got := eval[string](t, ctx, `document.getElementById('term-status').textContent`); !strings.Contains(got, "exit 7") {
		t.Errorf("exit status shown: %q", got)
	}
	if eval[bool](t, ctx, termHas("ro-9")) {
		t.Errorf("a read-only terminal's keys reached the shell")
	}
	noCSPViolations(t, ctx)
}

// inkPixels counts the pixels of a PNG that differ from its most common
// colour (the background).
func inkPixels(t *testing.T, b []byte) int {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("decode the screenshot: %v", err)
	}
	counts := map[[3]uint32]int{}
	bounds := img.Bounds()
	px := func(x, y int) [3]uint32 {
		r, g, b, _ := img.At(x, y).RGBA()
		return [3]uint32{r >> 8, g >> 8, b >> 8}
	}
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			counts[px(x, y)]++
		}
	}
	most := 0
	for _, n := range counts {
		most = max(most, n)
	}
	return bounds.Dx()*bounds.Dy() - most
}

// TestBrowserRunInTerminal runs a command from the page's form "in
// terminal": GET /v1/exec/attach starts it on a PTY, the terminal shows
// its prompt, takes the answer typed, and shows the exit status; the
// session is listed, the agent's log has it, and a run whose terminal is
// closed keeps running. The session table filters and pages.
func TestBrowserRunInTerminal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	chrome := findChromium(t)
	const token = "ui-run-token"
	g, _ := startNodeGateway(t, token)
	ctx, srv, _ := termPage(t, g, chrome, token)

	do(t, ctx, "run in terminal",
		chromedp.SendKeys(chromedp.ID("run-command"), `printf 'name? '; read n; echo "hello-$n"; exit 3`),
		chromedp.Click(chromedp.ID("run-terminal")),
		chromedp.Click(chromedp.ID("run-submit")))
	waitJS(t, ctx, "the started terminal", termCard+`.dataset.state === 'attached' && `+termCard+`.dataset.mode === 'rw' && `+termCard+`.dataset.sessionId`)
	id := eval[string](t, ctx, termCard+`.dataset.sessionId`)
	waitJS(t, ctx, "the prompt", termHas("name? "))
	typeKeys(t, ctx, "world\r")
	waitJS(t, ctx, "the answer", termHas("hello-world"))
	waitJS(t, ctx, "the exit status", termCard+`.dataset.state === 'exited' && `+termCard+`.dataset.exitCode === '3'`)
	if got := eval[string](t, ctx, `document.getElementById('term-status').textContent`); !strings.Contains(got, "exit 3") {
		t.Errorf("exit status shown: %q", got)
	}
	row := sessionRowJS(id)
	waitJS(t, ctx, "the session in the table", row+` && `+row+`.querySelector('[data-testid="session-status"]').textContent.includes('exit 3')`)
	if log := invokeHTTP(t, srv.URL, token, "process", `{"action":"log","sessionId":"`+id+`"}`).Text(); !strings.Contains(log, "hello-world") {
		t.Errorf("the agent's log of the run: %q", log)
	}

	// A run whose terminal is closed keeps running (keepOnDetach).
	clearInput(t, ctx, "run-command")
	do(t, ctx, "run sleep in terminal", chromedp.SendKeys(chromedp.ID("run-command"), "echo sleeping; sleep 300"), chromedp.Click(chromedp.ID("run-submit")))
	waitJS(t, ctx, "the second run", termCard+`.dataset.state === 'attached' && `+termCard+`.dataset.sessionId && `+termCard+`.dataset.sessionId !== `+strconv.Quote(id)+` && `+termHas("sleeping"))
	sleeper := eval[string](t, ctx, termCard+`.dataset.sessionId`)
	do(t, ctx, "close the terminal", chromedp.Click(chromedp.ID("term-close")))
	waitJS(t, ctx, "the panel to close", termCard+`.hidden`)
	if p := invokeHTTP(t, srv.URL, token, "process", `{"action":"poll","sessionId":"`+sleeper+`"}`); p.Status() != "running" {
		t.Errorf("the run after its terminal closed: %s %q", p.Status(), p.Text())
	}
	invokeHTTP(t, srv.URL, token, "process", `{"action":"kill","sessionId":"`+sleeper+`"}`)

	// Filter and pages: 12 more sessions, 10 a page.
	for i := range 12 {
		invokeOK(t, g, "exec", `{"command":"echo pageme-`+strconv.Itoa(i)+`","background":true}`)
	}
	do(t, ctx, "10 a page", chromedp.SetValue(chromedp.ID("sessions-page-size"), "10"),
		chromedp.Evaluate[chromedp.Void](`document.getElementById('sessions-page-size').dispatchEvent(new Event('change'))`),
		chromedp.SendKeys(chromedp.ID("sessions-filter"), "pageme"))
	rows := `document.querySelectorAll('[data-testid="session-row"]').length`
	pageText := `document.getElementById('sessions-page').textContent`
	waitJS(t, ctx, "the first page of the filtered sessions", rows+` === 10 && `+pageText+`.startsWith('1–10 of 12 matching')`)
	screenshot(t, ctx, artifactDir(t), "ui-6-sessions-filtered.png")
	do(t, ctx, "next page", chromedp.Click(chromedp.ID("sessions-next")))
	waitJS(t, ctx, "the second page", rows+` === 2 && `+pageText+`.startsWith('11–12 of 12 matching')`)
	if !eval[bool](t, ctx, `document.getElementById('sessions-next').disabled && !document.getElementById('sessions-prev').disabled`) {
		t.Errorf("pager buttons on the last page")
	}
	clearInput(t, ctx, "sessions-filter")
	do(t, ctx, "filter on a command", chromedp.SendKeys(chromedp.ID("sessions-filter"), "pageme-11"))
	waitJS(t, ctx, "one session", rows+` === 1 && document.querySelector('[data-testid="session-command"]').textContent === 'echo pageme-11' && document.getElementById('sessions-pager').hidden`)
	clearInput(t, ctx, "sessions-filter")
	do(t, ctx, "filter on a status", chromedp.SendKeys(chromedp.ID("sessions-filter"), "exit 3"))
	waitJS(t, ctx, "the session that exited 3", rows+` === 1 && `+row)

	// The key box suggests the sessionKey of another agent's running
	// session (the gateway lists no keys; its blockers name them).
	other, err := g.Invoke(t.Context(), gateway.InvokeRequest{Tool: "exec", Args: []byte(`{"command":"sleep 300","background":true}`), SessionKey: "agent:ops:nightly"})
	if err != nil || other.Status() != "running" {
		t.Fatalf("exec as agent:ops:nightly: %v %v", other, err)
	}
	do(t, ctx, "focus the key box", chromedp.Focus(chromedp.ID("session-key")))
	waitJS(t, ctx, "the other key suggested", `[...document.querySelectorAll('#session-keys option')].some((o) => o.value === 'agent:ops:nightly')`)
	noCSPViolations(t, ctx)
}
