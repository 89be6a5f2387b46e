package session

import (
	"encoding/hex"
	"fmt"
	"os"

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
	}
	fmt.Fprintln(os.Stderr, "unknown helper mode", mode)
	return 2
}
