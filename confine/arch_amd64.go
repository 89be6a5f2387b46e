package confine

import "golang.org/x/sys/unix"

// nativeArch is the audit architecture of this build's system calls;
// foreignNrBase is where x32's numbers start on it.
const (
	nativeArch    = unix.AUDIT_ARCH_X86_64
	foreignNrBase = 0x40000000
)

// archChmodSyscalls: chmod(2) exists on amd64 beside fchmod and fchmodat.
var archChmodSyscalls = []chmodCall{{unix.SYS_CHMOD, 1}}

// cloneFlagsArg is the argument of clone(2) that holds its flags.
const cloneFlagsArg = 0
