package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// procStatus reads VmRSS (KiB) and Threads from /proc/<pid>/status.
func procStatus(pid int) (rssKiB, threads int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			rssKiB = firstInt(v)
		} else if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			threads = firstInt(v)
		}
	}
	return rssKiB, threads, nil
}

// procPss reads the proportional set size (KiB) from smaps_rollup: the
// process's private memory plus its share of shared pages.
func procPss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Pss:"); ok {
			return firstInt(v), nil
		}
	}
	return 0, fmt.Errorf("no Pss in /proc/%d/smaps_rollup", pid)
}

// fdCount is the number of open file descriptors of pid.
func fdCount(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents), err
}

func firstInt(s string) int64 {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.ParseInt(f[0], 10, 64)
	return n
}

// procStart returns the start time (clock ticks since boot) and state of
// pid, so that a recycled pid is not mistaken for the process we started.
func procStart(pid int) (start uint64, state byte, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	// Fields after the command: state is 3rd of stat, starttime the 22nd.
	if len(f) < 20 {
		return 0, 0, false
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, false
	}
	return start, f[0][0], true
}

// procRef is a process we expect to end: its pid and start time.
type procRef struct {
	pid   int
	start uint64
}

// present reports whether the process still exists (a zombie included).
func (p procRef) present() bool {
	st, _, ok := procStart(p.pid)
	return ok && st == p.start
}

// limit reads a resource limit of pid from /proc/<pid>/limits, by its
// label ("Max open files"); soft and hard, -1 for unlimited.
func limit(pid int, label string) (soft, hard int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, label)
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 2 {
			break
		}
		parse := func(s string) int64 {
			if s == "unlimited" {
				return -1
			}
			n, _ := strconv.ParseInt(s, 10, 64)
			return n
		}
		return parse(f[0]), parse(f[1]), nil
	}
	return 0, 0, fmt.Errorf("%q not in /proc/%d/limits", label, pid)
}

// raiseSoftLimit raises the soft limit of resource to its hard limit; it
// is inherited by the processes started afterwards.
func raiseSoftLimit(resource int) (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(resource, &rl); err != nil {
		return 0, err
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := syscall.Setrlimit(resource, &rl); err != nil {
			return 0, err
		}
	}
	return rl.Cur, nil
}

func readIntFile(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}
