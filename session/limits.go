package session

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// Every default, clamp and fixed size of the session core lives in this
// file, so that a reader can check them against OpenClaw in one place
// (openclaw-exec-spec.md §3.2, conformance/clamps.json).

// Yield window of a foreground exec (tools.exec.backgroundMs).
const (
	defaultYieldMs = 10000
	minYieldMs     = 10
	maxYieldMs     = 120000
)

// Default exec timeout in seconds (tools.exec.timeoutSec). It applies to
// background and yielded runs too; a request timeout <= 0 disables it.
const defaultTimeoutSec = 1800

// maxTimeout is the longest timeout a timer is armed with. JavaScript's
// setTimeout caps delays at 2^31-1 ms, so OpenClaw cannot wait longer
// either; it also keeps time.Duration far from overflow.
const maxTimeout = time.Duration(math.MaxInt32) * time.Millisecond

// Output caps, in UTF-16 code units as OpenClaw counts string lengths.
const (
	defaultMaxOutputChars = 200000 // retained output per session; also the maximum
	minOutputChars        = 1000
	maxOutputChars        = 200000

	defaultPendingMaxOutputChars = 30000 // unread output per stream
	minPendingOutputChars        = 1000
	maxPendingOutputChars        = 200000

	tailChars          = 2000 // details.tail and ExitEvent.Tail
	notifyTailChars    = 400  // output considered for an exit notification
	notifySnippetChars = 180  // longest notification snippet (179 + "…")
)

// Finished-session retention.
const (
	defaultJobTTL = 30 * time.Minute
	minJobTTL     = time.Minute
	maxJobTTL     = 3 * time.Hour

	defaultMaxFinished      = 50
	defaultMaxFinishedChars = 2000000
)

// Input-wait detection (OPENCLAW_PROCESS_INPUT_WAIT_IDLE_MS).
const (
	defaultInputWaitIdle = 15 * time.Second
	minInputWaitIdle     = time.Second
	maxInputWaitIdle     = 10 * time.Minute
)

// Process control.
const (
	defaultKillGrace = 5 * time.Second // SIGTERM → SIGKILL (DESIGN.md §7)
	defaultDrainWait = 2 * time.Second // output drain after exit while a live process holds the output

	// ptyWriteTimeout bounds one write to a PTY whose program stopped
	// reading, so that a process call cannot hang on a full input queue.
	ptyWriteTimeout = 10 * time.Second
	// ackWaitLimit bounds how long a terminal poll waits for the exit
	// event it must follow (emitExit is already running then).
	ackWaitLimit = 5 * time.Second

	// snapshotMaxAge is how long a /proc snapshot is reused by
	// terminations that run at the same time.
	snapshotMaxAge = 25 * time.Millisecond
	// dsrReplyTimeout bounds the cursor-position reply written from the
	// output reader, which must never stall output collection for long.
	dsrReplyTimeout = time.Second
)

// PTY geometry and terminal type.
const (
	ptyCols     = 120
	ptyRows     = 30
	defaultTERM = "xterm-256color"
)

// process tool limits.
const (
	maxPollWaitMs = 30000 // poll timeout cap (ms)
	// pollSettle is how long a waiting poll that got new output lingers
	// for the exit, so that "print, then exit" is one terminal answer, as
	// OpenClaw's 250 ms poll steps make it.
	pollSettle          = 250 * time.Millisecond
	defaultLogTailLines = 200 // log window when neither offset nor limit is given
)

// retryBackoffMs is the retryInMs suggestion for consecutive polls without
// new output; the last value repeats.
var retryBackoffMs = [...]int{5000, 10000, 30000, 60000}

// readBufferSize is the size of one read from a command's stdout, stderr or
// PTY. Large reads keep the per-byte cost of the output path low.
const readBufferSize = 64 << 10

