package confine

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// HelperArg is the first argument that makes the binary the helper
// (RunHelperIfRequested): `<binary> __confine <spec JSON>`. nsHelperArg
// starts the helper's confined part in a user namespace of its own.
const (
	HelperArg   = "__confine"
	nsHelperArg = "__confine-ns"
)

// SupervisorFD is the descriptor on which a supervised helper finds its
// end of the supervisor's socket.
const SupervisorFD = 3

// Exit statuses of the helper when it cannot run the command, as a shell
// reports them: 126 for a program that may not or cannot be executed, 127
// for one that does not exist, 125 for a confinement that could not be set
// up (nothing ran).
const (
	ExitSetup     = 125
	ExitRefused   = 126
	ExitNotFound  = 127
	setupErrorTag = "execmesh: confinement: "
)

// File is a file bound to the inode the daemon saw: the helper adds its
// rule only if the path still names that inode. Dev and Ino zero bind the
// path alone.
type File struct {
	Path string `json:"path"`
	Dev  uint64 `json:"dev,omitempty"`
	Ino  uint64 `json:"ino,omitempty"`

	// exact: a directory must be at Path itself when its rule is made,
	// not reached through a link (the helper's write roots).
	exact bool
}

// Spec is what the helper sets up and runs. The zero value runs Pipeline
// with nothing confined (the fallback mode's way to run a plan as judged).
type Spec struct {
	// Confine turns the confinement on; the fields below Pipeline apply
	// only then.
	Confine bool `json:"confine,omitempty"`
	// Pipeline is the command: one argument vector per segment, each
	// starting with an absolute path. One segment replaces the helper;
	// several run with pipes between them, the helper waiting for all
	// and exiting as the last did.
	Pipeline [][]string `json:"pipeline"`

	// ExecAll leaves execution unrestricted (the allowlist pattern "*").
	ExecAll bool `json:"execAll,omitempty"`
	// Exec are the files that may be executed.
	Exec []File `json:"exec,omitempty"`
	// ExecDirs are directories beneath which any file may be executed.
	ExecDirs []string `json:"execDirs,omitempty"`
	// Interpreters are ELF interpreters: executable as a program's
	// interpreter, refused by the supervisor as a program of their own.
	Interpreters []File `json:"interpreters,omitempty"`
	// Write are the directories (or files) beneath which the command may
	// create, change and remove files. A directory must be given by its
	// real path: the helper refuses to run when it no longer is one (a
	// component renamed to a link since the daemon checked it).
	Write []string `json:"write,omitempty"`
	// Hide are the paths masked with an empty read-only mount.
	Hide []string `json:"hide,omitempty"`
	// Workdir is the command's working directory, symbolic links
	// resolved; the helper enters it again once its mounts are made.
	Workdir string `json:"workdir,omitempty"`
	// NoExec are more directories bound noexec, like the write roots:
	// where earlier confined commands could write (another session's
	// workdir), so that what they planted is no code to this one.
	NoExec []string `json:"noexec,omitempty"`
	// Supervised says that SupervisorFD is the supervisor's socket.
	Supervised bool `json:"supervised,omitempty"`
	// UserNS says that the helper makes its own user namespace (the
	// daemon is not root); Args sets it.
	UserNS bool `json:"userns,omitempty"`

	// linked are the files of Exec beneath a write root that have
	// another name (layout finds them); they get no rule.
	linked []string
}

// Validate checks what the helper relies on: a pipeline of absolute
// programs, absolute clean paths, and no hidden path that contains a
// writable one (it would be masked away).
func (s *Spec) Validate() error {
	if len(s.Pipeline) == 0 {
		return errors.New("confine: empty pipeline")
	}
	for i, argv := range s.Pipeline {
		if len(argv) == 0 || !filepath.IsAbs(argv[0]) {
			return fmt.Errorf("confine: segment %d: program must be an absolute path", i)
		}
	}
	paths := func(kind string, ps []string) error {
		for _, p := range ps {
			if !filepath.IsAbs(p) || filepath.Clean(p) != p {
				return fmt.Errorf("confine: %s path %q is not absolute and clean", kind, p)
			}
		}
		return nil
	}
	var files []string
	for _, f := range append(append([]File(nil), s.Exec...), s.Interpreters...) {
		files = append(files, f.Path)
	}
	for _, c := range []struct {
		kind string
		ps   []string
	}{{"exec", files}, {"exec dir", s.ExecDirs}, {"write", s.Write}, {"hide", s.Hide}, {"workdir", nonEmpty(s.Workdir)}, {"noexec", s.NoExec}} {
		if err := paths(c.kind, c.ps); err != nil {
			return err
		}
	}
	for _, h := range s.Hide {
		for _, w := range append(nonEmpty(s.Workdir), s.Write...) {
			if Within(w, h) {
				return fmt.Errorf("confine: %s is inside the hidden %s", w, h)
			}
		}
	}
	for _, w := range append(nonEmpty(s.Workdir), s.Write...) {
		if w == "/" {
			return errors.New("confine: / cannot be a place a confined command writes to")
		}
	}
	return nil
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// Within reports whether path is dir or beneath it (both clean and
// absolute).
func Within(path, dir string) bool {
	if dir == "/" {
		return true
	}
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// Args returns the helper's arguments after the binary: HelperArg and the
// spec. A daemon that is not root cannot start the helper in a user
// namespace itself (it is not dumpable, so it may not write the child's
// id maps): the helper then starts its confined part in one (UserNS).
func (s *Spec) Args() ([]string, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	s.UserNS = s.Confine && os.Geteuid() != 0
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("confine: %w", err)
	}
	return []string{HelperArg, string(b)}, nil
}

// RunHelperIfRequested becomes the helper when the process was started as
// one (os.Args[1] is HelperArg) and never returns then; otherwise it
// returns at once. Call it first in main, and in TestMain of tests that
// start confined commands from the test binary.
func RunHelperIfRequested() {
	if len(os.Args) < 2 {
		return
	}
	switch os.Args[1] {
	case HelperArg:
		os.Exit(helperMain(os.Args[2:], false))
	case nsHelperArg:
		os.Exit(helperMain(os.Args[2:], true))
	}
}

// decodeSpec reads the helper's arguments.
func decodeSpec(args []string) (*Spec, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("want one spec argument, got %d", len(args))
	}
	var s Spec
	if err := json.Unmarshal([]byte(args[0]), &s); err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}
