package gateway

import "testing"

// TestNodeRouting: a call that names a node runs on that node or not at
// all (DESIGN.md §3.3): a node with host auto means host=node, and a node
// with a host that resolves elsewhere is refused instead of ignored.
func TestNodeRouting(t *testing.T) {
	cases := []struct {
		name                        string
		configured, requested, node string
		sandbox, elevated           bool
		want, err                   string
	}{
		{name: "no node, auto", configured: "auto", want: "gateway"},
		{name: "node with host auto", configured: "auto", node: "side", want: "node"},
		{name: "node with host node", configured: "auto", requested: "node", node: "side", want: "node"},
		{name: "node, configured node", configured: "node", node: "side", want: "node"},
		{name: "node, elevated stays on the node", configured: "auto", node: "side", elevated: true, want: "node"},
		{name: "node with host gateway", configured: "auto", requested: "gateway", node: "side",
			err: `exec host not allowed (node "side" given, but host resolves to gateway)`},
		{name: "node, configured gateway", configured: "gateway", node: "side",
			err: `exec host not allowed (node "side" given, but host resolves to gateway)`},
		{name: "node, auto meaning sandbox", configured: "auto", node: "side", sandbox: true,
			err: `exec host not allowed (node "side" given, but host resolves to sandbox)`},
		{name: "node, configured sandbox", configured: "sandbox", node: "side", sandbox: true,
			err: `exec host not allowed (node "side" given, but host resolves to sandbox)`},
		{name: "node, elevated moves sandbox to gateway", configured: "sandbox", node: "side", sandbox: true, elevated: true,
			err: `exec host not allowed (node "side" given, but host resolves to gateway)`},
		// The host's own refusal comes first: it says what to configure.
		{name: "host node refused", configured: "gateway", requested: "node", node: "side",
			err: "exec host not allowed (requested node; configured host is gateway; set tools.exec.host=node or auto to allow this override)."},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := resolveTarget(c.configured, c.requested, c.node, c.sandbox, c.elevated)
			if c.err != "" {
				if err == nil || err.Error() != c.err {
					t.Fatalf("got %q, err %v; want err %q", got, err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %q, err %v; want %q", got, err, c.want)
			}
		})
	}
}
