// Package procfs reads what execmesh needs from Linux's /proc about the
// calling process (and, for the benchmark, about another).
package procfs

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Children lists the children of the calling process from
// /proc/self/task/*/children (children are listed under the thread that
// forked them, or that adopted them as subreaper). Unreadable entries are
// skipped: a thread that ended meanwhile has no children left to list.
func Children() []int { return childrenOf("self") }

// ChildrenOf lists the children of process pid, as Children does.
func ChildrenOf(pid int) []int { return childrenOf(strconv.Itoa(pid)) }

func childrenOf(proc string) []int {
	tasks, err := filepath.Glob("/proc/" + proc + "/task/*/children")
	if err != nil {
		return nil
	}
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}
