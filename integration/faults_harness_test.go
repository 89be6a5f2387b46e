package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/internal/cgroup"
	"github.com/execmesh/execmesh/protocol"
)

// This file is the harness of the fault tests (faults_*_test.go, issue
// 17): real processes — `execmesh up`, `execmesh gateway`, `execmesh node`
// and the official nats-server — that the tests kill, freeze and starve,
// and a tally of the system events they deliver (expected, delivered,
// duplicated). A process can run inside a network namespace of
// cluster_netns_harness_test.go or a private mount namespace (fltMountNS),
// so no fault touches the machine's own network or mounts.

// fltProc is one daemon process; its stdout and stderr go to a log file
// kept over restarts.
type fltProc struct {
	t      *testing.T
	name   string
	prefix []string // put in front of argv: ip netns exec NS, nsenter …
	argv   []string
	env    []string
	dir    string
	log    string
	cmd    *exec.Cmd
	done   chan struct{}
	err    error
	pids   []int // of every run, for cleanup
}

func newFltProc(t *testing.T, name, dir string, prefix, env []string, argv ...string) *fltProc {
	t.Helper()
	p := &fltProc{t: t, name: name, prefix: prefix, argv: argv, env: env, dir: dir, log: filepath.Join(t.TempDir(), name+".log")}
	t.Cleanup(p.cleanup)
	return p
}

// start runs the process (again after a kill or a stop).
func (p *fltProc) start() {
	p.t.Helper()
	f, err := os.OpenFile(p.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		p.t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprintf(f, "=== start %s\n", time.Now().Format(time.RFC3339Nano))
	argv := append(append([]string{}, p.prefix...), p.argv...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = p.dir, p.env
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("start %s: %v", p.name, err)
	}
	p.cmd, p.done, p.err = cmd, make(chan struct{}), nil
	p.pids = append(p.pids, cmd.Process.Pid)
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
}

func (p *fltProc) running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *fltProc) pid() int { return p.cmd.Process.Pid }

// signal sends sig (the prefixes exec the daemon: same pid).
func (p *fltProc) signal(sig syscall.Signal) {
	p.t.Helper()
	if p.running() {
		if err := p.cmd.Process.Signal(sig); err != nil {
			p.t.Fatalf("%s: %v: %v", p.name, sig, err)
		}
	}
}

// kill sends SIGKILL and waits.
func (p *fltProc) kill() {
	p.t.Helper()
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.t.Fatalf("%s did not die on SIGKILL", p.name)
	}
}

// stop sends SIGTERM (after SIGCONT, should it be stopped) and waits,
// SIGKILL after 40 s.
func (p *fltProc) stop() error {
	if !p.running() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(40 * time.Second):
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	return fmt.Errorf("%s did not stop on SIGTERM", p.name)
}

// runLog returns the log of the current (or last) run.
func (p *fltProc) runLog() string {
	b, _ := os.ReadFile(p.log)
	s := string(b)
	if i := strings.LastIndex(s, "=== start "); i >= 0 {
		s = s[i:]
	}
	return s
}

func (p *fltProc) cleanup() {
	if err := p.stop(); err != nil {
		p.t.Logf("%s: %v", p.name, err)
	}
	endKilledRuns(p.t, p.pids)
	if p.t.Failed() || os.Getenv("FLT_LOG") != "" {
		b, _ := os.ReadFile(p.log)
		if len(b) > 8000 && os.Getenv("FLT_FULL_LOG") == "" {
			b = append([]byte("…"), b[len(b)-8000:]...)
		}
		p.t.Logf("--- %s log:\n%s", p.name, b)
	}
}

// endKilledRuns ends the sessions that runs of a daemon killed with
// SIGKILL left running: by design they outlive their daemon until its
// next run on the same state dir ends them, which a test that kills a
// daemon for good never starts. A run's sessions are in its cgroup,
// execmesh-<pid>-<tag> below the test's own (a run that stopped removed
// its own); without cgroups there is nothing to do here.
func endKilledRuns(t *testing.T, pids []int) {
	self, err := cgroup.Self()
	if err != nil {
		return
	}
	ents, err := os.ReadDir(self.Path)
	if err != nil {
		return
	}
	for _, pid := range pids {
		prefix := "execmesh-" + strconv.Itoa(pid) + "-"
		for _, e := range ents {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) {
				continue
			}
			d := self.Child(e.Name())
			if populated, err := d.Populated(); err == nil && populated {
				if err := d.Kill(); err != nil {
					t.Logf("end the sessions a killed run left in %s: %v", d.Path, err)
				}
			}
		}
	}
}

