package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/hashicorp/go-multierror"
	"github.com/nats-io/nats.go"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/internal/httpsrv"
	"github.com/execmesh/execmesh/internal/procfs"
)

// benchShell is the shell of every command in every path (gateway, nodes
// and the bare baselines), so that both sides of a ratio run the same
// program.
const benchShell = "/bin/sh"

// nodeStopTimeout bounds the graceful stop of a node agent: it ends every
// session's process tree (SIGTERM, grace, SIGKILL) before it exits.
const nodeStopTimeout = 45 * time.Second

// cluster is what a benchmark run starts: the daemon as it is deployed
// (`execmesh up` in a process of its own) with node agents joined to it
// as separate `execmesh node` processes, which every section calls; and,
// when exec latency runs, its reference: an embedded NATS server with a
// gateway inside this process served over real HTTP on loopback. close
// undoes all of it.
type cluster struct {
	log     *slog.Logger
	dir     string // temporary root; removed by close
	workdir string // cwd of every command
	env     []string
	bin     string // the execmesh binary, for `execmesh node`

	up *upProc // the deployed daemon: what the sections call (up.base)

	// The in-process reference (startInProcess); nil until started.
	srv  *bus.Server
	nc   *nats.Conn
	gw   *gateway.Gateway
	http *http.Server
	url  string // the in-process gateway's root URL

	mu    sync.Mutex
	nodes []*nodeProc
}

// nodeProc is one running `execmesh node`.
type nodeProc struct {
	name   string
	id     string
	cmd    *exec.Cmd
	done   chan struct{} // closed when the process was waited for
	errMu  sync.Mutex
	stderr strings.Builder // last lines of the agent's log, for errors
}

// startCluster starts the deployed daemon. Nodes are added with addNode
// (joined to it); startInProcess adds the in-process gateway, and
// addInProcessNode nodes paired to that.
func startCluster(ctx context.Context, log *slog.Logger, bin string) (c *cluster, err error) {
	dir, err := os.MkdirTemp("", "execmesh-bench-")
	if err != nil {
		return nil, err
	}
	c = &cluster{log: log, dir: dir, bin: bin}
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err = multierror.Append(err, c.close(cctx)).ErrorOrNil()
			c = nil
		}
	}()
	c.workdir = filepath.Join(dir, "work")
	home := filepath.Join(dir, "home")
	for _, d := range []string{c.workdir, home} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return c, err
		}
	}
	c.env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "SHELL=" + benchShell, "LANG=C"}
	if c.up, err = startDeployed(ctx, c); err != nil {
		return c, err
	}
	return c, nil
}

// startInProcess starts an embedded NATS server and a gateway inside this
// process, served over real HTTP on loopback as the daemon serves it:
// exec latency's reference path. close stops them.
func (c *cluster) startInProcess(ctx context.Context) (err error) {
	c.srv, err = bus.StartServer(ctx, bus.ServerConfig{
		Listen:    "127.0.0.1:-1",
		StoreDir:  filepath.Join(c.dir, "nats"),
		JetStream: true,
	})
	if err != nil {
		return fmt.Errorf("embedded NATS: %w", err)
	}
	c.nc, err = bus.Connect(ctx, bus.ClientConfig{Name: "execmesh-bench-gateway", InProcess: c.srv}, nil)
	if err != nil {
		return fmt.Errorf("NATS connect: %w", err)
	}

	cfg := config.Default()
	cfg.StateDir = filepath.Join(c.dir, "gateway")
	// Commands run without approvals, as on a trusted single-user
	// machine (README): the benchmark measures the exec path itself.
	cfg.Tools.Exec.Security = "full"
	cfg.Tools.Exec.Ask = "off"
	cfg.Gateway.Listen = "127.0.0.1:0"
	c.gw, err = gateway.New(ctx, cfg, gateway.Options{
		Conn:    c.nc,
		Server:  c.srv,
		Cwd:     c.workdir,
		Environ: c.env,
		Getenv:  func(string) string { return "" },
	})
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	c.url = "http://" + ln.Addr().String()
	c.http = httpsrv.New(nil, c.gw.Handler(), slog.NewLogLogger(c.log.Handler(), slog.LevelWarn)) // as the daemon serves it
	go func() {
		if err := c.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			c.log.Error("http server stopped", "err", err)
		}
	}()
	return nil
}

