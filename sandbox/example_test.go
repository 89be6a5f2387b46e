package sandbox_test

import (
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/execmesh/execmesh/sandbox"
)

// The default mode is no sandbox runtime: Prepare returns no Argv, and the
// gateway refuses host=sandbox calls.
func ExampleNew() {
	rt, err := sandbox.New(sandbox.DefaultConfig("/var/lib/execmesh"))
	if err != nil {
		log.Fatal(err)
	}
	p, err := rt.Prepare(sandbox.Request{AgentID: "main", Command: "ls"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rt.Mode(), p.Argv == nil)
	// Output: off true
}

// With mode bwrap, Prepare returns the bubblewrap command line; a workdir
// outside the agent's workspace becomes a failed result, and nothing runs.
func ExampleRuntime_Prepare() {
	stateDir, err := os.MkdirTemp("", "execmesh-state-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(stateDir)

	cfg := sandbox.DefaultConfig(stateDir)
	cfg.Mode = sandbox.ModeBwrap
	rt, err := sandbox.New(cfg)
	if errors.Is(err, sandbox.ErrNotInstalled) {
		fmt.Println("no bwrap:", err)
		return
	}
	if err != nil {
		log.Fatal(err)
	}

	_, err = rt.Prepare(sandbox.Request{AgentID: "main", Command: "ls", Workdir: "/etc"})
	var wd *sandbox.WorkdirError
	fmt.Println("refused:", errors.As(err, &wd))

	p, err := rt.Prepare(sandbox.Request{
		AgentID: "main",
		Command: `echo "$PATH" | cut -d: -f1`,
		Env:     map[string]string{"PATH": "/opt/tools/bin"},
	})
	if err != nil {
		log.Fatal(err) // includes bwrap being unusable here (Available)
	}
	// What the session core does with it.
	cmd := exec.Command(p.Argv[0], p.Argv[1:]...)
	cmd.Dir, cmd.Env = p.Workdir, p.Env
	out, err := cmd.Output()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("cwd %s, PATH starts %s", filepath.Base(p.DisplayCwd), out)
}
