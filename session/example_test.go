package session_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

func ExampleManager_Exec() {
	m, err := session.NewManager(session.DefaultConfig())
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close(context.Background())
	ctx := context.Background()

	// A command that ends within the yield window answers at once.
	res, err := m.Exec(ctx, session.ExecRequest{Command: "echo hello; exit 3", ScopeKey: "agent:main:main"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Status())
	fmt.Println(res.Text())

	// A background command is a session that process polls.
	res, err = m.Exec(ctx, session.ExecRequest{Command: "sleep 0.1; echo done", Background: true, ScopeKey: "agent:main:main"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Status())
	id := res.SessionID()
	// poll waits up to Timeout ms, and returns early when output arrives.
	wait := int(5 * time.Second / time.Millisecond)
	poll := m.Process(ctx, "agent:main:main", protocol.ProcessArgs{Action: "poll", SessionID: id, Timeout: &wait})
	for poll.Status() == "running" {
		poll = m.Process(ctx, "agent:main:main", protocol.ProcessArgs{Action: "poll", SessionID: id, Timeout: &wait})
	}
	fmt.Println(poll.Status())
	logRes := m.Process(ctx, "agent:main:main", protocol.ProcessArgs{Action: "log", SessionID: id})
	fmt.Println(logRes.Text())
	// Output:
	// completed
	// hello
	//
	// (Command exited with code 3)
	// running
	// completed
	// done
}