// startDeployed starts `execmesh up` in a directory of the cluster's, on
// free loopback ports, configured as the in-process gateway is (commands
// run without approvals: the benchmark measures the exec path itself).
func startDeployed(ctx context.Context, c *cluster) (*upProc, error) {
	dir := filepath.Join(c.dir, "up")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfg, []byte(`{"tools":{"exec":{"security":"full","ask":"off"}}}`), 0o600); err != nil {
		return nil, err
	}
	u, err := startUp(ctx, c.bin, dir, "--config", cfg)
	if err != nil {
		return nil, err
	}
	// The latency section also calls it under security allowlist, with
	// echo allowlisted.
	echo, err := exec.LookPath("echo")
	if err == nil {
		echo, err = filepath.EvalSymlinks(echo)
	}
	if err == nil {
		approvals := `{"version":1,"agents":{"main":{"allowlist":[{"pattern":"` + echo + `"}]}}}`
		err = os.WriteFile(filepath.Join(u.state, "exec-approvals.json"), []byte(approvals), 0o600)
	}
	if err != nil {
		u.stop()
		return nil, err
	}
	return u, nil
}

var nodeIDLine = regexp.MustCompile(`execmesh node: id (\S+),`)

// addNode pairs a node agent with the deployed daemon as an operator
// does on one machine: `execmesh nodes invite --local` with the daemon's
// state directory (its operator token), then `execmesh node --join CODE`
// in a state directory of its own. It waits until the node runs commands.
func (c *cluster) addNode(ctx context.Context, name string) (*nodeProc, error) {
	inv := exec.CommandContext(ctx, c.bin, "nodes", "invite", "--local", "--name", name, "--gateway", c.up.base, "--state-dir", c.up.state)
	inv.Env = c.up.cmd.Env
	out, err := inv.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
		}
		return nil, fmt.Errorf("execmesh nodes invite: %w", err)
	}
	code, err := joinCode(string(out))
	if err != nil {
		return nil, err
	}
	state := filepath.Join(c.dir, "node-"+name)
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, err
	}
	return c.startNode(ctx, name, c.up.base, []string{"--join", code, "--state-dir", state}, nil)
}

// joinCode is the code in what `execmesh nodes invite` prints: one line,
// `execmesh node --join CODE`.
func joinCode(out string) (string, error) {
	line := strings.TrimSpace(out)
	code, ok := strings.CutPrefix(line, "execmesh node --join ")
	if !ok || code == "" || strings.ContainsAny(code, " \t\n") {
		return "", fmt.Errorf("execmesh nodes invite printed %q, want `execmesh node --join CODE`", line)
	}
	return code, nil
}

// addInProcessNode starts `execmesh node` connected to the embedded NATS
// server, approves it on the in-process gateway and waits until it runs
// commands.
func (c *cluster) addInProcessNode(ctx context.Context, name string) (*nodeProc, error) {
	state := filepath.Join(c.dir, "node-"+name)
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, err
	}
	return c.startNode(ctx, name, c.url, []string{"--nats-url", c.srv.ClientURL(), "--state-dir", state}, c.gw.ApproveNode)
}

