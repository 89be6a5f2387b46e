//go:build !unix

package applypatch

import "io/fs"

// owner is a file's user and group, when the platform has them.
type owner struct {
	uid, gid int
	known    bool
}

// ownerOf knows no owners here: files are written with the process's.
func ownerOf(fs.FileInfo) owner { return owner{} }

// oNonBlock is not available here; the Lstat and SameFile checks remain.
const oNonBlock = 0
