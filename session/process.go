package session

import (
	"context"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// Process runs one process tool action for the caller identified by
// scopeKey, which sees only the sessions it started; other sessions behave
// as if they did not exist. Every outcome, failures included (unknown
// action or session, stdin not writable, …), is a result with OpenClaw's
// texts and details (spec §15). poll may wait up to 30 s (args.Timeout);
// ctx ends the wait early.
func (m *Manager) Process(ctx context.Context, scopeKey string, args protocol.ProcessArgs) protocol.Result {
	if !slices.Contains(protocol.ProcessActions, args.Action) {
		return protocol.FailedResult("Invalid process action. Expected one of: " + strings.Join(protocol.ProcessActions, ", "))
	}
	if args.Action == "list" {
		return m.list(scopeKey, args)
	}
	id := args.SessionID
	if id == "" {
		return protocol.FailedResult("sessionId is required for this action.")
	}
	s := m.lookup(scopeKey, id)
	switch args.Action {
	case "poll":
		return m.poll(ctx, s, id, args.Timeout)
	case "log":
		return m.logAction(s, id, args.Offset, args.Limit)
	case "write", "send-keys", "submit", "paste":
		return m.input(ctx, s, id, args)
	case "kill":
		return m.kill(s, id)
	case "clear":
		return m.clear(s, id)
	case "remove":
		return m.remove(s, id)
	}
	return protocol.FailedResult("Unknown action " + args.Action)
}

// runtimeFacts describes a running session for poll, log and list.
type runtimeFacts struct {
	stdinWritable   bool
	waitingForInput bool
	idleMs          int64
	lastOutputAt    int64
}

// factsLocked computes runtimeFacts. Caller holds s.mu.
func (s *session) factsLocked(now time.Time) runtimeFacts {
	idle := max(now.Sub(s.lastOutput).Milliseconds(), 0)
	writable := s.writableLocked()
	return runtimeFacts{
		stdinWritable:   writable,
		waitingForInput: writable && time.Duration(idle)*time.Millisecond >= s.m.cfg.InputWaitIdle,
		idleMs:          idle,
		lastOutputAt:    s.lastOutput.UnixMilli(),
	}
}

func (f runtimeFacts) addTo(d protocol.Details) protocol.Details {
	d.StdinWritable = protocol.Some(f.stdinWritable)
	d.WaitingForInput = protocol.Some(f.waitingForInput)
	d.IdleMs = protocol.Some(f.idleMs)
	d.LastOutputAt = protocol.Some(f.lastOutputAt)
	return d
}

// writableLocked reports whether the session takes input. Only PTY
// sessions have a stdin; pipe sessions read /dev/null.
func (s *session) writableLocked() bool {
	return s.ptmx != nil && !s.stdinClosed && !s.exited
}

// nameDetail adds the derived session name when there is one.
func (s *session) nameDetail(d protocol.Details) protocol.Details {
	if s.hasName {
		d.Name = protocol.Some(s.name)
	}
	return d
}

// finishedDetailsLocked is OpenClaw's finishedSessionDetails. Caller holds
// s.mu.
func (s *session) finishedDetailsLocked() protocol.Details {
	r := s.res
	d := protocol.Details{Status: protocol.Some(r.status), SessionID: protocol.Some(s.id)}
	if r.code != nil {
		d.ExitCode = protocol.Some(*r.code)
	}
	if r.signal != "" {
		d.ExitSignal = protocol.Some(r.signal)
	}
	if r.reason != "" {
		d.ExitReason = protocol.Some(r.reason)
		d.TimedOut = protocol.Some(isTimeoutReason(r.reason))
		d.NoOutputTimedOut = protocol.Some(r.reason == reasonNoOutput)
	}
	d.Usage = protocol.Some(r.usage)
	return s.nameDetail(d)
}

// exitLineLocked is the last line of a finished poll.
func (s *session) exitLineLocked() string {
	r := s.res
	if r.stopped {
		return "\n\nProcess stopped by request (" + exitLabel(r.code, r.signal) + ")."
	}
	return "\n\nProcess exited with " + exitLabel(r.code, r.signal) + "."
}

func (m *Manager) poll(ctx context.Context, s *session, id string, timeout *int) protocol.Result {
	if s == nil {
		return protocol.FailedResult("No session found for " + id)
	}
	s.mu.Lock()
	if s.exited {
		s.mu.Unlock()
		return m.finishedPoll(s, id)
	}
	if !s.backgrounded {
		s.mu.Unlock()
		return protocol.FailedResult("Session " + id + " is not backgrounded.")
	}
	if wait := pollWait(timeout); wait > 0 && !s.exited && !s.out.hasPending() {
		s.mu.Unlock()
		s.waitActivity(ctx, wait)
		s.mu.Lock()
	}
	if s.exited {
		s.mu.Unlock()
		return m.finishedPoll(s, id)
	}
	output, dropped := s.out.drain()
	output = jsTrim(output)
	text := ""
	if s.out.lostOutput() {
		text = RetentionCapNote
	}
	if dropped {
		text += pollDroppedNote
	}
	if output == "" {
		text += "(no new output)"
	} else {
		text += output
	}
	// retryInMs: 5 s after new output, then 10, 30, 60, 60, … s.
	if output != "" {
		s.noOutputPolls = 0
	} else {
		s.noOutputPolls++
	}
	retry := retryBackoffMs[min(s.noOutputPolls, len(retryBackoffMs)-1)]
	facts := s.factsLocked(time.Now())
	if facts.waitingForInput {
		text += inputWaitHint(facts.idleMs)
	} else {
		text += "\n\nProcess still running."
	}
	d := protocol.Details{
		Status:     protocol.Some(protocol.StatusRunning),
		SessionID:  protocol.Some(id),
		Aggregated: protocol.Some(s.out.aggregated()),
		RetryInMs:  protocol.Some(retry),
	}
	s.mu.Unlock()
	m.flushUsage()
	d.Usage = protocol.Some(s.tree.usage(nil))
	return protocol.TextResult(text, s.nameDetail(facts.addTo(d)))
}

// waitActivity waits up to wait for new output or the exit, without
// sleep-polling: it blocks on the session's change channel. Output that
// arrives while the command is about to exit is reported together with the
// exit: after new output it lingers up to pollSettle for the exit.
func (s *session) waitActivity(ctx context.Context, wait time.Duration) {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		s.mu.Lock()
		if s.exited {
			s.mu.Unlock()
			return
		}
		if s.out.hasPending() {
			s.mu.Unlock()
			break
		}
		ch := s.waitChangeLocked()
		s.mu.Unlock()
		select {
		case <-ch:
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
	settle := time.NewTimer(pollSettle)
	defer settle.Stop()
	select {
	case <-s.done:
	case <-settle.C:
	case <-t.C:
	case <-ctx.Done():
	}
}

// finishedPoll answers a poll of an ended session: its unread output and
// the exit line. The first such poll acknowledges the terminal status.
func (m *Manager) finishedPoll(s *session, id string) protocol.Result {
	s.mu.Lock()
	if !s.retained {
		// A foreground session, or one evicted meanwhile.
		s.mu.Unlock()
		return protocol.FailedResult("No session found for " + id)
	}
	output, dropped := s.out.drain()
	output = jsTrim(output)
	text := ""
	if s.out.lostOutput() {
		text = RetentionCapNote
	}
	if dropped {
		text += pollDroppedNote
	}
	if output == "" {
		text += "(no new output)"
	} else {
		text += output
	}
	text = appendTimeoutGuidance(text+s.exitLineLocked(), s.res.reason)
	d := s.finishedDetailsLocked()
	d.Aggregated = protocol.Some(s.out.aggregated())
	s.noOutputPolls = -1
	ackNow, ackOwed := false, false
	if !s.terminalPolled {
		s.terminalPolled = true
		// The acknowledgement follows the exit event: if it is not out
		// yet, emitExit sends it (see there).
		if s.eventSent {
			ackNow = true
		} else {
			s.ackOwed = true
			ackOwed = true
		}
	}
	s.mu.Unlock()
	if ackNow {
		m.acknowledge(s)
	}
	if ackOwed {
		// emitExit is under way (the session is done): answer only once
		// it has sent the event and our acknowledgement, so a caller that
		// reads its events after this poll never sees the notification.
		select {
		case <-s.eventDone:
		case <-time.After(ackWaitLimit):
		}
	}
	return protocol.TextResult(text, d)
}

func (m *Manager) logAction(s *session, id string, offset, limit *int) protocol.Result {
	if s == nil {
		return protocol.FailedResult("No session found for " + id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	running := !s.exited
	if !running && !s.retained {
		return protocol.FailedResult("No session found for " + id)
	}
	if running && !s.backgrounded {
		return protocol.FailedResult("Session " + id + " is not backgrounded.")
	}
	off, lim := intOpt(offset), intOpt(limit)
	effLimit, usingDefaultTail := logWindow(off, lim)
	slice, totalLines, totalChars := sliceLogLines(s.out.aggregated(), off, effLimit)
	text := ""
	if s.out.lostOutput() {
		text = RetentionCapNote
	}
	switch {
	case slice != "":
		text += slice
	case running:
		text += LogNoOutputYet
	default:
		text += "(no output recorded)"
	}
	text += defaultTailNote(totalLines, usingDefaultTail)
	var d protocol.Details
	if running {
		facts := s.factsLocked(time.Now())
		if facts.waitingForInput {
			text += inputWaitHint(facts.idleMs)
		}
		s.m.flushUsage()
		d = s.nameDetail(facts.addTo(protocol.Details{Status: protocol.Some(protocol.StatusRunning), SessionID: protocol.Some(id), Usage: protocol.Some(s.tree.usage(nil))}))
	} else {
		if s.res.stopped {
			text += s.exitLineLocked()
		}
		text = appendTimeoutGuidance(text, s.res.reason)
		d = s.finishedDetailsLocked()
	}
	d.Output = protocol.Some(text)
	d.Total = protocol.Some(totalLines)
	d.TotalLines = protocol.Some(totalLines)
	d.TotalChars = protocol.Some(totalChars)
	d.Truncated = protocol.Some(s.out.truncated)
	return protocol.TextResult(text, d)
}

// input runs write, send-keys, submit and paste.
func (m *Manager) input(ctx context.Context, s *session, id string, args protocol.ProcessArgs) protocol.Result {
	if s == nil {
		return protocol.FailedResult("No active session found for " + id)
	}
	s.mu.Lock()
	switch {
	case s.exited:
		s.mu.Unlock()
		return protocol.FailedResult("No active session found for " + id)
	case !s.backgrounded:
		s.mu.Unlock()
		return protocol.FailedResult("Session " + id + " is not backgrounded.")
	case !s.writableLocked():
		s.mu.Unlock()
		return protocol.FailedResult("Session " + id + " stdin is not writable.")
	}
	mode := s.mode
	s.mu.Unlock()

	var data []byte
	var text string
	switch args.Action {
	case "write":
		if args.Data != nil {
			data = []byte(*args.Data)
		}
		if args.EOF {
			// A terminal has no half-close: end of input is Ctrl-D.
			data = append(data, 0x04)
		}
	case "submit":
		data = []byte("\r")
		text = "Submitted session " + id + " (sent CR)."
	case "paste":
		pasted := ""
		if args.Text != nil {
			pasted = *args.Text
		}
		data = encodePaste(pasted, args.Bracketed == nil || *args.Bracketed)
		if len(data) == 0 {
			return protocol.FailedResult("No paste text provided.")
		}
		text = "Pasted " + strconv.Itoa(utf16Len(pasted)) + " chars to session " + id + "."
	case "send-keys":
		if mode == cursorUnknown && hasCursorModeSensitiveKeys(args.Keys) {
			return protocol.FailedResult("Session " + id + " cursor key mode is not known yet. Poll or log until startup output appears, then retry send-keys.")
		}
		literal := ""
		if args.Literal != nil {
			literal = *args.Literal
		}
		var warnings []string
		data, warnings = encodeKeys(literal, args.Hex, args.Keys, mode)
		if len(data) == 0 {
			return protocol.FailedResult("No key data provided.")
		}
		text = sendKeysText(id, len(data), warnings)
	}
	if len(data) > 0 {
		deadline := time.Now().Add(ptyWriteTimeout)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		if err := s.writePTY(data, deadline); err != nil {
			return protocol.FailedResult("Failed to write to session " + id + ": " + err.Error())
		}
	}
	if args.Action == "write" {
		n := len(data)
		text = "Wrote " + strconv.Itoa(n) + " bytes to session " + id + "."
		if args.EOF {
			n-- // the Ctrl-D is not the caller's data
			text = "Wrote " + strconv.Itoa(n) + " bytes to session " + id + " (stdin closed)."
			s.mu.Lock()
			s.stdinClosed = true
			s.mu.Unlock()
		}
	}
	return protocol.TextResult(text, s.nameDetail(protocol.Details{Status: protocol.Some(protocol.StatusRunning), SessionID: protocol.Some(id)}))
}

func (m *Manager) kill(s *session, id string) protocol.Result {
	if r, ok := m.checkStoppable(s, id); !ok {
		return r
	}
	s.requestStop(errKilled)
	return protocol.TextResult("Termination requested for session "+id+".", s.nameDetail(completedDetails()))
}

// checkStoppable applies kill's and remove's preconditions, and marks the
// stop as requested by the caller.
func (m *Manager) checkStoppable(s *session, id string) (protocol.Result, bool) {
	if s == nil {
		return protocol.FailedResult("No active session found for " + id), false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exited {
		return protocol.FailedResult("No active session found for " + id), false
	}
	if !s.backgrounded {
		return protocol.FailedResult("Session " + id + " is not backgrounded."), false
	}
	s.cancelRequested = true
	s.noOutputPolls = -1
	return protocol.Result{}, true
}

func (m *Manager) clear(s *session, id string) protocol.Result {
	if s != nil {
		m.mu.Lock()
		s.mu.Lock()
		finished := s.exited && s.retained
		s.mu.Unlock()
		if finished {
			m.dropFinishedLocked(s)
		}
		m.mu.Unlock()
		if finished {
			return protocol.TextResult("Cleared session "+id+".", completedDetails())
		}
	}
	return protocol.FailedResult("No finished session found for " + id)
}

func (m *Manager) remove(s *session, id string) protocol.Result {
	if s == nil {
		return protocol.FailedResult("No session found for " + id)
	}
	s.mu.Lock()
	running := !s.exited
	s.mu.Unlock()
	if !running {
		if m.clear(s, id).Status() == protocol.StatusCompleted {
			return protocol.TextResult("Removed session "+id+".", completedDetails())
		}
		return protocol.FailedResult("No session found for " + id)
	}
	if r, ok := m.checkStoppable(s, id); !ok {
		return r
	}
	// Hide it now; it stays a blocker until its process is gone.
	m.mu.Lock()
	s.mu.Lock()
	exited := s.exited
	if !exited {
		s.removed = true
	}
	s.mu.Unlock()
	if m.sessions[s.id] == s {
		delete(m.sessions, s.id)
		if !exited {
			m.removed[s.id] = s
		} else {
			m.dropFinishedLocked(s)
		}
	}
	m.mu.Unlock()
	s.requestStop(errKilled)
	return protocol.TextResult("Removed session "+id+" (termination requested).", s.nameDetail(completedDetails()))
}

// list answers process list: background sessions and retained finished
// ones of the scope, newest first. With offset or limit only that page of
// entries is built (see ListPage).
func (m *Manager) list(scopeKey string, args protocol.ProcessArgs) protocol.Result {
	page, err := ListPageOf(args)
	if err != nil {
		return protocol.FailedResult(protocol.AsError(err).Message)
	}
	entries, total := m.listEntries(scopeKey, page, time.Now())
	if page.Paged {
		return PagedListResult(page, entries, total)
	}
	return ListResult(entries)
}

// List returns the process list entries of scopeKey, newest first: all of
// them, or with limit > 0 the limit newest, and how many there are in
// all. It is process list without the text, for hosts that answer a
// gateway, which merges and renders the lists of every host.
func (m *Manager) List(scopeKey string, limit int) (entries []protocol.Details, total int) {
	page := ListPage{}
	if limit > 0 {
		page = ListPage{Paged: true, Limit: limit}
	}
	return m.listEntries(scopeKey, page, time.Now())
}

// listEntries builds the entries of a page of the list (all when not
// paged) and counts the whole list.
func (m *Manager) listEntries(scopeKey string, page ListPage, now time.Time) ([]protocol.Details, int) {
	visible, total := m.listed(scopeKey, page)
	entries := make([]protocol.Details, 0, len(visible))
	var stale []*session
	round := listRound{m: m}
	for _, s := range visible {
		// nil when the session was swept since it was counted.
		d, ok, old := s.listEntry(now, &round)
		if ok {
			entries = append(entries, d)
		}
		if old {
			stale = append(stale, s)
		}
	}
	m.refreshUsage(stale)
	if !page.Paged {
		total = len(entries)
	}
	return entries, total
}

// listed returns the sessions of scopeKey on a page of the list, newest
// first, and the size of the whole list; when not paged, every session of
// scopeKey (some of which list may not show: the caller leaves them out
// and counts the rest).
func (m *Manager) listed(scopeKey string, page ListPage) ([]*session, int) {
	m.mu.Lock()
	var candidates []*session
	for _, s := range m.sessions {
		if s.scopeKey == scopeKey {
			candidates = append(candidates, s)
		}
	}
	m.mu.Unlock()
	visible := candidates
	if page.Paged {
		// Leave out what list does not show before sorting and
		// slicing, so that a page counts only listed sessions; entries
		// (the costly part) are built for the page only. The whole list
		// leaves them out as it builds the entries, which look again.
		visible = candidates[:0]
		for _, s := range candidates {
			s.mu.Lock()
			listed := s.listedLocked()
			s.mu.Unlock()
			if listed {
				visible = append(visible, s)
			}
		}
	}
	// Sorted by keys copied side by side: a comparison reaching into two
	// sessions was a cache miss or two, ~14 of them per session at 10 000.
	type sortKey struct {
		startedAt time.Time
		seq       uint64
		s         *session
	}
	keys := make([]sortKey, len(visible))
	for i, s := range visible {
		keys[i] = sortKey{s.startedAt, s.seq, s}
	}
	slices.SortFunc(keys, func(a, b sortKey) int {
		if c := b.startedAt.Compare(a.startedAt); c != 0 {
			return c
		}
		return int(b.seq) - int(a.seq)
	})
	for i := range keys {
		visible[i] = keys[i].s
	}
	total := len(visible)
	if page.Paged {
		lo, hi := page.Bounds(total)
		visible = visible[lo:hi]
	}
	return visible, total
}

// refreshUsage reads again, in the background, the list usage of
// sessions whose figure is older than listUsageAge, unless a refresh is
// running already.
func (m *Manager) refreshUsage(stale []*session) {
	if len(stale) == 0 || !m.usageRefresh.CompareAndSwap(false, true) {
		return
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.usageRefresh.Store(false)
		return
	}
	m.wg.Add(1)
	m.mu.Unlock()
	go func() {
		defer m.wg.Done()
		defer m.usageRefresh.Store(false)
		r := m.usageNow()
		for _, s := range stale {
			if m.root.Err() != nil {
				return
			}
			s.mu.Lock()
			// The tree is released only after the exit.
			if !s.exited && !s.keepListUsageLocked(r) {
				s.readListUsageLocked(time.Now(), r)
			}
			s.mu.Unlock()
		}
	}()
}

// listedLocked reports whether process list shows the session: a
// running background session, or a finished one still retained. Caller
// holds s.mu.
func (s *session) listedLocked() bool {
	if s.exited {
		return s.retained
	}
	return s.backgrounded
}

// listEntry is the list entry of a session; ok is false when list does
// not show it, stale is set when its usage is to be read again.
func (s *session) listEntry(now time.Time, r *listRound) (d protocol.Details, ok, stale bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.listedLocked() {
		return protocol.Details{}, false, false
	}
	if !s.exited {
		_, stale = s.listUsageLocked(now, r)
	}
	return s.listDetailsLocked(now), true, stale
}

// listDetailsLocked is the list entry of a listed session at now, with
// the usage figure listUsageLocked last read. Caller holds s.mu.
func (s *session) listDetailsLocked(now time.Time) protocol.Details {
	var d protocol.Details
	if s.exited {
		d = s.finishedDetailsLocked()
		d.RuntimeMs = protocol.Some(s.endedAt.Sub(s.startedAt).Milliseconds())
		d.EndedAt = protocol.Some(s.endedAt.UnixMilli())
	} else {
		d = s.nameDetail(s.factsLocked(now).addTo(protocol.Details{
			Status:    protocol.Some(protocol.StatusRunning),
			RuntimeMs: protocol.Some(now.Sub(s.startedAt).Milliseconds()),
			PID:       protocol.Some(s.pid),
			Usage:     protocol.Some(s.listUsage),
		}))
	}
	d.SessionID = protocol.Some(s.id)
	d.StartedAt = protocol.Some(s.startedAt.UnixMilli())
	d.Cwd = protocol.Some(s.cwd)
	d.Command = protocol.Some(s.command)
	d.Tail = protocol.Some(s.out.tail())
	d.Truncated = protocol.Some(s.out.truncated)
	return d
}

// The usage in a running session's list entry is read from a file per
// session (cpu.stat of its cgroup), which was most of what a list of ten
// thousand sessions cost; an agent that lists again and again needs no
// fresher figure than a second or so. A list shows the figure it read
// before while it is younger than listUsageMaxAge, and has figures older
// than listUsageAge read again in the background (refreshUsage); an older
// one, or none yet, it reads itself. Poll and log read it afresh.
const (
	listUsageAge    = time.Second
	listUsageMaxAge = 5 * time.Second
)

// listUsageLocked returns the usage of a running session for its list
// entry, and whether it is to be read again. Caller holds s.mu.
func (s *session) listUsageLocked(now time.Time, r *listRound) (u protocol.Usage, stale bool) {
	age := now.Sub(s.listUsageAt)
	if age < listUsageAge && age >= 0 {
		return s.listUsage, false
	}
	round := r.get()
	if s.keepListUsageLocked(round) {
		return s.listUsage, false // exact at round, at most usageFlushEvery ago
	}
	if s.listUsageAt.IsZero() || age >= listUsageMaxAge || age < 0 {
		s.readListUsageLocked(now, round)
		return s.listUsage, false
	}
	return s.listUsage, true // listUsageAge old or more
}

// listRound is the usage round of one list, taken when a figure in it
// first needs it.
type listRound struct {
	m     *Manager
	r     usageRound
	taken bool
}

func (l *listRound) get() usageRound {
	if !l.taken {
		l.r, l.taken = l.m.usageNow(), true
	}
	return l.r
}

// completedDetails is {status: "completed"}.
func completedDetails() protocol.Details {
	return protocol.Details{Status: protocol.Some(protocol.StatusCompleted)}
}

// ListResult is the result of an unpaged process list: OpenClaw's text and
// {status: "completed", sessions: entries}, entries newest first.
func ListResult(entries []protocol.Details) protocol.Result {
	if entries == nil {
		entries = []protocol.Details{}
	}
	return protocol.TextResult(ListText(entries), protocol.Details{
		Status:   protocol.Some(protocol.StatusCompleted),
		Sessions: protocol.Some(entries),
	})
}

// ListPage is the page of a process list call that passed offset or
// limit: the entries [Offset, Offset+Limit) of the newest-first list, or
// from Offset to the end when Limit is 0. Without either (Paged false)
// list answers every entry with OpenClaw's text and details.
type ListPage struct {
	// Paged is set when the call passed offset or limit.
	Paged bool
	// Offset is the index of the first entry shown (0 when absent).
	Offset int
	// Limit is the most entries shown; 0 when absent (to the end).
	Limit int
}

// ListPageOf reads the page of a process list call from its offset and
// limit. A negative offset, or a limit below 1, is an ErrInvalidRequest
// *protocol.Error naming the parameter, as argument decoding answers
// for process log's offset and limit.
func ListPageOf(args protocol.ProcessArgs) (ListPage, error) {
	var p ListPage
	if args.Offset != nil {
		if *args.Offset < 0 {
			return ListPage{}, protocol.Errorf(protocol.ErrInvalidRequest, "%s parameter %q must not be negative", protocol.ToolProcess, "offset")
		}
		p.Paged, p.Offset = true, *args.Offset
	}
	if args.Limit != nil {
		if *args.Limit < 1 {
			return ListPage{}, protocol.Errorf(protocol.ErrInvalidRequest, "%s parameter %q must be at least 1 for list", protocol.ToolProcess, "limit")
		}
		p.Paged, p.Limit = true, *args.Limit
	}
	return p, nil
}

// End is the number of newest entries the page is cut from:
// Offset+Limit, or 0 (all of them) when Limit is 0. A host asked for a
// page need only produce its End newest entries.
func (p ListPage) End() int {
	if p.Limit == 0 {
		return 0
	}
	if p.Offset > math.MaxInt-p.Limit {
		return math.MaxInt
	}
	return p.Offset + p.Limit
}

// Bounds returns the page's part [lo, hi) of a newest-first list of total
// entries.
func (p ListPage) Bounds(total int) (lo, hi int) {
	lo = min(p.Offset, total)
	hi = total
	if end := p.End(); end > 0 {
		hi = min(end, total)
	}
	return lo, hi
}

// PagedListResult is the result of a paged process list: entries is the
// page (the Bounds of the full newest-first list) and total the size of
// that list. The details carry sessions, total, offset, limit (when
// given) and nextOffset (when entries remain after the page). The text is
// ListText of the page and, unless the page is the whole list, a last
// line naming it: "(sessions 1–50 of 9974; next: offset=50)", "(session
// 9974 of 9974)"; a page beyond the end is only "(no sessions at offset
// 200; 120 in total)".
func PagedListResult(p ListPage, entries []protocol.Details, total int) protocol.Result {
	if entries == nil {
		entries = []protocol.Details{}
	}
	text, d := pagedList(p, total, func() string { return ListText(entries) })
	d.Sessions = protocol.Some(entries)
	return protocol.TextResult(text, d)
}

// ListEntriesResult is ListResult of the entries' details, kept as the
// entries are.
func ListEntriesResult(entries []protocol.ListEntry) protocol.ListResult {
	return protocol.ListResult{Text: ListEntriesText(entries), Details: protocol.Details{Status: protocol.Some(protocol.StatusCompleted)}, Entries: entries}
}

// PagedListEntriesResult is PagedListResult of the entries' details,
// kept as the entries are.
func PagedListEntriesResult(p ListPage, entries []protocol.ListEntry, total int) protocol.ListResult {
	text, d := pagedList(p, total, func() string { return ListEntriesText(entries) })
	return protocol.ListResult{Text: text, Details: d, Entries: entries}
}

// pagedList is the text and details but for sessions of PagedListResult;
// list is ListText of the page.
func pagedList(p ListPage, total int, list func() string) (string, protocol.Details) {
	lo, hi := p.Bounds(total)
	d := protocol.Details{
		Status: protocol.Some(protocol.StatusCompleted),
		Total:  protocol.Some(total),
		Offset: protocol.Some(p.Offset),
	}
	if p.Limit > 0 {
		d.Limit = protocol.Some(p.Limit)
	}
	if hi < total {
		d.NextOffset = protocol.Some(hi)
	}
	var text string
	switch {
	case lo == 0 && hi == total:
		text = list()
	case lo == hi:
		text = "(no sessions at offset " + itoa(p.Offset) + "; " + itoa(total) + " in total)"
	default:
		span := "sessions " + itoa(lo+1) + "–" + itoa(hi)
		if hi-lo == 1 {
			span = "session " + itoa(hi)
		}
		text = list() + "\n\n(" + span + " of " + itoa(total)
		if hi < total {
			text += "; next: offset=" + itoa(hi)
		}
		text += ")"
	}
	return text, d
}

// ListText renders the text of process list for list entries (the
// details.sessions of list results, possibly merged from several hosts
// and decoded from JSON), one line per session:
//
//	<sessionId> <status padded to 9> <runtime>[ [overall-timeout]][ [input-wait]] :: <name or command>
func ListText(sessions []protocol.Details) string {
	return listText(len(sessions), func(i int) listLine {
		d := &sessions[i] // large: not copied
		return listLine{id: d.SessionID.Value(), status: d.Status.Value(), runtimeMs: d.RuntimeMs,
			exitReason: d.ExitReason.Value(), waiting: d.WaitingForInput.Value(), name: d.Name.Value(), command: d.Command.Value()}
	})
}

// ListEntriesText is ListText of the entries' details.
func ListEntriesText(entries []protocol.ListEntry) string {
	return listText(len(entries), func(i int) listLine {
		e := &entries[i]
		return listLine{id: e.SessionID, status: e.Status, runtimeMs: e.RuntimeMs,
			exitReason: e.ExitReason, waiting: e.WaitingForInput, name: e.Name, command: e.Command}
	})
}

// listText is the list text of n entries; line(i) is what entry i shows.
func listText(n int, line func(i int) listLine) string {
	if n == 0 {
		return emptyListText
	}
	var b strings.Builder
	b.Grow(80 * n)
	for i := range n {
		if i > 0 {
			b.WriteByte('\n')
		}
		writeListLine(&b, line(i))
	}
	return b.String()
}

// listLine is what a line of the list text shows of an entry.
type listLine struct {
	id, status, exitReason, name, command string
	runtimeMs                             protocol.Opt[int64]
	waiting                               bool
}

// writeListLine writes l's line of the list text.
func writeListLine(b *strings.Builder, l listLine) {
	label := truncateMiddle(l.command, 120)
	if l.name != "" {
		label = truncateMiddle(l.name, 80)
	}
	var scratch [32]byte
	runtime := []byte("n/a")
	if ms, ok := l.runtimeMs.Get(); ok {
		if c, ok := appendCompactDuration(scratch[:0], float64(ms)); ok {
			runtime = c
		}
	}
	b.WriteString(l.id)
	b.WriteByte(' ')
	b.WriteString(l.status)
	for n := utf16Len(l.status); n < 9; n++ { // padStatus(status, 9), without a string
		b.WriteByte(' ')
	}
	b.WriteByte(' ')
	b.Write(runtime)
	if isTimeoutReason(l.exitReason) {
		b.WriteString(" [")
		b.WriteString(l.exitReason)
		b.WriteByte(']')
	}
	if l.waiting {
		b.WriteString(" [input-wait]")
	}
	b.WriteString(" :: ")
	b.WriteString(label)
}

// itoa is strconv.Itoa, named for brevity in result texts.
func itoa(n int) string { return strconv.Itoa(n) }