// startNode starts `execmesh node` named name with the connection
// arguments connect, passes its id to approve (nil: it pairs itself, as a
// joining node does) and waits until the gateway at gatewayURL runs
// commands on it.
func (c *cluster) startNode(ctx context.Context, name, gatewayURL string, connect []string, approve func(id string) error) (*nodeProc, error) {
	args := append([]string{"node", "--name", name, "--workdir", c.workdir, "--log-level", "warn"}, connect...)
	cmd := exec.Command(c.bin, args...)
	cmd.Env = c.env
	cmd.Dir = c.workdir
	// Its own process group: a Ctrl-C at the terminal reaches only the
	// benchmark, which then stops the agent in order. Pdeathsig is a
	// backstop for a benchmark that dies without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	n := &nodeProc{name: name, cmd: cmd, done: make(chan struct{})}
	cmd.Stderr = &tailWriter{n: n}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s node: %w", c.bin, err)
	}
	c.mu.Lock()
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()
	idc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sent := false
		for sc.Scan() {
			if m := nodeIDLine.FindStringSubmatch(sc.Text()); m != nil && !sent {
				idc <- m[1]
				sent = true
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		if !sent {
			close(idc)
		}
	}()
	go func() {
		_ = cmd.Wait()
		close(n.done)
	}()

	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	select {
	case id, ok := <-idc:
		if !ok {
			return nil, fmt.Errorf("node %s exited before printing its id: %s", name, n.log())
		}
		n.id = id
	case <-wctx.Done():
		return nil, fmt.Errorf("node %s: no id printed: %w: %s", name, wctx.Err(), n.log())
	}
	if approve != nil {
		if err := approve(n.id); err != nil {
			return nil, fmt.Errorf("approve node %s: %w", name, err)
		}
	}
	// The node learns of its pairing asynchronously; probe until a
	// command runs there.
	cl := newClient(gatewayURL, 1)
	body := execBody("echo ready", "node", n.id, false)
	var last string
	for {
		r, err := cl.invoke(wctx, body)
		if err == nil && r.status() == "completed" {
			return n, nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = r.describe()
		}
		select {
		case <-wctx.Done():
			return nil, fmt.Errorf("node %s never ran a command: %s; agent log: %s", name, last, n.log())
		case <-n.done:
			return nil, fmt.Errorf("node %s exited: %s", name, n.log())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// pid returns the node agent's process id.
func (n *nodeProc) pid() int { return n.cmd.Process.Pid }

func (n *nodeProc) log() string {
	n.errMu.Lock()
	defer n.errMu.Unlock()
	s := strings.TrimSpace(n.stderr.String())
	if s == "" {
		return "(no log output)"
	}
	return s
}

// stop ends the agent gracefully (SIGTERM: it ends its sessions' process
// trees and drains NATS), then with SIGKILL after nodeStopTimeout.
func (n *nodeProc) stop() error {
	select {
	case <-n.done:
		return nil
	default:
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(nodeStopTimeout)
	defer t.Stop()
	select {
	case <-n.done:
		return nil
	case <-t.C:
		_ = n.cmd.Process.Kill()
		<-n.done
		return fmt.Errorf("node %s did not stop within %v; killed", n.name, nodeStopTimeout)
	}
}

// removeNode stops a node agent and forgets it.
func (c *cluster) removeNode(n *nodeProc) error {
	err := n.stop()
	c.mu.Lock()
	for i, x := range c.nodes {
		if x == n {
			c.nodes = append(c.nodes[:i], c.nodes[i+1:]...)
			break
		}
	}
	c.mu.Unlock()
	return err
}

// tailWriter keeps the last few KB of a node's log.
type tailWriter struct{ n *nodeProc }

func (w *tailWriter) Write(p []byte) (int, error) {
	w.n.errMu.Lock()
	defer w.n.errMu.Unlock()
	w.n.stderr.Write(p)
	if s := w.n.stderr.String(); len(s) > 8192 {
		w.n.stderr.Reset()
		w.n.stderr.WriteString(s[len(s)-4096:])
	}
	return len(p), nil
}

// close stops everything in reverse start order: node agents (which end
// their sessions), the deployed daemon, HTTP, the in-process gateway
// (which ends gateway-host sessions), NATS; then it ends any process
// re-parented to us and removes the temporary directory. It keeps going
// after errors and returns them all.
func (c *cluster) close(ctx context.Context) error {
	var errs *multierror.Error
	c.mu.Lock()
	nodes := c.nodes
	c.nodes = nil
	c.mu.Unlock()
	var wg sync.WaitGroup
	var emu sync.Mutex
	for _, n := range nodes {
		wg.Go(func() {
			if err := n.stop(); err != nil {
				emu.Lock()
				errs = multierror.Append(errs, err)
				emu.Unlock()
			}
		})
	}
	wg.Wait()
	if c.up != nil {
		if err := c.up.stop(); err != nil {
			errs = multierror.Append(errs, err)
		}
	}
	if c.http != nil {
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := c.http.Shutdown(hctx); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("http shutdown: %w", err))
		}
		cancel()
	}
	if c.gw != nil {
		if err := c.gw.Close(ctx); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("gateway: %w", err))
		}
	}
	if c.nc != nil {
		c.nc.Close()
	}
	if c.srv != nil {
		if err := c.srv.Shutdown(ctx); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("nats: %w", err))
		}
	}
	if n := killOrphans(); n > 0 {
		errs = multierror.Append(errs, fmt.Errorf("%d leftover processes had to be killed", n))
	}
	if c.dir != "" {
		if err := os.RemoveAll(c.dir); err != nil {
			errs = multierror.Append(errs, err)
		}
	}
	return errs.ErrorOrNil()
}

// killStrays kills and reaps children of this process that are neither
// the deployed daemon, a running node agent nor a session of the
// in-process gateway: commands of a node agent that was killed,
// re-parented here (when that gateway's session core made this process a
// child subreaper). It returns how many there were.
func (c *cluster) killStrays() int {
	keep := map[int]bool{}
	if c.up != nil {
		keep[c.up.cmd.Process.Pid] = true
	}
	c.mu.Lock()
	for _, n := range c.nodes {
		keep[n.pid()] = true
	}
	c.mu.Unlock()
	if c.gw != nil {
		for _, b := range c.gw.Blockers() {
			keep[b.PID] = true
		}
	}
	n := 0
	for _, pid := range procfs.Children() {
		if keep[pid] {
			continue
		}
		if _, state, ok := procStart(pid); ok && state != 'Z' {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			n++
		}
		// Nobody else waits for an orphan, so this returns once it died
		// (ECHILD if the session core's reaper took it first).
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, 0, nil)
	}
	return n
}

// killOrphans kills and reaps every remaining child of this process. The
// session core makes the process a child subreaper, so a command whose
// node agent died is re-parented here; by the time close calls this, every
// agent and the gateway have stopped, so any child left is a leftover.
func killOrphans() int {
	n := 0
	for _, pid := range procfs.Children() {
		if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
			n++
		}
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, 0, nil)
	}
	return n
}
