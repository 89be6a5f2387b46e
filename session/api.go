package session

// This file fixes the exported API of the session core that the gateway and
// the node agent program against. Keep it stable; internals are free.

import (
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// Config configures a Manager. Build it with DefaultConfig (and ApplyEnv),
// then adjust; zero durations and sizes are replaced by the defaults.
type Config struct {
	Logger *slog.Logger

	// Shell is the shell used as `<Shell> -c <command>` (bash gets
	// --noprofile --norc, zsh -f, fish --no-config); empty means
	// ResolveShell(os.Getenv("SHELL"), os.Getenv("PATH")).
	Shell string

	DefaultYieldMs        int           // 10000, clamped 10..120000
	DefaultTimeoutSec     int           // 1800; <= 0 means the default
	MaxOutputChars        int           // 200000 retained chars per session, clamped 1000..200000
	PendingMaxOutputChars int           // 30000 unread chars per stream, clamped 1000..200000
	JobTTL                time.Duration // finished-session retention, 30 min, clamped 1 min..3 h
	InputWaitIdle         time.Duration // 15 s, clamped 1 s..10 min
	KillGrace             time.Duration // SIGTERM→SIGKILL grace, 5 s
	MaxFinished           int           // 50 finished sessions kept
	MaxFinishedChars      int           // 2000000 chars of output across finished sessions
	DrainWait             time.Duration // wait for output after exit while a live process holds it open, 2 s

	NotifyOnExit             bool // default true
	NotifyOnExitEmptySuccess bool // default false

	// OnExit is called once for every backgrounded session that exits, in
	// its own goroutine, never under a Manager lock.
	OnExit func(protocol.ExitEvent)
	// OnAcknowledged is called when a poll delivered a session's terminal
	// status, so a still-queued exit notification can be dropped.
	OnAcknowledged func(scopeKey, sessionID string)
	// OnOutput, when set, is called with the number of raw bytes each read
	// of a command's output returned (before sanitizing), on the reader's
	// goroutine: it must be cheap and must not block.
	OnOutput func(n int)
	// OnUsage, when set, is called once for every session that ended
	// (foreground ones too) with what its processes cost (metrics).
	OnUsage func(protocol.Usage)

	// Reaper is the process's Reaper, shared by all its Managers; nil
	// makes the Manager start its own (and close it with itself).
	Reaper *Reaper
	// Containment is ContainmentAuto (""), ContainmentCgroup or
	// ContainmentProcessGroup: how process trees are held (contain.go).
	Containment string
	// StateDir, when set, is a directory of this Manager's own (no other
	// Manager may use it) where each running session is recorded, so
	// that the next Manager on it ends what a crashed run left and
	// reports the sessions it lost (OnLost).
	StateDir string
	// OnLost is called by NewManager, before it returns, once for every
	// session of a previous run on StateDir whose exit was never
	// recorded (the daemon was killed or crashed while it ran); its
	// leftover processes were ended first. The gateway turns these into
	// exec.lost events for the session's agent. It is called on
	// NewManager's goroutine, so it must not call the Manager.
	OnLost func(LostSession)
	// ConfirmExits (with StateDir) keeps the record of a background
	// session whose exit event went to OnExit until ExitStored confirms
	// the event was stored: a daemon stopped or killed before that (its
	// event store full or failing) leaves the record to the next
	// Manager, which reports the session lost (OnLost) with its exit
	// status, instead of nothing. The record of a session reported lost
	// is kept the same way, until ExitStored(its id) confirms the lost
	// report was stored, so a run that stops before that leaves it to
	// the next one again.
	ConfirmExits bool
}

// ExecRequest is one exec call as the session core sees it: host
// resolution, policy and environment filtering have already happened.
type ExecRequest struct {
	// SessionID, when set, is the id the session gets (the gateway
	// allocates fleet-unique ids): ValidSessionID's, lower-case letters,
	// digits and '-', at most MaxSessionIDLen. Exec fails with an
	// ErrConflict error when a session of this Manager (running,
	// retained, or removed and still running) has it. Empty picks a free
	// readable id (nimble-coral).
	SessionID string
	// Command is the command text as the caller wrote it (shown in list,
	// used for names).
	Command string
	// Argv, when set, is spawned instead of [shell, "-c", Command]
	// (sandbox runtimes, approved argv).
	Argv []string
	// Workdir is the working directory; empty means the process cwd. A
	// missing or non-directory workdir gives a failed result and nothing runs.
	Workdir string
	// Env is the complete environment (KEY=VALUE). nil means os.Environ().
	// OPENCLAW_SHELL=exec and EXECMESH_SESSION=<session id> are always
	// added; PTYs get TERM=xterm-256color unless Env sets TERM (with a nil
	// Env the daemon's own TERM is not used).
	Env []string

	YieldMs    *float64 // nil → Config.DefaultYieldMs; clamped 10..120000
	Background bool     // background at once
	TimeoutSec *float64 // nil → Config.DefaultTimeoutSec; <= 0 → none
	PTY        bool

	// Synchronous runs in the foreground until exit, ignoring YieldMs and
	// Background (process tool denied); Warnings should say so.
	Synchronous bool

	// Limits are the effective resource limits of the session's cgroup
	// (config, agent and call already combined). Exec refuses non-zero
	// limits where their controllers are missing (see CheckLimits).
	Limits protocol.Limits

	// ExtraFiles are passed to the command from descriptor 3 on, and
	// SysProcAttr, when set, adjusts how it is started (namespaces): the
	// confinement helper's supervisor socket and namespaces.
	ExtraFiles  []*os.File
	SysProcAttr func(*syscall.SysProcAttr)

	ScopeKey   string   // sessionKey that may see the session via process
	Warnings   []string // prefixed to the result text
	NotifyOff  bool     // no exec.exit notification for this session
	OnExitHook func(protocol.ExitEvent)

	// Attach, when set, is bound to the session before its process runs,
	// so that it sees every byte of output (NewAttachment). With
	// AttachOptions.Stdin a pipe session's stdin is a pipe the attachment
	// writes; the request should be Background.
	Attach *Attachment
}

// Blocker is an active gateway-host process that blocks a safe restart.
type Blocker struct {
	SessionID string `json:"sessionId"`
	ScopeKey  string `json:"sessionKey"`
	PID       int    `json:"pid"`
	Command   string `json:"command"`
	Removed   bool   `json:"removed"` // hidden by remove, process still alive
	StartedAt int64  `json:"startedAt"`
}
