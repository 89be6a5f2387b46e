package approvals

import (
	"io/fs"
	"syscall"
	"time"
)

// keyOf returns what identifies this version of a file for FileCache.
func keyOf(fi fs.FileInfo) (fileKey, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileKey{}, false
	}
	return fileKey{
		dev: st.Dev, ino: st.Ino, size: fi.Size(), mode: fi.Mode(), nlink: uint64(st.Nlink),
		mtime: fi.ModTime(), ctime: time.Unix(st.Ctim.Sec, st.Ctim.Nsec),
	}, true
}
