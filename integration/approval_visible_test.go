package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestApprovalShowsControlBytes: a command with ANSI (erase line),
// backspace, CR and a bidi override, pending approval on a running
// daemon, is shown by `execmesh approvals list` and `approvals get` with
// those bytes as visible escapes and no raw control byte; the JSON API
// (--json) keeps the command as it is; the Exec denied event shows the
// escapes too, and so does `execmesh exec` when its approval is denied.
func TestApprovalShowsControlBytes(t *testing.T) {
	state := filepath.Join(t.TempDir(), ".execmesh")
	dir := t.TempDir()
	d := startBareDaemon(t, "gateway", state, dir) // allowlist + on-miss

	const command = "echo hidden\x1b[2K\rls -la\b\b\u202etxt.sh"
	const shown = `echo hidden\x1b[2K\rls -la\b\b\u202etxt.sh`
	b, _ := json.Marshal(map[string]any{"tool": "exec", "args": map[string]any{"command": command, "host": "gateway"}})
	res, err := http.Post(d.url+"/tools/invoke", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var inv struct {
		Result struct {
			Details struct {
				Status       string `json:"status"`
				ApprovalSlug string `json:"approvalSlug"`
			} `json:"details"`
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"result"`
	}
	err = json.NewDecoder(res.Body).Decode(&inv)
	res.Body.Close()
	if err != nil || inv.Result.Details.Status != "approval-pending" {
		t.Fatalf("exec: %d %+v %v, want approval-pending", res.StatusCode, inv, err)
	}
	if len(inv.Result.Content) == 0 || !strings.Contains(inv.Result.Content[0].Text, "```sh\n"+shown+"\n```") {
		t.Errorf("approval-pending text does not show the command escaped: %q", inv.Result.Content)
	}
	noRawControls := func(what, out string) {
		t.Helper()
		for i, r := range out {
			if (r < 0x20 && r != '\n') || r == 0x7f || r == '\u202e' {
				t.Fatalf("%s has a raw %U at %d: %q", what, r, i, out)
			}
		}
	}

	r := d.cli(dir, "approvals", "list")
	if r.code != 0 || !strings.Contains(r.stdout, shown) {
		t.Fatalf("approvals list: %d, stdout %q (want %q in it), stderr %q", r.code, r.stdout, shown, r.stderr)
	}
	noRawControls("approvals list", r.stdout)
	slug := inv.Result.Details.ApprovalSlug
	r = d.cli(dir, "approvals", "get", slug)
	if r.code != 0 || !strings.Contains(r.stdout, shown) {
		t.Fatalf("approvals get: %d %q %q", r.code, r.stdout, r.stderr)
	}
	noRawControls("approvals get", r.stdout)

	// The API answers the command as it is (JSON escapes it).
	r = d.cli(dir, "approvals", "list", "--json")
	var raw struct {
		Approvals []struct {
			Command string `json:"command"`
		} `json:"approvals"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil || len(raw.Approvals) != 1 || raw.Approvals[0].Command != command {
		t.Fatalf("approvals list --json: %v %q", err, r.stdout)
	}

	if r := d.cli(dir, "approvals", "resolve", slug, "deny"); r.code != 0 {
		t.Fatalf("resolve: %d %s", r.code, r.stderr)
	}
	events := httpGetJSON(t, d.url+"/v1/events?sessionKey=agent:main:main&waitMs=3000")["events"].([]any)
	var denied string
	for _, e := range events {
		if m := e.(map[string]any); m["kind"] == "exec.denied" {
			denied = m["text"].(string)
		}
	}
	if !strings.HasSuffix(denied, "): "+shown) {
		t.Fatalf("Exec denied event %q, want it to end with the escaped command", denied)
	}
	noRawControls("Exec denied", denied)

	// execmesh exec waits for the approval and, denied, says so.
	bin, err := execmeshBinary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "exec", "--", command)
	cmd.Dir = dir
	cmd.Env = cleanEnv(map[string]string{"HOME": d.home, "EXECMESH_GATEWAY_URL": d.url, "EXECMESH_STATE_DIR": state})
	errPipe, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(errPipe)
	line, err := rd.ReadString('\n')
	m := regexp.MustCompile(`approval ([0-9a-f]{8})`).FindStringSubmatch(line)
	if err != nil || m == nil {
		_ = cmd.Process.Kill()
		t.Fatalf("exec's first stderr line %q (%v)", line, err)
	}
	if r := d.cli(dir, "approvals", "resolve", m[1], "deny"); r.code != 0 {
		_ = cmd.Process.Kill()
		t.Fatalf("resolve: %d %s", r.code, r.stderr)
	}
	rest, _ := io.ReadAll(rd)
	_ = cmd.Wait()
	if !strings.Contains(string(rest), "exec denied (user-denied): "+shown) {
		t.Fatalf("exec's stderr %q, want the escaped command", rest)
	}
	noRawControls("execmesh exec", line+string(rest))
}
