// Package atomicfile replaces files so that readers, and a crash, see the
// old content or the new one, never a part.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write replaces path with data: a temporary file in the same directory
// (created 0700 when missing) is written with mode, synced and renamed over
// path, and the directory is synced so the rename survives a crash.
func Write(path string, data []byte, mode os.FileMode) error {
	return place(path, data, mode, os.Rename)
}

// WriteNew creates path with data and mode unless it exists: a temporary
// file is written, synced and hard-linked into place, so path appears
// complete or not at all, and of two processes racing to create it the
// first wins. It fails with an error matching fs.ErrExist when path
// already exists.
func WriteNew(path string, data []byte, mode os.FileMode) error {
	return place(path, data, mode, os.Link)
}

// place writes data to a synced temporary file beside path, puts it at
// path with put (rename or link), and syncs the directory.
func place(path string, data []byte, mode os.FileMode, put func(oldpath, newpath string) error) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // gone after a rename, not needed after a link; garbage on error
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := put(tmp, path); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
