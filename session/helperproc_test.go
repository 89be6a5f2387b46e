package session

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// The test binary doubles as a helper program for PTY tests, the way
// os/exec's tests do: with helperEnv set, TestMain runs runHelper instead
// of the tests.
const helperEnv = "EXECMESH_SESSION_TEST_HELPER"

// helperCommand returns a shell command that runs the helper in mode.
func helperCommand(mode string) string {
	exe, err := os.Executable()
	if err != nil {
		panic(err)
	}
	return fmt.Sprintf("%s=%s exec '%s'", helperEnv, mode, exe)
}

func runHelper(mode string) int {
	switch mode {
	case "hexecho":
		// Raw mode: every byte reaches us unchanged (no line editing, no
		// signals from ^C, no flow control), and nothing is echoed.
		t, err := unix.IoctlGetTermios(0, unix.TCGETS)
		if err != nil {
			fmt.Fprintln(os.Stderr, "not a terminal:", err)
			return 2
		}
		t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
		t.Oflag &^= unix.OPOST
		t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
		t.Cflag &^= unix.CSIZE | unix.PARENB
		t.Cflag |= unix.CS8
		t.Cc[unix.VMIN], t.Cc[unix.VTIME] = 1, 0
		if err := unix.IoctlSetTermios(0, unix.TCSETS, t); err != nil {
			fmt.Fprintln(os.Stderr, "raw mode:", err)
			return 2
		}
		os.Stdout.WriteString(os.Getenv("HELPER_BANNER") + "READY\n")
		buf := make([]byte, 4096)
		for {
			n, err := os.Stdin.Read(buf)
			if n > 0 {
				os.Stdout.WriteString("<" + hex.EncodeToString(buf[:n]) + ">\n")
			}
			if err != nil {
				return 0
			}
		}
	case "burn":
		// Spin until this process used HELPER_BURN_MS of CPU time.
		ms, _ := strconv.Atoi(os.Getenv("HELPER_BURN_MS"))
		for x := 0; ; x++ {
			var ru unix.Rusage
			_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
			if used := ru.Utime.Sec*1000 + ru.Utime.Usec/1000 + ru.Stime.Sec*1000 + ru.Stime.Usec/1000; used >= int64(ms) {
				fmt.Println("burnt", used, x > 0)
				return 0
			}
			for i := 0; i < 1e6; i++ {
				x ^= i
			}
		}
	case "sigdefaults":
		// A Manager in a process started with SIGINT and SIGHUP ignored
		// runs a command that sends itself each: it must die of them.
		m, err := NewManager(DefaultConfig())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer m.Close(context.Background())
		for _, sig := range []string{"INT", "HUP"} {
			res, err := m.Exec(context.Background(), ExecRequest{Command: "kill -" + sig + " $$; echo survived-" + sig})
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 2
			}
			fmt.Printf("%s: %s\n", sig, res.Text())
		}
		return 0
	case "daemon":
		// A daemon with a Manager on HELPER_STATE_DIR that starts
		// HELPER_COMMAND in the background, prints "started <id>" and
		// waits to be killed.
		cfg := DefaultConfig()
		cfg.StateDir = os.Getenv("HELPER_STATE_DIR")
		cfg.Containment = os.Getenv("HELPER_CONTAINMENT")
		m, err := NewManager(cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
			return 2
		}
		res, err := m.Exec(context.Background(), ExecRequest{Command: os.Getenv("HELPER_COMMAND"), Background: true, ScopeKey: "agent:lost", SessionID: os.Getenv("HELPER_SESSION")})
		if err != nil {
			fmt.Fprintln(os.Stderr, "exec:", err)
			return 2
		}
		fmt.Println("started", res.SessionID(), m.Containment().Mode)
		time.Sleep(time.Hour)
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown helper mode", mode)
	return 2
}