// A pipe that delivers floodBytes within floodWindow is read as a flood
// (readBuffer): 100 MiB/s, which a command producing output for a person
// to read does not reach, and head or cat of a large file exceed tenfold.
const (
	floodBytes  = 1 << 20
	floodWindow = 10 * time.Millisecond
)

// pipeBufferSize is the kernel buffer requested for a flooding pipe
// (F_SETPIPE_SZ), so that the writer goes on while the reader is off the
// CPU. A reader alone on a quiet machine is faster with the default
// 64 KiB (the writer waits on the pipe's lock while a reader copies out a
// large backlog), but in the whole system, where the reader shares two
// CPUs with the gateway, the NATS server and the poller, it is faster:
// 1 GB of NUL bytes took a median 1.14x (host=gateway) and 1.28x
// (host=node) a bare Go reader with it, 1.25x and 1.49x without it (nine
// runs each, on the project's machine).
const pipeBufferSize = 1 << 20

// floodReadBuffer bounds one gathered read of a flooding pipe. Larger
// batches pay the per-batch work (cutting to the retained window and
// copying that window) less often, but every read then lands in memory
// that has left the caches, and output that passes through unchanged is
// scanned there once more. 1 GB of text through the session core took a
// median 1.02x a bare Go reader with 1 MiB batches (two runs of 20),
// 1.10-1.13x with 4 MiB (BenchmarkExecFloodVsBare/text, on the project's
// machine: 2 MiB of L2 per core).
const floodReadBuffer = 1 << 20

// floodWideBuffer is the batch of a flood whose output the sanitizer
// cuts to the retained window (readBuffer.widen), so that each batch
// costs that window: for NUL bytes each materializes the
// window's 200 000 units of \x00 and copies them twice, about 450 KB.
// 1 GB of NUL bytes through the session core took a median 1.27-1.39x a
// bare Go reader with 1 MiB batches (eight runs of 20), 1.20-1.21x with
// 2 MiB, 0.98-1.13x widening to 4 MiB (six runs), 1.17-1.25x with 8 MiB
// (BenchmarkExecFloodVsBare/nul). Through the whole system, where runs
// of the same code spread wider than that, 15 interleaved runs of make
// bench's throughput section gave 1.45x (host=gateway) and 1.52x
// (host=node) with 1 MiB, 1.15x and 1.24x with 4 MiB for every flood;
// 15 more gave 1.25x and 1.18x with 1 MiB, 1.14x and 0.98x widening.
const floodWideBuffer = 4 << 20

// floodBuffersMax bounds the flood buffers a Manager's readers hold at
// once (16 wide floods); a flood beyond it is read in ordinary reads, and
// one that cannot widen stays at floodReadBuffer.
const floodBuffersMax = 64 << 20

// Environment variables: read by ApplyEnv, and set for commands.
const (
	envYieldMs          = "OPENCLAW_BASH_YIELD_MS"
	envYieldMsLegacy    = "PI_BASH_YIELD_MS"
	envMaxOutput        = "OPENCLAW_BASH_MAX_OUTPUT_CHARS"
	envMaxOutputLegacy  = "PI_BASH_MAX_OUTPUT_CHARS"
	envPendingMaxOutput = "OPENCLAW_BASH_PENDING_MAX_OUTPUT_CHARS"
	envJobTTLMs         = "OPENCLAW_BASH_JOB_TTL_MS"
	envJobTTLMsLegacy   = "PI_BASH_JOB_TTL_MS"
	envInputWaitIdleMs  = "OPENCLAW_PROCESS_INPUT_WAIT_IDLE_MS"
	envShellMarker      = "OPENCLAW_SHELL"
	envShellMarkerValue = "exec"
	envSessionMarker    = "EXECMESH_SESSION"
	envTERM             = "TERM"
)

// maxSafeInteger is JavaScript's Number.MAX_SAFE_INTEGER: larger values do
// not parse (clamps.json).
const maxSafeInteger = 1<<53 - 1

