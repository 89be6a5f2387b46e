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
	bpfRetK   = unix.BPF_RET | unix.BPF_K
)

// filter is the seccomp program of a confined tree: execve and execveat go
// to the supervisor; open_by_handle_at, which opens a file without a path
// and so around the mounts that hide the daemon's state, is refused, as is
// every system call of a foreign ABI (32-bit or x32 entry points, which
// the filter would otherwise have to mirror).
func filter() []unix.SockFilter {
	deny := uint32(unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM))
	prog := []unix.SockFilter{
		{Code: bpfLdAbsW, K: 4}, // arch
		{Code: bpfJeqK, K: nativeArch, Jt: 1},
		{Code: bpfRetK, K: deny},
		{Code: bpfLdAbsW, K: 0}, // nr
	}
	if foreignNrBase != 0 {
		prog = append(prog, unix.SockFilter{Code: bpfJgeK, K: foreignNrBase, Jt: 4})
	}
	prog = append(prog,
		unix.SockFilter{Code: bpfJeqK, K: unix.SYS_EXECVE, Jt: 4},
		unix.SockFilter{Code: bpfJeqK, K: unix.SYS_EXECVEAT, Jt: 3},
		unix.SockFilter{Code: bpfJeqK, K: unix.SYS_OPEN_BY_HANDLE_AT, Jt: 1},
		unix.SockFilter{Code: bpfRetK, K: unix.SECCOMP_RET_ALLOW},
		unix.SockFilter{Code: bpfRetK, K: deny},
		unix.SockFilter{Code: bpfRetK, K: unix.SECCOMP_RET_USER_NOTIF},
	)
	return prog
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
