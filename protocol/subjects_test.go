package protocol

import (
	"errors"
	"strings"
	"testing"
)

func TestSubjects(t *testing.T) {
	s := Subjects("")
	if s.Prefix != DefaultSubjectPrefix || DefaultSubjectPrefix != "execmesh" {
		t.Fatalf("default prefix = %q", s.Prefix)
	}
	checks := []struct{ got, want string }{
		{s.Invoke, "execmesh.gw.invoke"},
		{s.GatewayEvents, "execmesh.gw.events.*"},
		{s.GatewayEventsFor("agent:main:main"), "execmesh.gw.events.YWdlbnQ6bWFpbjptYWlu"},
		{s.PairRequest, "execmesh.pair.request"},
		{s.Presence, "execmesh.presence.*"},
		{s.PresenceOf("build-1"), "execmesh.presence.build-1"},
		{s.ExitEvents, "execmesh.events.exit.*"},
		{s.ExitEventsOf("build-1"), "execmesh.events.exit.build-1"},
		{s.Nodes, "execmesh.node.>"},
		{s.NodeGroup("build-1"), "execmesh.node.build-1"},
		{s.NodeAll("build-1"), "execmesh.node.build-1.>"},
		{s.Node("build-1", NodeEndpointExec), "execmesh.node.build-1.exec"},
		{s.Node("build-1", NodeEndpointProcess), "execmesh.node.build-1.process"},
		{s.Node("build-1", NodeEndpointApprovalsGet), "execmesh.node.build-1.approvals.get"},
		{s.Node("build-1", NodeEndpointApprovalsSet), "execmesh.node.build-1.approvals.set"},
		{s.Node("build-1", NodeEndpointWhich), "execmesh.node.build-1.which"},
		{s.Node("build-1", NodeEndpointAttach), "execmesh.node.build-1.attach"},
		{s.NodeStreamIn("build-1", "s-1"), "execmesh.node.build-1.stream.s-1"},
		{s.NodeStreamOut("build-1", "s-1"), "execmesh.nstream.build-1.s-1"},
		{s.NodeStreamsOf("build-1"), "execmesh.nstream.build-1.>"},
		{Subjects("acme_prod").Invoke, "acme_prod.gw.invoke"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestParseNodeGroup(t *testing.T) {
	for _, c := range []struct{ prefix, id string }{{"execmesh", "build-1"}, {"acme_prod", "N" + strings.Repeat("x", 127)}} {
		p, id, err := ParseNodeGroup(Subjects(c.prefix).NodeGroup(c.id))
		if err != nil || p != c.prefix || id != c.id {
			t.Errorf("ParseNodeGroup(NodeGroup(%q, %q)) = %q, %q, %v", c.prefix, c.id, p, id, err)
		}
	}
	for _, g := range []string{"", "execmesh", "execmesh.node.", "execmesh.node.a.b", "a.b.node.c", ".node.x", "execmesh.node.*", "execmesh.nodes.x", "execmesh.node.>"} {
		if p, id, err := ParseNodeGroup(g); err == nil {
			t.Errorf("ParseNodeGroup(%q) = %q, %q, nil", g, p, id)
		}
	}
}

func TestValidateStreamID(t *testing.T) {
	for _, id := range []string{"a", "0123456789abcdef0123456789abcdef", "A-b_9", strings.Repeat("s", 64)} {
		if err := ValidateStreamID(id); err != nil {
			t.Errorf("ValidateStreamID(%q) = %v", id, err)
		}
	}
	for _, id := range []string{"", "a.b", "*", ">", "a b", strings.Repeat("s", 65)} {
		var pe *Error
		if err := ValidateStreamID(id); !errors.As(err, &pe) || pe.Type != ErrInvalidRequest {
			t.Errorf("ValidateStreamID(%q) = %v, want an invalid_request *Error", id, err)
		}
	}
}

func TestValidateSubjectPrefixAndNodeID(t *testing.T) {
	good := []string{"execmesh", "a", "A-b_9", strings.Repeat("x", 64)}
	bad := []string{"", "a.b", "a b", "*", ">", "a*", "a>", "$SYS", "a\tb", "a\n", "é", "a/b", strings.Repeat("x", 65)}
	for _, p := range good {
		if err := ValidateSubjectPrefix(p); err != nil {
			t.Errorf("ValidateSubjectPrefix(%q) = %v", p, err)
		}
		if err := ValidateNodeID(p); err != nil {
			t.Errorf("ValidateNodeID(%q) = %v", p, err)
		}
	}
	for _, p := range bad {
		err := ValidateSubjectPrefix(p)
		var pe *Error
		if !errors.As(err, &pe) || pe.Type != ErrInvalidRequest {
			t.Errorf("ValidateSubjectPrefix(%q) = %v, want an invalid_request *Error", p, err)
		}
		if p != strings.Repeat("x", 65) {
			if err := ValidateNodeID(p); err == nil {
				t.Errorf("ValidateNodeID(%q) = nil", p)
			}
		}
	}
	if err := ValidateNodeID(strings.Repeat("n", 128)); err != nil {
		t.Errorf("ValidateNodeID(128 chars) = %v", err)
	}
	if err := ValidateNodeID(strings.Repeat("n", 129)); err == nil {
		t.Errorf("ValidateNodeID(129 chars) = nil")
	}
}

func TestSessionKeyToken(t *testing.T) {
	for _, key := range []string{"agent:main:main", "", "a", "agent:x.y:*>", "agent:main:main with spaces", "ünï\x00", "_", "??>>"} {
		tok := EncodeSessionKeyToken(key)
		if !isIDToken(tok, len(tok)) {
			t.Errorf("token %q of %q is not a plain subject token", tok, key)
		}
		back, err := DecodeSessionKeyToken(tok)
		if err != nil || back != key {
			t.Errorf("DecodeSessionKeyToken(%q) = %q, %v; want %q", tok, back, err, key)
		}
	}
	if got := EncodeSessionKeyToken("agent:main:main"); got != "YWdlbnQ6bWFpbjptYWlu" {
		t.Errorf("token = %q", got)
	}
	// Tokens the encoder never produces: padding, bad alphabet, line
	// breaks the decoder would skip, non-zero trailing bits, empty.
	for _, tok := range []string{"", "YQ==", "YR", "YWdl\nbnQ", "Y+", "Y/", "a.b", "*", ">", "Y", "YWdlbnQ6bWFpbjptYWlu "} {
		if key, err := DecodeSessionKeyToken(tok); err == nil {
			t.Errorf("DecodeSessionKeyToken(%q) = %q, want an error", tok, key)
		}
	}
}
