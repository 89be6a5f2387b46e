package main

import (
	"os"
	"testing"
)

// TestIdleRunTime: run time between two snapshots sums every thread's
// growth and the whole of a thread started meanwhile, and refuses when a
// thread vanished (its run time went with it).
func TestIdleRunTime(t *testing.T) {
	for _, tc := range []struct {
		name          string
		before, after map[int]int64
		ns            int64
		ok            bool
	}{
		{"grew", map[int]int64{1: 100, 2: 50}, map[int]int64{1: 160, 2: 50}, 60, true},
		{"new thread", map[int]int64{1: 100}, map[int]int64{1: 110, 7: 30}, 40, true},
		{"thread gone", map[int]int64{1: 100, 2: 50}, map[int]int64{1: 160}, 0, false},
	} {
		ns, ok := idleRunTime(tc.before, tc.after)
		if ns != tc.ns || ok != tc.ok {
			t.Errorf("%s: %d %v, want %d %v", tc.name, ns, ok, tc.ns, tc.ok)
		}
	}
	rt, err := threadsRunTime(os.Getpid())
	if err != nil || len(rt) == 0 {
		t.Fatalf("threadsRunTime of this process: %v %v", rt, err)
	}
}
