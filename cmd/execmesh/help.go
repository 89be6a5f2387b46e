package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// annSynopsis is the annotation that holds a top-level command's synopsis
// lines for the top-level help (one per line; default: its Use).
const annSynopsis = "execmesh/synopsis"

// setRootUsage gives the root command its own usage text: every command
// with its synopsis (subcommands included, so that `nodes approvals get|set`
// shows at the top level), grouped, then the flags every client command
// takes. Other commands keep cobra's usage text.
func setRootUsage(root *cobra.Command, order []*cobra.Command) {
	defaultUsage := root.UsageFunc()
	root.SetUsageFunc(func(cmd *cobra.Command) error {
		if cmd != root {
			return defaultUsage(cmd)
		}
		w := cmd.OutOrStderr()
		fmt.Fprintln(w, "Usage: execmesh COMMAND [ARGS] [FLAGS]")
		// The commands in the order they were added (cobra sorts its own
		// list), then those cobra adds itself (help, completion).
		all := slices.Clone(order)
		for _, sub := range root.Commands() {
			if !slices.Contains(all, sub) {
				all = append(all, sub)
			}
		}
		for _, g := range root.Groups() {
			fmt.Fprintf(w, "\n%s\n", g.Title)
			for _, sub := range all {
				if sub.GroupID != g.ID || !sub.IsAvailableCommand() && sub.Name() != "help" {
					continue
				}
				printSynopsis(w, sub)
			}
		}
		fmt.Fprint(w, `
Client flags: --gateway URL ($EXECMESH_GATEWAY_URL, else http://<gateway.listen>),
  --token T ($EXECMESH_GATEWAY_TOKEN, else gateway.auth.token), --config FILE,
  --state-dir DIR ($EXECMESH_STATE_DIR, else ~/.execmesh); where they apply:
  --session-key K (default agent:main:main), --json (the raw JSON answer) and
  --operator-token T for operator calls ($EXECMESH_OPERATOR_TOKEN, else
  <state-dir>/operator.token).

Run "execmesh COMMAND --help" for a command's flags and examples.
`)
		return nil
	})
}

// printSynopsis prints a top-level command's synopsis lines and summary.
func printSynopsis(w io.Writer, cmd *cobra.Command) {
	syn := cmd.Annotations[annSynopsis]
	switch {
	case syn != "":
	case cmd.Name() == "completion": // cobra's own command
		syn = "completion bash|zsh|fish|powershell"
	default:
		syn = cmd.Use
	}
	for line := range strings.SplitSeq(syn, "\n") {
		fmt.Fprintf(w, "  %s\n", line)
	}
	fmt.Fprintf(w, "      %s\n", cmd.Short)
}

// version is the release version; release builds set it with
// -ldflags "-X main.version=v1.2.3". Empty means the module version from
// the build information (a pseudo-version for builds from a git checkout).
var version = ""