// fltKey is an nkey user identity in a seed file.
type fltKey struct {
	SeedFile  string
	PublicKey string
}

// newFltKey makes a user key in dir/name.nkey.
func newFltKey(t *testing.T, dir, name string) fltKey {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	path := filepath.Join(dir, name+".nkey")
	if err := os.WriteFile(path, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return fltKey{SeedFile: path, PublicKey: pub}
}

// fltNATS is an external nats-server (the official binary) with
// JetStream, admitting the given nkey users with every permission.
type fltNATS struct {
	t     *testing.T
	proc  *fltProc
	addr  string // host:port
	store string
	ns    string // network namespace, "" for the test's own
	admin fltKey
}

// startFltNATS starts a server in network namespace ns ("" = none),
// listening on listen (host:port).
func startFltNATS(t *testing.T, ns, listen string, users ...string) *fltNATS {
	t.Helper()
	bin, err := clNATSServerBinary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := &fltNATS{t: t, addr: listen, store: filepath.Join(dir, "jetstream"), ns: ns}
	s.admin = newFltKey(t, dir, "admin")
	var conf strings.Builder
	fmt.Fprintf(&conf, "server_name: flt-nats\nlisten: %q\njetstream { store_dir: %q }\nauthorization {\n  timeout: 3\n  users = [\n", listen, s.store)
	for _, u := range append([]string{s.admin.PublicKey}, users...) {
		fmt.Fprintf(&conf, "    { nkey: %q }\n", u)
	}
	conf.WriteString("  ]\n}\n")
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, []byte(conf.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	var prefix []string
	if ns != "" {
		prefix = []string{"ip", "netns", "exec", ns}
	}
	s.proc = newFltProc(t, "nats-server", dir, prefix, []string{"PATH=/usr/bin:/bin"}, bin, "-c", path)
	s.start()
	return s
}

func (s *fltNATS) url() string { return "nats://" + s.addr }

// start (re)starts the server and waits until JetStream answers.
func (s *fltNATS) start() {
	s.t.Helper()
	s.proc.start()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := func() error {
			nc, err := s.connect(2 * time.Second)
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := nc.JetStream()
			if err != nil {
				return err
			}
			_, err = js.AccountInfo()
			return err
		}()
		if err == nil {
			return
		}
		if !s.proc.running() || time.Now().After(deadline) {
			s.t.Fatalf("nats-server not ready: %v\n%s", err, s.proc.runLog())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// connect opens an admin connection that gives up rather than retries.
func (s *fltNATS) connect(timeout time.Duration) (*nats.Conn, error) {
	o, err := nats.NkeyOptionFromSeed(s.admin.SeedFile)
	if err != nil {
		return nil, err
	}
	opts := []nats.Option{o, nats.Timeout(timeout), nats.Name("fault test"), nats.NoReconnect()}
	if s.ns != "" {
		opts = append(opts, nats.SetCustomDialer(clNSDialer{ns: s.ns}))
	}
	return nats.Connect(s.url(), opts...)
}

// fltDaemon is `execmesh up` or `execmesh gateway` as a process.
type fltDaemon struct {
	t        *testing.T
	mode     string
	proc     *fltProc
	stateDir string
	url      string
	token    string // the tool token
	opToken  string // the operator token
	http     *http.Client
}

// fltDaemonOpts say how a daemon is run.
type fltDaemonOpts struct {
	// StateDir; "" makes one.
	StateDir string
	// Listen is the HTTP address; "" picks a free loopback port.
	Listen string
	// NATSURL names an external server, with NKeySeedFile its key; ""
	// runs the embedded server on NATSListen (a free loopback port when
	// empty), the same over restarts.
	NATSURL      string
	NKeySeedFile string
	NATSListen   string
	// Config is merged over the tests' base configuration (security full,
	// ask off, a grace of one second).
	Config map[string]any
	// Prefix runs the daemon inside a namespace.
	Prefix []string
	Env    []string
	// HTTP is the client that reaches Listen; nil = a plain one.
	HTTP *http.Client
}

// newFltDaemon prepares a daemon of mode (up or gateway) and starts it.
func newFltDaemon(t *testing.T, mode string, o fltDaemonOpts) *fltDaemon {
	t.Helper()
	bin, err := execmeshBinary()
	if err != nil {
		t.Fatal(err)
	}
	if o.StateDir == "" {
		o.StateDir = filepath.Join(t.TempDir(), "state")
		if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if o.Listen == "" {
		o.Listen = freeAddr(t)
	}
	cfg := map[string]any{"tools": map[string]any{"exec": map[string]any{"security": "full", "ask": "off", "killGraceMs": 1000}}}
	fltMerge(cfg, o.Config)
	if o.NATSURL != "" {
		fltMerge(cfg, map[string]any{"nats": map[string]any{"nkeySeedFile": o.NKeySeedFile}})
	}
	cfgPath := filepath.Join(filepath.Dir(o.StateDir), filepath.Base(o.StateDir)+"-config.json")
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	d := &fltDaemon{t: t, mode: mode, stateDir: o.StateDir, url: "http://" + o.Listen, token: randomToken(), opToken: randomToken(), http: o.HTTP}
	if d.http == nil {
		d.http = &http.Client{Timeout: 90 * time.Second}
	}
	args := []string{bin, mode, "--state-dir", o.StateDir, "--config", cfgPath, "--listen", o.Listen, "--token", d.token, "--log-level", "debug"}
	if o.NATSURL != "" {
		args = append(args, "--nats-url", o.NATSURL)
	} else {
		if o.NATSListen == "" {
			o.NATSListen = freeAddr(t)
		}
		args = append(args, "--nats-listen", o.NATSListen)
	}
	env := append([]string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + filepath.Dir(o.StateDir), "SHELL=/bin/sh", "LANG=C",
		"EXECMESH_OPERATOR_TOKEN=" + d.opToken}, o.Env...)
	d.proc = newFltProc(t, "execmesh-"+mode, filepath.Dir(o.StateDir), o.Prefix, env, args...)
	d.start()
	return d
}

// fltMerge merges src into dst, recursively for objects.
func fltMerge(dst, src map[string]any) {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				fltMerge(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

// start (re)starts the daemon and waits for /healthz.
func (d *fltDaemon) start() {
	d.t.Helper()
	d.http.CloseIdleConnections()
	d.proc.start()
	d.waitHealthy(60 * time.Second)
}

// waitHealthy waits until /healthz answers 200.
func (d *fltDaemon) waitHealthy(total time.Duration) {
	d.t.Helper()
	deadline := time.Now().Add(total)
	for {
		st, body := d.healthz()
		if st == 200 {
			return
		}
		if !d.proc.running() {
			d.t.Fatalf("%s exited: %v\n%s", d.proc.name, d.proc.err, d.proc.runLog())
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("%s not healthy after %s: %d %s", d.proc.name, total, st, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// healthz returns GET /healthz's status and body (0 and the error when
// it does not answer within 10 s).
func (d *fltDaemon) healthz() (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", d.url+"/healthz", nil)
	res, err := d.http.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(bytes.TrimSpace(b))
}

// do sends a request with the tool token (the operator's for node
// decisions); a transport error is status 0.
func (d *fltDaemon) do(method, path string, body any) (int, []byte) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, d.url+path, rd)
	if err != nil {
		d.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	tok := d.token
	if isOperatorPath(method, path) {
		tok = d.opToken
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := d.http.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	return res.StatusCode, raw
}

// fltResp is a decoded tool answer, with how long it took.
type fltResp struct {
	clResp
	Took time.Duration
}

// call invokes a tool under sessionKey.
func (d *fltDaemon) call(sessionKey, tool string, args map[string]any) fltResp {
	start := time.Now()
	st, raw := d.do("POST", "/tools/invoke", map[string]any{"tool": tool, "args": args, "sessionKey": sessionKey})
	r := fltResp{clResp: clResp{Status: st, Raw: raw}, Took: time.Since(start)}
	if len(raw) > 0 && raw[0] == '{' {
		_ = json.Unmarshal(raw, &r.clResp)
	}
	return r
}

// mustCall invokes a tool and fails unless the answer is a 200 result.
func (d *fltDaemon) mustCall(sessionKey, tool string, args map[string]any) protocol.Result {
	d.t.Helper()
	r := d.call(sessionKey, tool, args)
	if r.Status != 200 || r.Result == nil {
		d.t.Fatalf("%s %v: %d %s", tool, args, r.Status, r.Raw)
	}
	return *r.Result
}

// background starts command in the background and returns its session
// id; host is "gateway" or "node".
func (d *fltDaemon) background(sessionKey, host, command string) string {
	d.t.Helper()
	args := map[string]any{"command": command, "background": true, "host": host}
	var r fltResp
	deadline := time.Now().Add(30 * time.Second)
	for {
		r = d.call(sessionKey, "exec", args)
		// A node that missed heartbeats on a loaded machine is
		// unreachable for a moment: nothing was started, retry.
		if r.Error == nil || !r.Error.Retryable || !strings.Contains(r.Error.Message, "nothing was started") || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if r.Status != 200 || r.Result == nil || r.Result.SessionID() == "" {
		d.t.Fatalf("background %q on %s: %d %s", command, host, r.Status, r.Raw)
	}
	return r.Result.SessionID()
}

// events takes the queued events of sessionKey (a long poll of wait);
// ack, when set, confirms exactly up to that id. It returns the status
// too: a retryable 503 (the store is failing) is not a test failure.
func (d *fltDaemon) events(sessionKey string, wait time.Duration, ack string) ([]protocol.SystemEvent, int, []byte) {
	d.t.Helper()
	path := fmt.Sprintf("/v1/events?sessionKey=%s&waitMs=%d", sessionKey, wait.Milliseconds())
	if ack != "" {
		path += "&ack=" + ack
	}
	st, raw := d.do("GET", path, nil)
	if st != 200 {
		return nil, st, raw
	}
	var out struct {
		Events []protocol.SystemEvent `json:"events"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		d.t.Fatalf("events: %v: %s", err, raw)
	}
	return out.Events, st, raw
}

// nodes returns GET /v1/nodes as raw maps (the fields both the old and
// the new gateways have).
func (d *fltDaemon) nodes() []map[string]any {
	d.t.Helper()
	st, raw := d.do("GET", "/v1/nodes", nil)
	if st != 200 {
		d.t.Fatalf("GET /v1/nodes: %d %s", st, raw)
	}
	var out struct {
		Nodes []map[string]any `json:"nodes"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		d.t.Fatal(err)
	}
	return out.Nodes
}

// nodeStatus returns node id's status ("" when not listed).
func (d *fltDaemon) nodeStatus(id string) string {
	for _, n := range d.nodes() {
		if n["id"] == id {
			s, _ := n["status"].(string)
			return s
		}
	}
	return ""
}

// waitNode waits until node id has status.
func (d *fltDaemon) waitNode(id, status string, total time.Duration) {
	d.t.Helper()
	clCheckFor(d.t, "node "+id+" "+status, total, 100*time.Millisecond, func() error {
		if s := d.nodeStatus(id); s != status {
			return fmt.Errorf("status %q", s)
		}
		return nil
	})
}

// pair waits for node id to announce itself, approves it and waits
// until it is connected and paired.
func (d *fltDaemon) pair(id string) {
	d.t.Helper()
	d.waitNode(id, "connected", 60*time.Second)
	if st, raw := d.do("POST", "/v1/nodes/"+id+"/approve", nil); st != 200 {
		d.t.Fatalf("approve %s: %d %s", id, st, raw)
	}
	clCheckFor(d.t, "node "+id+" paired", 30*time.Second, 100*time.Millisecond, func() error {
		for _, n := range d.nodes() {
			if n["id"] == id && n["status"] == "connected" && n["pairing"] == "paired" {
				return nil
			}
		}
		return fmt.Errorf("not paired yet")
	})
}

// fltNode is an `execmesh node` process whose key is made up front.
type fltNode struct {
	id, publicKey, dir string
	proc               *fltProc
}

// newFltNode prepares (does not start) a node agent on natsURL.
func newFltNode(t *testing.T, name, natsURL string, heartbeat time.Duration, prefix []string) *fltNode {
	t.Helper()
	bin, err := execmeshBinary()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), name)
	id, err := bus.LoadOrCreateNodeIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := &fltNode{id: id.NodeID, publicKey: id.PublicKey, dir: dir}
	n.proc = newFltProc(t, "node-"+name, dir, prefix,
		[]string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir, "SHELL=/bin/sh", "LANG=C"},
		bin, "node", "--state-dir", dir, "--nats-url", natsURL, "--name", name, "--heartbeat", heartbeat.String(), "--log-level", "debug")
	return n
}

// fltTally counts the events of one kind per session: expected,
// delivered (sessions with at least one), duplicated (copies beyond the
// first), and what came for sessions nobody expected.
type fltTally struct {
	Kinds      []string
	Expected   int
	Delivered  int
	Duplicated int
	Missing    []string
	Unexpected []string
	ByID       map[string][]protocol.SystemEvent
	All        []protocol.SystemEvent
}

func (c fltTally) String() string {
	return fmt.Sprintf("%s events: expected %d, delivered %d, duplicated %d, missing %d %v, unexpected %d %v",
		strings.Join(c.Kinds, "/"), c.Expected, c.Delivered, c.Duplicated, len(c.Missing), c.Missing, len(c.Unexpected), c.Unexpected)
}

// exact fails the test unless every expected session had exactly one
// event and no other came.
func (c fltTally) exact(t *testing.T, what string) {
	t.Helper()
	t.Logf("%s: %s", what, c)
	if c.Delivered != c.Expected || c.Duplicated != 0 || len(c.Unexpected) != 0 {
		t.Errorf("%s: not exactly once: %s", what, c)
	}
}

// tally reads the events of sessionKey until each of ids had one of the
// kinds (or total passed), then listens settle longer for duplicates.
func (d *fltDaemon) tally(sessionKey string, ids []string, total, settle time.Duration, kinds ...string) fltTally {
	d.t.Helper()
	c := fltTally{Kinds: kinds, Expected: len(ids), ByID: map[string][]protocol.SystemEvent{}}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	record := func(evs []protocol.SystemEvent) {
		for _, ev := range evs {
			c.All = append(c.All, ev)
			if !slices.Contains(kinds, ev.Kind) {
				continue
			}
			id := strings.TrimPrefix(ev.ContextKey, "exec:")
			c.ByID[id] = append(c.ByID[id], ev)
		}
	}
	missing := func() int {
		n := 0
		for id := range want {
			if len(c.ByID[id]) == 0 {
				n++
			}
		}
		return n
	}
	read := func(wait time.Duration) {
		evs, st, raw := d.events(sessionKey, wait, "")
		switch {
		case st == 200:
			record(evs)
		case st == http.StatusServiceUnavailable || st == 0:
			d.t.Logf("events: %d %s", st, raw)
			time.Sleep(500 * time.Millisecond)
		default:
			d.t.Fatalf("events: %d %s", st, raw)
		}
	}
	deadline := time.Now().Add(total)
	for missing() > 0 && time.Now().Before(deadline) {
		read(time.Second)
	}
	for end := time.Now().Add(settle); time.Now().Before(end); {
		read(min(time.Second, time.Until(end)+time.Millisecond))
	}
	for id, evs := range c.ByID {
		if !want[id] {
			c.Unexpected = append(c.Unexpected, id)
			continue
		}
		c.Delivered++
		c.Duplicated += len(evs) - 1
	}
	for id := range want {
		if len(c.ByID[id]) == 0 {
			c.Missing = append(c.Missing, id)
		}
	}
	return c
}

// fltCountMarker counts the live processes whose command line contains
// marker (zombies excluded).
func fltCountMarker(marker string) int { return len(processesWith(marker)) }

// fltMarker is a number no other process of the machine has in its
// command line (a sleep argument).
func fltMarker() string {
	return fmt.Sprintf("%d", 7000000+time.Now().UnixNano()%1000000)
}

// fltRoot skips the test, loudly, unless it runs as root.
func fltRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		msg := "SKIPPING FAULT TEST: " + why + " needs root (CI runs as root)"
		t.Log(strings.Repeat("!", 72))
		t.Log(msg)
		t.Log(strings.Repeat("!", 72))
		t.Skip(msg)
	}
}