// DefaultConfig returns a Config holding every default. Each call returns a
// fresh value.
func DefaultConfig() Config {
	return Config{
		DefaultYieldMs:        defaultYieldMs,
		DefaultTimeoutSec:     defaultTimeoutSec,
		MaxOutputChars:        defaultMaxOutputChars,
		PendingMaxOutputChars: defaultPendingMaxOutputChars,
		JobTTL:                defaultJobTTL,
		InputWaitIdle:         defaultInputWaitIdle,
		KillGrace:             defaultKillGrace,
		MaxFinished:           defaultMaxFinished,
		MaxFinishedChars:      defaultMaxFinishedChars,
		DrainWait:             defaultDrainWait,
		NotifyOnExit:          true,
	}
}

// ApplyEnv applies OpenClaw's environment overrides, read through getenv
// (os.Getenv in production, a map in tests):
//
//   - OPENCLAW_BASH_YIELD_MS (legacy PI_BASH_YIELD_MS): DefaultYieldMs, clamped 10..120000
//   - OPENCLAW_BASH_MAX_OUTPUT_CHARS (legacy PI_BASH_MAX_OUTPUT_CHARS): MaxOutputChars, clamped 1000..200000
//   - OPENCLAW_BASH_PENDING_MAX_OUTPUT_CHARS: PendingMaxOutputChars, clamped 1000..200000
//   - OPENCLAW_BASH_JOB_TTL_MS (legacy PI_BASH_JOB_TTL_MS): JobTTL, clamped 1 min..3 h
//   - OPENCLAW_PROCESS_INPUT_WAIT_IDLE_MS: InputWaitIdle, clamped 1 s..10 min
//
// Values must be strict integers (surrounding whitespace allowed, an
// optional sign, ASCII digits, at most 2^53-1). The legacy variable is read
// only when the primary one is unset or empty; a non-empty primary that does
// not parse leaves the setting unchanged, as in OpenClaw.
func (c *Config) ApplyEnv(getenv func(string) string) {
	if getenv == nil {
		return
	}
	if v, ok := readEnvInt(getenv, envYieldMs, envYieldMsLegacy); ok {
		c.DefaultYieldMs = int(clampInt64(v, minYieldMs, maxYieldMs))
	}
	if v, ok := readEnvInt(getenv, envMaxOutput, envMaxOutputLegacy); ok {
		c.MaxOutputChars = int(clampInt64(v, minOutputChars, maxOutputChars))
	}
	if v, ok := readEnvInt(getenv, envPendingMaxOutput, ""); ok {
		c.PendingMaxOutputChars = int(clampInt64(v, minPendingOutputChars, maxPendingOutputChars))
	}
	if v, ok := readEnvInt(getenv, envJobTTLMs, envJobTTLMsLegacy); ok {
		c.JobTTL = time.Duration(clampInt64(v, minJobTTL.Milliseconds(), maxJobTTL.Milliseconds())) * time.Millisecond
	}
	if v, ok := readEnvInt(getenv, envInputWaitIdleMs, ""); ok {
		c.InputWaitIdle = time.Duration(clampInt64(v, minInputWaitIdle.Milliseconds(), maxInputWaitIdle.Milliseconds())) * time.Millisecond
	}
}

