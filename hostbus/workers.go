package hostbus

import "sync"

// maxIdleWorkers bounds the goroutines a Server keeps waiting for the
// next request.
const maxIdleWorkers = 8

// workers runs requests on goroutines that outlive them. A fresh
// goroutine starts on an 8 KiB stack, and decoding a request and running
// the host pipeline grow it by copying, several microseconds a request;
// a worker keeps its grown stack for the next one. Goroutines are not
// bounded (a long poll must not hold up an exec): when none is idle, a
// new one starts; at most maxIdleWorkers wait once the burst is over.
type workers struct {
	mu     sync.Mutex
	idle   []chan func()
	closed bool
}

// run runs f on an idle worker, or a new one.
func (w *workers) run(f func()) {
	w.mu.Lock()
	if n := len(w.idle); n > 0 {
		ch := w.idle[n-1]
		w.idle = w.idle[:n-1]
		w.mu.Unlock()
		ch <- f // buffered: the worker is waiting for exactly this
		return
	}
	w.mu.Unlock()
	go w.work(f)
}

// work runs f, then waits for more while there is room among the idle.
func (w *workers) work(f func()) {
	ch := make(chan func(), 1)
	for f != nil {
		f()
		if !w.park(ch) {
			return
		}
		f = <-ch // nil: closed
	}
}

// park adds ch to the idle workers, unless they are full or w is closed.
func (w *workers) park(ch chan func()) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || len(w.idle) >= maxIdleWorkers {
		return false
	}
	w.idle = append(w.idle, ch)
	return true
}

// close ends the idle workers; workers busy now end when done.
func (w *workers) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for _, ch := range w.idle {
		close(ch)
	}
	w.idle = nil
}
