//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package approvals

import "io/fs"

// oNoFollow is not available here; the Lstat and SameFile checks remain.
const oNoFollow = 0

// oNonBlock is not available here.
const oNonBlock = 0

// linkCount cannot be read portably here; hard links are not detected.
func linkCount(fs.FileInfo) uint64 { return 1 }

// lockFile is a no-op here: concurrent writers in different processes are
// only detected by the hash check, not serialised.
func lockFile(string) (func(), error) { return func() {}, nil }
