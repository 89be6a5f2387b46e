package openclaw

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/execmesh/execmesh/internal/openclawtest"
)

// TestREADMEOpenClawConfig: the configuration README.md's "Using execmesh
// from OpenClaw" section shows is what `execmesh mcp --print-config
// openclaw` prints for the default gateway with execmesh on PATH (the
// configuration TestBackgroundExitReachesModelOnce gives the real
// OpenClaw), and the section names the OpenClaw release the tests run.
func TestREADMEOpenClawConfig(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## Using execmesh from OpenClaw\n")
	if !ok {
		t.Fatal(`README.md has no "## Using execmesh from OpenClaw" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	if !strings.Contains(section, "OpenClaw "+openclawtest.OpenClawVersion) {
		t.Errorf("the section does not name OpenClaw %s, the release the tests run", openclawtest.OpenClawVersion)
	}
	_, block, ok := strings.Cut(section, "```json\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("the section has no ```json block")
	}
	var shown any
	if err := json.Unmarshal([]byte(block), &shown); err != nil {
		t.Fatalf("the section's JSON: %v\n%s", err, block)
	}
	bin := binary(t)
	cmd := exec.Command(bin, "mcp", "--print-config", "openclaw")
	cmd.Env = []string{"HOME=" + t.TempDir(), "PATH=" + filepath.Dir(bin) + ":" + os.Getenv("PATH")}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("--print-config openclaw: %v", err)
	}
	var printed any
	if err := json.Unmarshal(out, &printed); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(shown, printed) {
		t.Errorf("README.md shows\n%s\nbut --print-config openclaw prints\n%s", block, out)
	}
}
