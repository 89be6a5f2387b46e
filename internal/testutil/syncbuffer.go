// Package testutil holds small helpers shared by the tests of several
// packages. Nothing outside tests imports it.
package testutil

import (
	"bytes"
	"sync"
)

// SyncBuffer is a bytes.Buffer that may be written by one goroutine (a
// child process's output copier, a log handler, a drawing loop) while the
// test reads it. Its zero value is ready to use.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
