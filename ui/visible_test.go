package ui

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/execmesh/execmesh/internal/visible"
)

// TestVisibleMatchesGo: the page's visible() (assets/visible.js), run by
// Node, escapes every code point Go's Unicode tables assign exactly as
// internal/visible.String does, and so does it for a command with ANSI,
// backspace, CR and bidi bytes. Code points Go does not know yet (Node's
// Unicode can be newer) are left out: both escape them while unassigned.
func TestVisibleMatchesGo(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		skipLoudly(t, "no node on PATH to run assets/visible.js")
	}
	script, err := filepath.Abs("assets/visible.js")
	if err != nil {
		t.Fatal(err)
	}
	assigned := []*unicode.RangeTable{unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z, unicode.Cc, unicode.Cf, unicode.Co}
	var cps []rune
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if unicode.In(r, assigned...) {
			cps = append(cps, r)
		}
	}
	samples := []string{"rm -rf ~/\x1b[2K\bclean\rls -la \u202etxt.sh", "plain ls -la", `printf 'a\n'`}
	in, err := json.Marshal(struct {
		CPs     []rune   `json:"cps"`
		Samples []string `json:"samples"`
	}{cps, samples})
	if err != nil {
		t.Fatal(err)
	}
	const prog = `const visible = require(process.argv[1]);
let data = ''; process.stdin.on('data', (c) => data += c); process.stdin.on('end', () => {
  const d = JSON.parse(data);
  process.stdout.write(JSON.stringify({cps: d.cps.map((cp) => visible(String.fromCodePoint(cp))), samples: d.samples.map(visible)}));
});`
	cmd := exec.CommandContext(t.Context(), node, "-e", prog, script)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.Bytes())
	}
	var got struct {
		CPs     []string `json:"cps"`
		Samples []string `json:"samples"`
	}
	if err := json.Unmarshal(out, &got); err != nil || len(got.CPs) != len(cps) || len(got.Samples) != len(samples) {
		t.Fatalf("node's answer: %v (%d code points, %d samples)", err, len(got.CPs), len(got.Samples))
	}
	var bad []string
	for i, r := range cps {
		if want := visible.String(string(r)); got.CPs[i] != want {
			bad = append(bad, fmt.Sprintf("U+%04X: page %q, Go %q", r, got.CPs[i], want))
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d code points differ, first: %s", len(bad), strings.Join(bad[:min(len(bad), 10)], "; "))
	}
	for i, s := range samples {
		if want := visible.String(s); got.Samples[i] != want {
			t.Errorf("visible(%q) = %q on the page, %q in Go", s, got.Samples[i], want)
		}
	}
	if want := `rm -rf ~/\x1b[2K\bclean\rls -la \u202etxt.sh`; got.Samples[0] != want {
		t.Errorf("page shows %q, want %q", got.Samples[0], want)
	}
}

// TestPageShowsCommandsVisible: the page loads visible.js before app.js,
// serves it, and app.js puts every command and cwd it shows through
// visible(): the approvals table, the decision line and the sessions
// table (TestVisibleMatchesGo checks visible itself).
func TestPageShowsCommandsVisible(t *testing.T) {
	t.Parallel()
	h := Handler()
	page := get(t, h, http.MethodGet, "/ui/").Body.String()
	vi, ai := strings.Index(page, `<script src="visible.js" defer></script>`), strings.Index(page, `<script src="app.js" defer></script>`)
	if vi < 0 || ai < 0 || vi > ai {
		t.Fatalf("index.html must load visible.js before app.js (at %d, %d)", vi, ai)
	}
	if rec := get(t, h, http.MethodGet, "/ui/visible.js"); rec.Code != http.StatusOK || !strings.Contains(rec.Header().Get("Content-Type"), "javascript") || !strings.Contains(rec.Body.String(), "function visible(") {
		t.Fatalf("GET /ui/visible.js: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	app := get(t, h, http.MethodGet, "/ui/app.js").Body.String()
	for _, use := range []string{
		"command.textContent = visible(a.command || '')",
		"cwd.textContent = visible(a.cwd || '')",
		"DECISION_LABELS[decision] + ': ' + visible(command || id)",
		"command.textContent = visible(s.command || '')",
	} {
		if !strings.Contains(app, use) {
			t.Errorf("app.js does not show it through visible(): %s", use)
		}
	}
	// No other assignment shows a raw command.
	if m := regexp.MustCompile(`textContent = [^;\n]*\.command\b`).FindAllString(app, -1); len(m) != 2 {
		t.Errorf("app.js sets textContent from a command %d times (%q), want the 2 through visible()", len(m), m)
	}
}
