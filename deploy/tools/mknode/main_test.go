package main

import (
	"os"
	"strings"
	"testing"

	"github.com/execmesh/execmesh/bus"
)

// TestAuthConfGatewayEntry keeps deploy/nats/cluster/auth.conf's gateway
// entry what mknode --gateway writes: a gateway given fewer permissions
// than it needs fails on a real cluster with permissions violations
// (its session index, approvals and micro service).
func TestAuthConfGatewayEntry(t *testing.T) {
	b, err := os.ReadFile("../../nats/cluster/auth.conf")
	if err != nil {
		t.Fatal(err)
	}
	want := renderUser("execmesh gateway (prefix execmesh)", "REPLACE_WITH_GATEWAY_NKEY", bus.GatewayPermissions(bus.DefaultPrefix))
	var ind strings.Builder
	for _, l := range strings.Split(strings.TrimRight(want, "\n"), "\n") {
		ind.WriteString("    " + l + "\n")
	}
	if !strings.Contains(string(b), ind.String()) {
		t.Fatalf("auth.conf's gateway entry is not mknode's; replace it with:\n%s", ind.String())
	}
}
