package session

import (
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

var hexLine = regexp.MustCompile(`<([0-9a-f]*)>`)

// startHexEcho starts a background PTY session running the raw-mode hex
// echo helper; banner is printed before READY (to switch cursor modes).
func startHexEcho(t *testing.T, m *Manager, scope, banner string) string {
	t.Helper()
	id := startBackground(t, m, ExecRequest{
		Command:    helperCommand("hexecho"),
		PTY:        true,
		ScopeKey:   scope,
		TimeoutSec: ptr(0.0),
		Env:        append(os.Environ(), "HELPER_BANNER="+banner),
	})
	waitOutput(t, m, id, "READY")
	return id
}

// receivedHex is everything the helper reported receiving so far.
func receivedHex(m *Manager, id string) string {
	s := m.anySession(id)
	s.mu.Lock()
	out := s.out.aggregated()
	s.mu.Unlock()
	var b strings.Builder
	for _, g := range hexLine.FindAllStringSubmatch(out, -1) {
		b.WriteString(g[1])
	}
	return b.String()
}

func waitReceived(t *testing.T, m *Manager, id, want string) {
	t.Helper()
	checkFor(t, waitLimit, 10*time.Millisecond, func() error {
		if got := receivedHex(m, id); got != want {
			if !strings.HasPrefix(want, got) {
				t.Fatalf("received %s\nwant     %s", got, want)
			}
			return fmt.Errorf("received %d of %d hex digits", len(got), len(want))
		}
		return nil
	})
}

// TestSendKeysOnPTY replays every send_keys.json case through the process
// tool against a program behind a real PTY and checks the texts and the
// exact bytes the program received.
func TestSendKeysOnPTY(t *testing.T) {
	t.Parallel()
	cases := loadSendKeys(t)
	m := newManager(t, nil)
	const scope = "agent:keys"
	banners := map[string]string{"normal": "\x1b[?1l", "application": "\x1b[?1h", "unknown": ""}
	for _, mode := range []string{"normal", "application", "unknown"} {
		t.Run(mode, func(t *testing.T) {
			id := startHexEcho(t, m, scope, banners[mode])
			if got := m.anySession(id).cursorModeForTest(); got.String() != mode {
				t.Fatalf("cursor mode = %s, want %s", got, mode)
			}
			var want strings.Builder
			for _, c := range cases {
				if c.CursorKeyMode != mode {
					continue
				}
				if c.Quirk != "" {
					t.Logf("skip %q: JavaScript quirk not reproduced: %s", c.Name, c.Quirk)
					continue
				}
				res := proc(t, m, scope, protocol.ProcessArgs{Action: "send-keys", SessionID: id, Keys: c.Keys, Hex: c.Hex, Literal: c.Literal})
				wantText := strings.ReplaceAll(c.Tool.Text, "<sid>", id)
				if res.Status() != c.Tool.Status || res.Text() != wantText {
					t.Errorf("%s: = %s %q, want %s %q", c.Name, res.Status(), res.Text(), c.Tool.Status, wantText)
				}
				if res.Status() == protocol.StatusRunning {
					if res.Details.SessionID.Value() != id || res.Details.Name.IsZero() {
						t.Errorf("%s: details %v", c.Name, res.Details)
					}
				}
				if c.BytesHex != nil && c.Tool.Status == "running" {
					want.WriteString(*c.BytesHex)
				}
			}
			waitReceived(t, m, id, want.String())
			proc(t, m, scope, protocol.ProcessArgs{Action: "kill", SessionID: id})
		})
	}
}

// TestPasteOnPTY replays paste.json through the process tool.
func TestPasteOnPTY(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	const scope = "agent:paste"
	id := startHexEcho(t, m, scope, "")
	var want strings.Builder
	for _, c := range loadPaste(t) {
		res := proc(t, m, scope, protocol.ProcessArgs{Action: "paste", SessionID: id, Text: c.Text, Bracketed: c.Bracketed})
		wantText := strings.ReplaceAll(c.Tool.Text, "<sid>", id)
		if res.Status() != c.Tool.Status || res.Text() != wantText {
			t.Errorf("%s: = %s %q, want %s %q", c.Name, res.Status(), res.Text(), c.Tool.Status, wantText)
		}
		want.WriteString(c.BytesHex)
	}
	waitReceived(t, m, id, want.String())
	// write and submit reach the program byte for byte too.
	res := proc(t, m, scope, protocol.ProcessArgs{Action: "write", SessionID: id, Data: ptr("hé😀")})
	if res.Text() != "Wrote 7 bytes to session "+id+"." {
		t.Errorf("write: %q", res.Text())
	}
	res = proc(t, m, scope, protocol.ProcessArgs{Action: "submit", SessionID: id})
	if res.Text() != "Submitted session "+id+" (sent CR)." {
		t.Errorf("submit: %q", res.Text())
	}
	want.WriteString(hex.EncodeToString([]byte("hé😀\r")))
	waitReceived(t, m, id, want.String())
}

func (s *session) cursorModeForTest() cursorMode {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mode
}
