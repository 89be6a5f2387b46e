package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/execmesh/execmesh/config"
	"github.com/execmesh/execmesh/internal/hostid"
	"github.com/execmesh/execmesh/protocol"
)

// reloadTimeout bounds the reload `config set` asks of a daemon: a daemon
// that does not answer in time is told nothing, and the note says so.
const reloadTimeout = 10 * time.Second

// reloadAnswer is the answer of POST /v1/admin/reload.
type reloadAnswer struct {
	OK         bool   `json:"ok"`
	ConfigPath string `json:"configPath"`
	HostID     string `json:"hostId"`
}

// newReloadCmd is `execmesh reload`: the running daemon re-reads its
// configuration, as on SIGHUP.
func (c *cli) newReloadCmd() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{
		Use:   "reload",
		Short: "make the running daemon re-read its configuration file, as SIGHUP does",
		Long: "Ask the daemon at the gateway URL to re-read its configuration file (POST /v1/admin/reload,\n" +
			"an operator call), as SIGHUP does: without signalling a process, from any machine that holds\n" +
			"the operator token. Sessions are kept; listen addresses, the state dir and NATS settings\n" +
			"need a restart. A configuration the daemon refuses leaves the old one in force, and\n" +
			"execmesh exits 1 with the reason. `execmesh config set` reloads by itself.",
		Example: "  execmesh reload\n  execmesh reload --gateway http://gw:8420 --operator-token \"$OP\"",
		Args:    noArgs,
		RunE: f.run(c, func(ctx context.Context, cl *client, _ []string) error {
			data, ans, err := reloadDaemon(ctx, cl)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(c.stdout, data)
			}
			fmt.Fprintf(c.stdout, "the daemon at %s reloaded %s\n", cl.base, orDash(ans.ConfigPath, "its configuration"))
			return nil
		}),
	}
	f.register(cmd.Flags(), withJSON|withOperator)
	return cmd
}

// reloadDaemon asks the daemon to reload its configuration.
func reloadDaemon(ctx context.Context, cl *client) ([]byte, reloadAnswer, error) {
	var ans reloadAnswer
	data, err := cl.apiJSON(ctx, http.MethodPost, "/v1/admin/reload", nil, struct{}{}, &ans)
	return data, ans, err
}

// applyConfig applies the configuration file that `config set` or
// `unset` just wrote to the daemon that answers at the gateway URL, when
// that daemon reads this very file, and says plainly on stderr what
// happened: applied, refused (an error: the file is written but the old
// configuration stays in force), or not applied and when it will be.
func (c *cli) applyConfig(ctx context.Context, f *configFlags, file, key string) error {
	later := "it applies when the daemon reads the file: at its start, on SIGHUP or with execmesh reload"
	cfg, err := config.Load(file, c.env)
	if err != nil {
		// set validated the file; an EXECMESH_* variable is bad.
		fmt.Fprintf(c.stderr, "execmesh: not applied to a running daemon (%v); %s\n", err, later)
		return nil
	}
	cf := clientFlags{configFlags: *f}
	cl, err := cf.clientFor(c, cfg)
	if err != nil {
		fmt.Fprintf(c.stderr, "execmesh: not applied to a running daemon (%v); %s\n", err, later)
		return nil
	}
	defer cl.close()
	ctx, cancel := context.WithTimeout(ctx, reloadTimeout)
	defer cancel()
	_, ans, err := reloadDaemon(ctx, cl)
	var ue *unreachableError
	var pe *protocol.Error
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(c.stderr, "execmesh: no daemon answers at %s; %s\n", cl.base, later)
		return nil
	case errors.As(err, &pe) && pe.Type == protocol.ErrInvalidRequest:
		return fmt.Errorf("%s is written, but the daemon at %s refused it and keeps its old configuration: %s", file, cl.base, pe.Message)
	case err != nil:
		fmt.Fprintf(c.stderr, "execmesh: not applied to the daemon at %s (%v); %s\n", cl.base, err, later)
		return nil
	}
	if !sameConfigFile(ans, file) {
		fmt.Fprintf(c.stderr, "execmesh: the daemon at %s reads %s, not %s: not applied there\n", cl.base, orDash(ans.ConfigPath, "another file"), file)
		return nil
	}
	if k := restartOnlyKey(key); k != "" {
		fmt.Fprintf(c.stderr, "execmesh: the daemon at %s reloaded the file, but %s takes effect only when it restarts\n", cl.base, k)
		return nil
	}
	fmt.Fprintf(c.stderr, "execmesh: applied to the running daemon at %s\n", cl.base)
	return nil
}

// restartOnlyKeys are the keys a reload reads but does not apply: the
// addresses, state dir and bus a daemon started with, and the session
// core's settings, fixed when it starts.
var restartOnlyKeys = []string{
	"gateway.listen", "stateDir", "nats",
	"tools.exec.cleanupMs", "tools.exec.killGraceMs", "tools.exec.notifyOnExit",
	"tools.exec.notifyOnExitEmptySuccess", "tools.exec.containment",
}

// restartOnlyKey returns the key of restartOnlyKeys that key is or lies
// beneath, or "".
func restartOnlyKey(key string) string {
	for _, k := range restartOnlyKeys {
		if key == k || strings.HasPrefix(key, k+".") || strings.HasPrefix(key, k+"[") {
			return k
		}
	}
	return ""
}

// sameConfigFile reports whether the daemon's configuration file is file:
// the daemon sees this machine's file system (the same hostId) and the
// two paths name one file.
func sameConfigFile(ans reloadAnswer, file string) bool {
	mine, err := hostid.ID()
	if err != nil || ans.HostID != mine || ans.ConfigPath == "" {
		return false
	}
	a, err := os.Stat(ans.ConfigPath)
	if err != nil {
		return false
	}
	b, err := os.Stat(file)
	return err == nil && os.SameFile(a, b)
}
