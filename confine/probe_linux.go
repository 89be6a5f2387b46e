package confine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

// Probe learns whether this kernel and these privileges can hold the
// confinement: it starts helper once, as a session would be started, with
// a hidden directory, a write root, one allowed program and the
// supervisor, and checks that the program ran and another was refused.
// nil means confined runs will work; the error says why not.
func Probe(ctx context.Context, helper string) error {
	abi, err := ll.LandlockGetABIVersion()
	if err != nil {
		return fmt.Errorf("Landlock is not available in this kernel (%v)", err)
	}
	if abi < MinABI {
		return fmt.Errorf("Landlock ABI %d is older than %d", abi, MinABI)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if sh, err = filepath.EvalSymlinks(sh); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	dir, err := os.MkdirTemp("", "execmesh-probe-")
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	defer os.RemoveAll(dir)
	hidden := filepath.Join(dir, "hidden")
	if err := os.Mkdir(hidden, 0o700); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if err := os.WriteFile(filepath.Join(hidden, "secret"), []byte("x"), 0o600); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	self, err := filepath.EvalSymlinks(helper)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	spec := Spec{
		Confine: true,
		// `test` and `echo` are builtins; the helper's binary is the
		// program the confinement must refuse.
		Pipeline: [][]string{{sh, "-c", `test -e hidden/secret && exit 3; "$0" 2>/dev/null; echo ok`, self}},
		Exec:     []File{{Path: sh}},
		Write:    []string{dir, "/dev/null"},
		Hide:     []string{hidden},
	}
	if ip := Interpreter(sh); ip != "" {
		spec.Interpreters = []File{{Path: ip}}
	}
	sup, err := NewSupervisor(&spec, SupervisorOptions{})
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	args, err := spec.Args()
	if err != nil {
		sup.ReleaseChild()
		return fmt.Errorf("probe: %w", err)
	}
	cmd := exec.CommandContext(ctx, helper, args...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.ExtraFiles = []*os.File{sup.ChildFile()}
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	SetSysProcAttr(cmd.SysProcAttr)
	sup.Start()
	err = cmd.Start()
	sup.ReleaseChild()
	if err != nil {
		return fmt.Errorf("cannot start the confinement helper in its namespaces: %w", err)
	}
	err = cmd.Wait()
	<-sup.Done()
	msg := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(errb.String()), setupErrorTag))
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ee.ExitCode() == 3:
		return errors.New("the daemon's state stays visible to confined commands")
	case err != nil && msg != "":
		return errors.New(msg)
	case err != nil:
		return fmt.Errorf("confinement helper: %w", err)
	case out.String() != "ok\n":
		return fmt.Errorf("confinement helper: unexpected output %q", out.String())
	case len(sup.Refused()) == 0:
		return errors.New("an exec outside the allowed set was not refused")
	}
	return nil
}
