package main

import (
	"context"
	"encoding/json"
	"testing"
)

func TestMCPWorkdir(t *testing.T) {
	local := func(context.Context) (string, bool) { return "/client/dir", true }
	cases := []struct {
		name     string
		explicit string
		local    bool // the gateway shares this machine
		args     string
		want     string // "" = args unchanged
	}{
		{name: "client directory", local: true, args: `{"command":"pwd"}`, want: `{"command":"pwd","workdir":"/client/dir"}`},
		{name: "explicit wins", explicit: "/flag", local: true, args: `{"command":"pwd"}`, want: `{"command":"pwd","workdir":"/flag"}`},
		{name: "the call's workdir wins", explicit: "/flag", local: true, args: `{"command":"pwd","workdir":"/call"}`},
		{name: "empty workdir is none", local: true, args: `{"command":"pwd","workdir":""}`, want: `{"command":"pwd","workdir":"/client/dir"}`},
		{name: "null workdir is none", local: true, args: `{"command":"pwd","workdir":null}`, want: `{"command":"pwd","workdir":"/client/dir"}`},
		{name: "a node call gets no client directory", local: true, args: `{"command":"pwd","node":"side"}`},
		{name: "host node gets no client directory", local: true, args: `{"command":"pwd","host":" Node "}`},
		{name: "an explicit directory goes to a node too", explicit: "/flag", local: true, args: `{"command":"pwd","node":"side"}`,
			want: `{"command":"pwd","node":"side","workdir":"/flag"}`},
		{name: "remote gateway", args: `{"command":"pwd"}`},
		{name: "a workdir the gateway refuses stays", local: true, args: `{"command":"pwd","workdir":7}`},
		{name: "not an object", local: true, args: `["pwd"]`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := &workdirInvoker{explicit: c.explicit}
			if c.local {
				w.local = local
			}
			got := w.withWorkdir(t.Context(), json.RawMessage(c.args))
			want := c.want
			if want == "" {
				want = c.args
			}
			if string(got) != want {
				t.Errorf("got %s, want %s", got, want)
			}
		})
	}
}
