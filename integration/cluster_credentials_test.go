package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/internal/testutil"
	"github.com/execmesh/execmesh/protocol"
)

// TestClusterCredentialsNodeAgent: what `execmesh nodes credentials`
// makes is all a NATS server of deploy/'s shape needs. A server whose
// users are the shipped auth.conf, with the gateway's key and the node's
// printed entry put in as deploy/README.md says (step 4's sed), admits
// the real node agent (`execmesh node`, the key found in its
// --state-dir), which heart-beats and serves its micro endpoints there,
// and that key is confined to its own subjects: a publish outside them
// is refused. A key whose entry was not added is refused outright.
func TestClusterCredentialsNodeAgent(t *testing.T) {
	tmp := t.TempDir()
	gw := clCredentials(t, filepath.Join(tmp, "gw"), true)
	node := clCredentials(t, filepath.Join(tmp, "build-1"), false)
	stranger := clCredentials(t, filepath.Join(tmp, "stranger"), false) // its entry is not added

	auth := clRender(t, "nats/cluster/auth.conf", filepath.Join(tmp, "auth.conf"), 0o600,
		"REPLACE_WITH_GATEWAY_NKEY", gw.PublicKey)
	if out, err := exec.Command("sed", "-i", clNodeEntrySed+filepath.Join(node.Dir, "node-user.conf"), auth).CombinedOutput(); err != nil {
		t.Fatalf("sed (deploy/README.md step 4): %v: %s", err, out)
	}
	conf := filepath.Join(tmp, "nats.conf")
	body := fmt.Sprintf("listen: 127.0.0.1:-1\nserver_name: creds\njetstream { store_dir: %q }\ninclude \"auth.conf\"\n", filepath.Join(tmp, "js"))
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("auth.conf with the printed entries does not load: %v", err)
	}
	opts.NoSigs = true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	go s.Start()
	if !s.ReadyForConnections(20 * time.Second) {
		t.Fatal("nats-server not ready for connections")
	}
	url := s.ClientURL()
	subj := protocol.Subjects(bus.DefaultPrefix)

	// The gateway's identity creates what a gateway creates, and watches
	// for the node.
	gnc := clConnect(t, bus.ClientConfig{URLs: []string{url}, NKeySeedFile: gw.SeedFile, Name: "gateway"})
	js, err := jetstream.New(gnc)
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(clCtx(t, 30*time.Second), js, bus.DefaultPrefix, 1); err != nil {
		t.Fatalf("the gateway's entry does not allow creating its streams: %v", err)
	}
	beats, err := gnc.SubscribeSync(subj.PresenceOf(node.NodeID))
	if err != nil {
		t.Fatal(err)
	}
	if err := gnc.Flush(); err != nil {
		t.Fatal(err)
	}

	bin, err := execmeshBinary()
	if err != nil {
		t.Fatal(err)
	}
	agent := exec.Command(bin, "node", "--nats-url", url, "--state-dir", node.Dir, "--name", "build-1", "--heartbeat", "200ms")
	agent.Dir = node.Dir
	agent.Env = cleanEnv(map[string]string{"HOME": tmp})
	log := &testutil.SyncBuffer{}
	agent.Stdout, agent.Stderr = log, log
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- agent.Wait() }()
	t.Cleanup(func() {
		_ = agent.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = agent.Process.Kill()
			<-done
		}
	})
	if _, err := beats.NextMsg(20 * time.Second); err != nil {
		t.Fatalf("no heartbeat from the node agent: %v\n%s", err, log.String())
	}
	ping, err := micro.ControlSubject(micro.PingVerb, bus.NodeServiceName, "")
	if err != nil {
		t.Fatal(err)
	}
	clCheckFor(t, "the node agent's micro service answers", 10*time.Second, 100*time.Millisecond, func() error {
		m, err := gnc.Request(ping, nil, time.Second)
		if err != nil {
			return err
		}
		var p micro.Ping
		if err := json.Unmarshal(m.Data, &p); err != nil || p.Name != bus.NodeServiceName {
			return fmt.Errorf("ping answer %q: %v", m.Data, err)
		}
		return nil
	})

	// The node's key, used outside its subjects.
	var mu sync.Mutex
	var violations []string
	nc := clConnect(t, bus.ClientConfig{
		URLs: []string{url}, NKeySeedFile: node.SeedFile, Name: "build-1 probe",
		InboxPrefix: bus.InboxPrefix(node.NodeID),
		ErrorHandler: func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				mu.Lock()
				violations = append(violations, err.Error())
				mu.Unlock()
			}
		},
	})
	other := stranger.NodeID
	tests := []struct {
		name, subject string
		refused       bool
	}{
		{"its own heartbeat", subj.PresenceOf(node.NodeID), false},
		{"another node's heartbeat", subj.PresenceOf(other), true},
		{"another node's exit events", subj.ExitEventsOf(other), true},
		{"another node's endpoints", subj.Node(other, protocol.NodeEndpointExec), true},
		{"the gateway's tool API", subj.Invoke, true},
		{"the JetStream API", "$JS.API.STREAM.DELETE." + bus.StreamNamesFor(bus.DefaultPrefix).Exit, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := nc.Publish(tc.subject, []byte("x")); err != nil {
				t.Fatal(err)
			}
			// The server answers in order and nats.go reports errors in
			// order: once a refused sentinel's violation arrived, one for
			// this publish would have arrived before it.
			sentinel := subj.PresenceOf(other) + ".after"
			if err := nc.Publish(sentinel, nil); err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			refused := func(subject string) bool {
				mu.Lock()
				defer mu.Unlock()
				for _, v := range violations {
					if strings.Contains(v, "Publish to \""+subject+"\"") {
						return true
					}
				}
				return false
			}
			clCheckFor(t, "the sentinel's permissions violation", 10*time.Second, 20*time.Millisecond, func() error {
				if !refused(sentinel) {
					return errors.New("not reported yet")
				}
				return nil
			})
			if got := refused(tc.subject); got != tc.refused {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("publish to %s refused: %v, want %v; violations:\n%s", tc.subject, got, tc.refused, strings.Join(violations, "\n"))
			}
			mu.Lock()
			violations = nil
			mu.Unlock()
		})
	}

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if snc, err := bus.Connect(ctx, bus.ClientConfig{URLs: []string{url}, NKeySeedFile: stranger.SeedFile, Name: "stranger"}, nil); err == nil {
		snc.Close()
		t.Fatal("a key without a users entry connected")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("a key without a users entry: %v, want an authorization violation", err)
	}
}
