package confine

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// seccompData, seccompNotif and seccompNotifResp are struct seccomp_data,
// seccomp_notif and seccomp_notif_resp of linux/seccomp.h.
type seccompData struct {
	Nr   int32
	Arch uint32
	IP   uint64
	Args [6]uint64
}

type seccompNotif struct {
	ID    uint64
	Pid   uint32
	Flags uint32
	Data  seccompData
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// Classic BPF instructions used by the filter.
const (
	bpfLdAbsW = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	bpfJeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	bpfJgeK   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	bpfJsetK  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	bpfRetK   = unix.BPF_RET | unix.BPF_K
)

// insn is a classic BPF instruction whose jumps name labels.
type insn struct {
	code   uint16
	k      uint32
	jt, jf string // labels; "" is the next instruction
	label  string // this instruction's label
}

// assemble resolves the labels of prog into jump offsets.
func assemble(prog []insn) []unix.SockFilter {
	at := map[string]int{}
	for i, in := range prog {
		if in.label != "" {
			at[in.label] = i
		}
	}
	off := func(i int, l string) uint8 {
		if l == "" {
			return 0
		}
		return uint8(at[l] - i - 1)
	}
	out := make([]unix.SockFilter, len(prog))
	for i, in := range prog {
		out[i] = unix.SockFilter{Code: in.code, K: in.k, Jt: off(i, in.jt), Jf: off(i, in.jf)}
	}
	return out
}

// filter is the seccomp program of a confined tree: execve and execveat go
// to the supervisor; open_by_handle_at, which opens a file without a path
// and so around the mounts that hide the daemon's state, is refused, and
// so is a chmod that sets the set-user-ID or set-group-ID bit (Landlock
// does not cover a file's mode: a root command could otherwise leave a
// set-user-ID program behind for anyone); so is every system call of a
// foreign ABI (32-bit or x32 entry points, which the filter would
// otherwise have to mirror).
func filter() []unix.SockFilter {
	deny := uint32(unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM))
	prog := []insn{
		{code: bpfLdAbsW, k: 4}, // arch
		{code: bpfJeqK, k: nativeArch, jf: "deny"},
		{code: bpfLdAbsW, k: 0, label: "nr"},
	}
	if foreignNrBase != 0 {
		prog = append(prog, insn{code: bpfJgeK, k: foreignNrBase, jt: "deny"})
	}
	prog = append(prog,
		insn{code: bpfJeqK, k: unix.SYS_EXECVE, jt: "notify"},
		insn{code: bpfJeqK, k: unix.SYS_EXECVEAT, jt: "notify"},
		insn{code: bpfJeqK, k: unix.SYS_OPEN_BY_HANDLE_AT, jt: "deny"},
		// New namespaces and a new root: a user namespace gives the
		// tree every capability again, a chroot makes paths mean other
		// files than the supervisor sees. clone3 passes its flags in
		// memory the filter cannot read: ENOSYS sends callers back to
		// clone, whose flags it can.
		insn{code: bpfJeqK, k: unix.SYS_UNSHARE, jt: "deny"},
		insn{code: bpfJeqK, k: unix.SYS_SETNS, jt: "deny"},
		insn{code: bpfJeqK, k: unix.SYS_CHROOT, jt: "deny"},
		insn{code: bpfJeqK, k: unix.SYS_CLONE3, jt: "enosys"},
		insn{code: bpfJeqK, k: unix.SYS_CLONE, jt: "clone"},
		// memfd_create without MFD_NOEXEC_SEAL would make memory a
		// library can be loaded from, which noexec mounts cannot stop.
		insn{code: bpfJeqK, k: unix.SYS_MEMFD_CREATE, jt: "memfd"},
	)
	chmods := chmodSyscalls()
	for i, c := range chmods {
		prog = append(prog, insn{code: bpfJeqK, k: c.nr, jt: fmt.Sprint("mode", i)})
	}
	// Classic BPF jumps only forward: the last compare falls through to
	// allow, past the argument checks.
	prog[len(prog)-1].jf = "allow"
	prog = append(prog,
		insn{code: bpfLdAbsW, k: 16 + 8*cloneFlagsArg, label: "clone"}, // low word of clone's flags
		insn{code: bpfJsetK, k: namespaceFlags, jt: "deny", jf: "allow"},
		insn{code: bpfLdAbsW, k: 16 + 8*1, label: "memfd"}, // memfd_create's flags
		insn{code: bpfJsetK, k: unix.MFD_NOEXEC_SEAL, jt: "allow", jf: "deny"},
	)
	for i, c := range chmods {
		prog = append(prog,
			insn{code: bpfLdAbsW, k: 16 + 8*c.modeArg, label: fmt.Sprint("mode", i)}, // low word of the mode
			insn{code: bpfJsetK, k: unix.S_ISUID | unix.S_ISGID, jt: "deny", jf: "allow"},
		)
	}
	prog = append(prog,
		insn{code: bpfRetK, k: unix.SECCOMP_RET_ALLOW, label: "allow"},
		insn{code: bpfRetK, k: deny, label: "deny"},
		insn{code: bpfRetK, k: unix.SECCOMP_RET_USER_NOTIF, label: "notify"},
		insn{code: bpfRetK, k: uint32(unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)), label: "enosys"},
	)
	return assemble(prog)
}

