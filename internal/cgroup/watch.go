package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Watcher reports changes of many groups' cgroup.events (populated,
// frozen) through one inotify descriptor read by one goroutine; a watch
// costs a kernel inotify watch, not a descriptor.
type Watcher struct {
	f    *os.File // the inotify descriptor, non-blocking, in Go's poller
	done chan struct{}

	mu      sync.Mutex
	watches map[int32]func() // watch descriptor → callback
}

// NewWatcher starts a watcher. It fails when inotify is unavailable (for
// example fs.inotify.max_user_instances is exhausted).
func NewWatcher() (*Watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, os.NewSyscallError("inotify_init1", err)
	}
	w := &Watcher{f: os.NewFile(uintptr(fd), "inotify"), done: make(chan struct{}), watches: map[int32]func(){}}
	go w.run()
	return w, nil
}

// Watch calls fn, on the watcher's goroutine, after every change of d's
// cgroup.events, until stop is called or the group is removed. fn must
// be quick and must not call the Watcher.
func (w *Watcher) Watch(d Dir, fn func()) (stop func(), err error) {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var wd int
	var werr error
	w.mu.Lock()
	defer w.mu.Unlock()
	if cerr := rc.Control(func(fd uintptr) {
		wd, werr = unix.InotifyAddWatch(int(fd), filepath.Join(d.Path, "cgroup.events"), unix.IN_MODIFY)
	}); cerr != nil {
		return nil, cerr
	}
	if werr != nil {
		return nil, &os.PathError{Op: "inotify_add_watch", Path: filepath.Join(d.Path, "cgroup.events"), Err: werr}
	}
	w.watches[int32(wd)] = fn
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if _, ok := w.watches[int32(wd)]; !ok {
				return // removed with its group
			}
			delete(w.watches, int32(wd))
			_ = rc.Control(func(fd uintptr) { _, _ = unix.InotifyRmWatch(int(fd), uint32(wd)) })
		})
	}, nil
}

// Close stops the watcher; callbacks are not called afterwards.
func (w *Watcher) Close() error {
	err := w.f.Close()
	<-w.done
	return err
}

func (w *Watcher) run() {
	defer close(w.done)
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.PathMax))
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			continue // EINTR and the like; the poller waits again
		}
		var fns []func()
		w.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			off += unix.SizeofInotifyEvent + int(ev.Len)
			fn := w.watches[ev.Wd]
			if ev.Mask&unix.IN_IGNORED != 0 {
				// The group was removed (or the watch stopped): a last
				// call lets the owner see that.
				delete(w.watches, ev.Wd)
			}
			if fn != nil {
				fns = append(fns, fn)
			}
		}
		w.mu.Unlock()
		for _, fn := range fns {
			fn()
		}
	}
}
