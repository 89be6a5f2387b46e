package confine

import (
	"os"
	"syscall"
)

// SetSysProcAttr makes attr start the helper in a mount namespace of its
// own when the daemon is root. A daemon that is not root starts the
// helper as it is; the helper starts its confined part in a user and
// mount namespace (userNSAttr).
func SetSysProcAttr(attr *syscall.SysProcAttr) {
	if os.Geteuid() == 0 {
		attr.Cloneflags |= syscall.CLONE_NEWNS
	}
}

// userNSAttr starts a process in a user namespace that maps only the
// caller's own ids, and a mount namespace, with the one capability the
// helper needs for its mounts (CAP_SYS_ADMIN there, ambient so that it
// survives the exec; the helper drops it before the command's).
func userNSAttr() *syscall.SysProcAttr {
	uid, gid := os.Geteuid(), os.Getegid()
	return &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}},
		AmbientCaps: []uintptr{capSysAdmin},
	}
}

// capSysAdmin is CAP_SYS_ADMIN.
const capSysAdmin = 21
