package gateway

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

// TestMigrateEarlierStateDir: a state dir of a gateway from before the
// JetStream control plane (nodes.json, events.json) is carried over on
// the first start: the pairing decisions reach the registry, the queued
// events the queues, the files are renamed; a corrupt file is left in
// place and the gateway serves.
func TestMigrateEarlierStateDir(t *testing.T) {
	dir := t.TempDir()
	id, err := bus.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	nodesJSON := fmt.Sprintf(`{"version":1,"nodes":[{"id":%q,"publicKey":%q,"name":"old-builder","pairing":"paired","joined":true,"decidedAt":1700000000000},
		{"id":"abcdefghabcdefgh","pairing":"rejected","decidedAt":1700000000001}]}`, id.NodeID, id.PublicKey)
	eventsJSON := `{"queues":{"agent:main:main":[{"id":"7","ts":1700000000002,"sessionKey":"agent:main:main","contextKey":"exec:old-one","kind":"exec.exit","text":"Exec completed (old-one, code 0) :: kept"}]}}`
	for name, body := range map[string]string{"nodes.json": nodesJSON, "events.json": eventsJSON} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	env := startNodeGateway(t, nil, dir, nil)
	checkFor(t, 15*time.Second, func() error {
		n, ok := env.g.NodeRegistry().Get(id.NodeID)
		if !ok || n.Pairing != protocol.NodePairingPaired || n.Name != "old-builder" {
			return fmt.Errorf("migrated node: %+v %v", n, ok)
		}
		if r, ok := env.g.NodeRegistry().Get("abcdefghabcdefgh"); !ok || r.Pairing != protocol.NodePairingRejected {
			return fmt.Errorf("migrated rejection: %+v %v", r, ok)
		}
		return nil
	})
	evs := env.events(DefaultSessionKey, 5*time.Second)
	if len(evs) != 1 || !strings.Contains(evs[0].Text, ":: kept") {
		t.Fatalf("migrated events: %+v", evs)
	}
	for _, name := range []string{"nodes.json", "events.json"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			t.Errorf("%s still in place", name)
		}
		if _, err := os.Stat(filepath.Join(dir, name+".migrated")); err != nil {
			t.Errorf("%s.migrated: %v", name, err)
		}
	}
	env.close()

	// Started again: nothing is carried over twice.
	env = startNodeGateway(t, env.srv, dir, nil)
	if evs := env.events(DefaultSessionKey, time.Second); len(evs) != 0 {
		t.Fatalf("events after the second start: %+v", evs)
	}
	env.close()

	// A corrupt file stays, and the gateway serves.
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "nodes.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	env = startNodeGateway(t, env.srv, bad, nil)
	if r := env.invoke("exec", map[string]any{"command": "echo serving"}, ""); !strings.Contains(r.Text(), "serving") {
		t.Fatalf("exec with a corrupt nodes.json: %s", r.Text())
	}
	if _, err := os.Stat(filepath.Join(bad, "nodes.json")); err != nil {
		t.Fatalf("the corrupt file was not left in place: %v", err)
	}
}
