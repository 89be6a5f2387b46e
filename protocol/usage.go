package protocol

// Usage scopes (Usage.Scope).
const (
	// UsageScopeTree: measured from the session's cgroup, so it covers
	// every process the command started, escapees included.
	UsageScopeTree = "tree"
	// UsageScopeLeader: measured by the kernel for the session leader and
	// the children it waited for (wait4 rusage, /proc/<pid>/stat), where
	// no cgroup holds the session (process-group containment).
	UsageScopeLeader = "leader"
)

// Usage is what a session's processes cost: details.usage of exec, poll,
// log and list results, and ExitEvent.Usage. CPU times are whole
// milliseconds. MemoryPeakBytes and PidsPeak are present only where the
// memory and pids controllers are enabled for the session's cgroup.
type Usage struct {
	CPUUserMs       int64   `json:"cpuUserMs"`
	CPUSystemMs     int64   `json:"cpuSystemMs"`
	MemoryPeakBytes *uint64 `json:"memoryPeakBytes,omitempty"`
	PidsPeak        *uint64 `json:"pidsPeak,omitempty"`
	// Scope is UsageScopeTree or UsageScopeLeader: what was measured.
	Scope string `json:"scope"`
}
