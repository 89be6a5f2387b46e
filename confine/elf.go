package confine

import (
	"bytes"
	"debug/elf"
	"os"
	"path/filepath"
	"syscall"
)

// Interpreter returns the real path of a dynamic program's ELF
// interpreter, "" for anything else (a static program, a script, a file
// that is not regular). It never blocks on a FIFO put in a program's
// place.
func Interpreter(path string) string {
	file, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return ""
	}
	defer file.Close()
	if fi, err := file.Stat(); err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	f, err := elf.NewFile(file)
	if err != nil {
		return ""
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP || p.Filesz > 4096 {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return ""
		}
		real, err := filepath.EvalSymlinks(string(bytes.TrimRight(b, "\x00")))
		if err != nil {
			return ""
		}
		return real
	}
	return ""
}