// normalized returns c with zero or out-of-range values replaced: zero
// means "the default", and the documented ranges are enforced so that a
// configuration file cannot exceed what the environment could set.
func (c Config) normalized() Config {
	if c.DefaultYieldMs <= 0 {
		c.DefaultYieldMs = defaultYieldMs
	}
	c.DefaultYieldMs = int(clampInt64(int64(c.DefaultYieldMs), minYieldMs, maxYieldMs))
	if c.DefaultTimeoutSec <= 0 {
		c.DefaultTimeoutSec = defaultTimeoutSec
	}
	if c.MaxOutputChars <= 0 {
		c.MaxOutputChars = defaultMaxOutputChars
	}
	c.MaxOutputChars = int(clampInt64(int64(c.MaxOutputChars), minOutputChars, maxOutputChars))
	if c.PendingMaxOutputChars <= 0 {
		c.PendingMaxOutputChars = defaultPendingMaxOutputChars
	}
	c.PendingMaxOutputChars = int(clampInt64(int64(c.PendingMaxOutputChars), minPendingOutputChars, maxPendingOutputChars))
	if c.JobTTL <= 0 {
		c.JobTTL = defaultJobTTL
	}
	c.JobTTL = clampDuration(c.JobTTL, minJobTTL, maxJobTTL)
	if c.InputWaitIdle <= 0 {
		c.InputWaitIdle = defaultInputWaitIdle
	}
	c.InputWaitIdle = clampDuration(c.InputWaitIdle, minInputWaitIdle, maxInputWaitIdle)
	if c.KillGrace <= 0 {
		c.KillGrace = defaultKillGrace
	}
	if c.MaxFinished <= 0 {
		c.MaxFinished = defaultMaxFinished
	}
	if c.MaxFinishedChars <= 0 {
		c.MaxFinishedChars = defaultMaxFinishedChars
	}
	if c.DrainWait <= 0 {
		c.DrainWait = defaultDrainWait
	}
	return c
}

// readEnvInt is OpenClaw's readEnvInt: the primary variable when it is
// non-empty, else the legacy one, parsed strictly.
func readEnvInt(getenv func(string) string, primary, legacy string) (int64, bool) {
	raw := getenv(primary)
	if raw == "" && legacy != "" {
		raw = getenv(legacy)
	}
	return parseStrictInteger(raw)
}

// parseStrictInteger accepts what OpenClaw's parseStrictInteger accepts:
// after a JavaScript trim, ^[+-]?\d+$ with ASCII digits, and a safe integer.
func parseStrictInteger(raw string) (int64, bool) {
	s := jsTrim(raw)
	if s == "" {
		return 0, false
	}
	digits := s
	if digits[0] == '+' || digits[0] == '-' {
		digits = digits[1:]
	}
	if digits == "" {
		return 0, false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseInt(strings.TrimPrefix(s, "+"), 10, 64)
	if err != nil || v > maxSafeInteger || v < -maxSafeInteger {
		return 0, false
	}
	return v, true
}

// yieldWindow resolves a request's yield window: clampWithDefault(yieldMs ??
// default, default, 10, 120000). NaN means the default, which is not
// re-clamped (it already was).
func yieldWindow(yieldMs *float64, def int) time.Duration {
	if yieldMs == nil || math.IsNaN(*yieldMs) {
		return time.Duration(def) * time.Millisecond
	}
	ms := math.Min(math.Max(*yieldMs, minYieldMs), maxYieldMs)
	return time.Duration(ms * float64(time.Millisecond))
}

// resolveTimeout returns the timeout of a run in seconds and as a
// duration; ok is false when the run has no timeout.
func resolveTimeout(timeoutSec *float64, def int) (sec float64, d time.Duration, ok bool) {
	sec = float64(def)
	if timeoutSec != nil {
		sec = *timeoutSec
	}
	if math.IsNaN(sec) || math.IsInf(sec, 0) || sec <= 0 {
		return sec, 0, false
	}
	ms := sec * 1000
	if ms >= float64(maxTimeout/time.Millisecond) {
		return sec, maxTimeout, true
	}
	return sec, time.Duration(ms * float64(time.Millisecond)), true
}

// pollWait resolves the poll timeout: clamp(floor(ms), 0, 30000).
func pollWait(ms *int) time.Duration {
	if ms == nil || *ms <= 0 {
		return 0
	}
	return time.Duration(min(*ms, maxPollWaitMs)) * time.Millisecond
}

func clampInt64(v, lo, hi int64) int64 { return min(max(v, lo), hi) }

func clampDuration(v, lo, hi time.Duration) time.Duration { return min(max(v, lo), hi) }