// versionInfo is what `execmesh version` reports, from the build
// information the Go toolchain embeds (runtime/debug.ReadBuildInfo).
type versionInfo struct {
	Version   string `json:"version"`
	Module    string `json:"module,omitempty"`
	Revision  string `json:"revision,omitempty"`
	Time      string `json:"time,omitempty"`
	Modified  bool   `json:"modified"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// buildVersion reads the build information of the running binary.
func buildVersion() versionInfo {
	bi, _ := debug.ReadBuildInfo()
	return versionFrom(bi, version)
}

// versionFrom builds a versionInfo from build information (nil when the
// binary has none) and the -ldflags override.
func versionFrom(bi *debug.BuildInfo, override string) versionInfo {
	v := versionInfo{Version: override, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi != nil {
		v.Module = bi.Main.Path
		v.GoVersion = bi.GoVersion
		if v.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Revision = s.Value
			case "vcs.time":
				v.Time = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	if v.Version == "" {
		v.Version = "devel"
	}
	return v
}

// semver is the version in SemVer form, as the node agent's NATS micro
// service needs it: without the "v" of a Go module version, and
// 0.0.0-devel for a build without one.
func (v versionInfo) semver() string {
	if v.Version == "devel" {
		return "0.0.0-devel"
	}
	return strings.TrimPrefix(v.Version, "v")
}

// short is the one-line version: "execmesh v1.2.3 (commit 1a2b3c4d5e6f,
// modified, 2026-09-06T10:00:00Z, go1.26.0 linux/amd64)".
func (v versionInfo) short() string {
	var parts []string
	if v.Revision != "" {
		parts = append(parts, "commit "+v.Revision[:min(12, len(v.Revision))])
		if v.Modified {
			parts = append(parts, "modified")
		}
		if v.Time != "" {
			parts = append(parts, v.Time)
		}
	} else {
		parts = append(parts, "no commit recorded")
	}
	parts = append(parts, v.GoVersion+" "+v.Platform)
	return fmt.Sprintf("execmesh %s (%s)", v.Version, strings.Join(parts, ", "))
}

func (c *cli) newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "print the version, the commit it was built from and the Go toolchain",
		Long: "Print the version: the release version or the module version, the VCS revision the binary\n" +
			"was built from (and whether the work tree had changes), and the Go toolchain. The facts come\n" +
			"from the build information the Go toolchain embeds (go version -m shows the same).",
		Example: "  execmesh version\n  execmesh version --json",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c.noteIgnoredConfig(cmd)
			v := buildVersion()
			if asJSON {
				return writeJSONValue(c.stdout, v)
			}
			fmt.Fprintln(c.stdout, v.short())
			return nil
		},
	}
	registerJSON(cmd.Flags(), &asJSON, "print the version facts as JSON")
	return cmd
}

// newManCmd is the hidden `execmesh man DIR`: writes one man page per
// command (execmesh.1, execmesh-exec.1, …) into DIR. `make man` runs it.
func (c *cli) newManCmd(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:    "man DIR",
		Short:  "write the man pages (section 1) into DIR",
		Hidden: true,
		Args:   exactArgs(1, "want the directory to write the man pages into"),
		RunE: func(_ *cobra.Command, args []string) error {
			dir := args[0]
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			date := time.Now()
			if v := buildVersion(); v.Time != "" {
				// Reproducible pages: the commit's date, not today's.
				if t, err := time.Parse(time.RFC3339, v.Time); err == nil {
					date = t
				}
			}
			hdr := &doc.GenManHeader{Title: "EXECMESH", Section: "1", Date: &date, Source: "execmesh " + buildVersion().Version, Manual: "execmesh manual"}
			root.DisableAutoGenTag = true
			if err := doc.GenManTree(root, hdr, dir); err != nil {
				return fmt.Errorf("man pages: %w", err)
			}
			fmt.Fprintf(c.stdout, "man pages written to %s (install: sudo install -m 644 %s/*.1 /usr/local/share/man/man1/ && sudo mandb)\n", dir, filepath.Clean(dir))
			return nil
		},
	}
}

// noArgs refuses positional arguments as a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("%s: unexpected arguments %q", cmd.CommandPath(), args)
	}
	return nil
}

// exactArgs wants n positional arguments; why explains what they are.
func exactArgs(n int, why string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageErrorf("%s: %s", cmd.CommandPath(), why)
		}
		return nil
	}
}

// rangeArgs wants between lo and hi positional arguments.
func rangeArgs(lo, hi int, why string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < lo || len(args) > hi {
			return usageErrorf("%s: %s", cmd.CommandPath(), why)
		}
		return nil
	}
}

// groupCmd is a command that only holds subcommands (nodes, approvals, …):
// without one, or with an unknown one, it is a usage error that lists them.
func groupCmd(cmd *cobra.Command) *cobra.Command {
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		var names []string
		for _, sub := range cmd.Commands() {
			if sub.IsAvailableCommand() {
				names = append(names, sub.Name())
			}
		}
		if len(args) == 0 {
			return usageErrorf("%s: want a subcommand: %s", cmd.CommandPath(), strings.Join(names, ", "))
		}
		return usageErrorf("%s: unknown subcommand %q (want %s)", cmd.CommandPath(), args[0], strings.Join(names, ", "))
	}
	return cmd
}
