//go:build unix

package applypatch

import (
	"io/fs"
	"syscall"
)

// owner is a file's user and group, when the platform has them.
type owner struct {
	uid, gid int
	known    bool
}

func ownerOf(fi fs.FileInfo) owner {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return owner{uid: int(st.Uid), gid: int(st.Gid), known: true}
	}
	return owner{}
}

// oNonBlock opens a file without waiting for a FIFO's writer.
const oNonBlock = syscall.O_NONBLOCK
