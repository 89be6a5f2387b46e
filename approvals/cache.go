package approvals

import (
	"errors"
	"io/fs"
	"os"
	"sync"
	"time"
)

// FileCache is the approvals file of one path as Load returns it, read
// again only when the file changed: each call costs one lstat instead of
// an open, a read and a parse. A change is a different device, inode,
// size, mode, link count, modification or change time, or the file
// appearing or going. Timestamps are coarse (a kernel tick), so a file
// modified less than racyWindow before it was read could change again
// with the same times: such an entry is read again on every call until it
// is old enough, as Git treats racily clean index entries.
//
// A FileCache is safe for concurrent use. The *File it returns is shared:
// callers must not modify it (use Load for a copy to change and Save).
type FileCache struct {
	path string

	mu     sync.Mutex
	valid  bool
	key    fileKey
	readAt time.Time
	file   *File
	err    error
}

// racyWindow is how long after its modification a file's cache entry is
// not trusted.
const racyWindow = time.Second

// NewFileCache returns a cache of the approvals file at path.
func NewFileCache(path string) *FileCache { return &FileCache{path: path} }

// Path is the file the cache reads.
func (c *FileCache) Path() string { return c.path }

// Load returns what Load(path) would: the parsed file (shared, read-only)
// and Load's error for a corrupt or unsafe file.
func (c *FileCache) Load() (*File, error) {
	fi, lerr := os.Lstat(c.path)
	var k fileKey
	ok := false
	switch {
	case lerr == nil:
		k, ok = keyOf(fi)
	case errors.Is(lerr, fs.ErrNotExist):
		k, ok = fileKey{missing: true}, true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ok && c.valid && c.key == k && (k.missing || c.readAt.Sub(k.mtime) > racyWindow) {
		return c.file, c.err
	}
	now := time.Now()
	f, _, err := Load(c.path)
	c.file, c.err = f, err
	// The key is the lstat taken before the read: a change during the
	// read gives a different key at the next call.
	c.valid, c.key, c.readAt = ok, k, now
	return f, err
}

// fileKey identifies one version of a file (see FileCache).
type fileKey struct {
	missing      bool
	dev, ino     uint64
	size         int64
	mode         fs.FileMode
	nlink        uint64
	mtime, ctime time.Time
}
