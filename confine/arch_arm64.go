package confine

import "golang.org/x/sys/unix"

// nativeArch is the audit architecture of this build's system calls;
// arm64 has no second numbering in the same architecture.
const (
	nativeArch    = unix.AUDIT_ARCH_AARCH64
	foreignNrBase = 0
)

// archChmodSyscalls: arm64 has only fchmod and the fchmodat calls.
var archChmodSyscalls []chmodCall

// cloneFlagsArg is the argument of clone(2) that holds its flags.
const cloneFlagsArg = 0
