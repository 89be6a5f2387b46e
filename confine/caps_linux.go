package confine

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// rootCaps are the capabilities a confined command run as root keeps:
// those of ordinary root work on files and processes it may touch (the
// set container runtimes give a container's root, less making device
// nodes, setting file capabilities and chroot). The rest would step around the
// confinement: mounts and namespaces (CAP_SYS_ADMIN), other processes'
// memory and /proc files (CAP_SYS_PTRACE), opening files by handle
// (CAP_DAC_READ_SEARCH), raw devices and kernel modules.
var rootCaps = map[uintptr]bool{
	unix.CAP_CHOWN: true, unix.CAP_DAC_OVERRIDE: true, unix.CAP_FOWNER: true, unix.CAP_FSETID: true,
	unix.CAP_KILL: true, unix.CAP_SETGID: true, unix.CAP_SETUID: true, unix.CAP_SETPCAP: true,
	unix.CAP_NET_BIND_SERVICE: true, unix.CAP_NET_RAW: true, unix.CAP_AUDIT_WRITE: true,
}

// dropCaps takes every capability but rootCaps out of the bounding set,
// so that the command, exec'd as root, gets no others; the helper's own
// effective set shrinks to match at its exec of the command.
func dropCaps() error {
	if os.Geteuid() != 0 {
		return nil // the command gets none at all
	}
	last := uintptr(unix.CAP_LAST_CAP)
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = uintptr(n)
		}
	}
	for c := uintptr(0); c <= last; c++ {
		if rootCaps[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			return fmt.Errorf("dropping capability %d: %w", c, err)
		}
	}
	return nil
}
