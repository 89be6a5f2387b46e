package testutil

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
)

// Proc identifies a process beyond pid reuse: its pid and its start time
// (clock ticks since boot, /proc/<pid>/stat field 22).
type Proc struct {
	PID   int
	Start uint64
}

// procStat returns a process's state and start time.
func procStat(pid int) (state byte, start uint64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, false
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return f[0][0], start, err == nil
}

// ProcsWith lists the live processes (zombies left out) whose command line
// has arg as one of its arguments.
func ProcsWith(arg string) []Proc {
	names, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var out []Proc
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil || !slices.Contains(strings.Split(string(b), "\x00"), arg) {
			continue
		}
		pid, _ := strconv.Atoi(strings.Split(n, "/")[2])
		if state, start, ok := procStat(pid); ok && state != 'Z' {
			out = append(out, Proc{pid, start})
		}
	}
	return out
}

// StillAlive returns the processes of procs that still run: same pid,
// same start time, not a zombie.
func StillAlive(procs []Proc) []Proc {
	var out []Proc
	for _, p := range procs {
		if state, start, ok := procStat(p.PID); ok && start == p.Start && state != 'Z' {
			out = append(out, p)
		}
	}
	return out
}

var tokenSeq atomic.Int64

// SleepToken returns a duration for `sleep` that no other test (or test
// process) uses, "7<pid%1000>.<n>" seconds (about 2 hours), so that a
// test finds exactly its own processes with ProcsWith.
func SleepToken() string {
	return "7" + strconv.Itoa(os.Getpid()%1000) + "." + strconv.FormatInt(tokenSeq.Add(1), 10)
}