// namespaceFlags are the clone flags that make new namespaces.
const namespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// chmodCall is a system call that sets a file's mode, with the index of
// its mode argument.
type chmodCall struct{ nr, modeArg uint32 }

// chmodSyscalls are this architecture's chmodCalls.
func chmodSyscalls() []chmodCall {
	return append([]chmodCall{{unix.SYS_FCHMOD, 1}, {unix.SYS_FCHMODAT, 2}, {unix.SYS_FCHMODAT2, 2}}, archChmodSyscalls...)
}

// superviseSelf installs the filter on this thread and hands its listener,
// with the helper's stderr for the supervisor's messages, to the
// supervisor over SupervisorFD.
func superviseSelf() error {
	prog := filter()
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	lfd, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_NEW_LISTENER, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return fmt.Errorf("seccomp: %w", errno)
	}
	defer unix.Close(int(lfd))
	rights := unix.UnixRights(int(lfd), 2)
	if err := unix.Sendmsg(SupervisorFD, []byte{1}, rights, nil, 0); err != nil {
		return fmt.Errorf("seccomp: handing the listener over: %w", err)
	}
	return unix.Close(SupervisorFD)
}

// notifRecv waits for nothing: it returns a pending notification, or
// ok=false when none is pending, or done when no process of the tree is
// left.
func notifRecv(fd int, n *seccompNotif) (ok, done bool, err error) {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if _, err := unix.Poll(pfd, 0); err != nil {
		if errors.Is(err, unix.EINTR) {
			return false, false, nil
		}
		return false, false, os.NewSyscallError("poll", err)
	}
	switch {
	case pfd[0].Revents&unix.POLLIN != 0:
	case pfd[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0:
		return false, true, nil
	default:
		return false, false, nil
	}
	*n = seccompNotif{}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SECCOMP_IOCTL_NOTIF_RECV, uintptr(unsafe.Pointer(n))); errno != 0 {
		if errno == unix.ENOENT || errno == unix.EINTR {
			return false, false, nil // the caller died before we took it
		}
		return false, false, os.NewSyscallError("seccomp notif recv", errno)
	}
	return true, false, nil
}

// notifValid reports whether the notification is still pending (its task
// is alive and still in the system call), after its memory was read.
func notifValid(fd int, id uint64) bool {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SECCOMP_IOCTL_NOTIF_ID_VALID, uintptr(unsafe.Pointer(&id)))
	return errno == 0
}

// notifSend answers a notification: go on (the kernel and Landlock decide)
// or fail the call with errno.
func notifSend(fd int, id uint64, errno syscall.Errno) error {
	r := seccompNotifResp{ID: id}
	if errno == 0 {
		r.Flags = unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE
	} else {
		r.Error = -int32(errno)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SECCOMP_IOCTL_NOTIF_SEND, uintptr(unsafe.Pointer(&r))); e != 0 && e != unix.ENOENT {
		return os.NewSyscallError("seccomp notif send", e)
	}
	return nil
}
