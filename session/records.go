package session

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/execmesh/execmesh/internal/cgroup"
	"github.com/execmesh/execmesh/protocol"
)

// Session records. A Manager with a state directory (Config.StateDir)
// keeps one small file per session whose processes may be running, written
// with one write(2) when the command has started and blanked when its last
// process is gone. The files are slots, slot-<n>.json, reused from session
// to session: a record overwrites the slot in place (padded with spaces to
// what the slot held), and a blanked slot holds only spaces. Creating and
// unlinking a file per session cost ~0.3 ms of CPU per command on ext4
// (its inode allocator skips recently deleted inodes), more than the rest
// of the session core; an overwrite costs a few microseconds. At most
// maxFreeSlots blank slots are kept; the rest are removed, and Close
// removes them all.
// Nothing is synced: the files need to survive the daemon's death (kill
// -9, a crash), not the machine's, whose reboot ends the processes too.
// A new Manager on the same directory reads what a previous run left,
// ends those processes (cgroup.kill of the recorded group, or SIGKILL to
// the recorded process group where the leader's pid and start time still
// match and to members that started after it) and reports every session
// whose exit was never recorded through Config.OnLost.

// record is one session's file.
type record struct {
	SessionID  string `json:"sessionId"`
	SessionKey string `json:"sessionKey,omitempty"`
	Command    string `json:"command"`
	PID        int    `json:"pid"`
	// PIDStart is the leader's start time in clock ticks since boot, so a
	// reused pid is never mistaken for it.
	PIDStart  uint64 `json:"pidStart"`
	StartedAt int64  `json:"startedAt"` // unix ms
	Cgroup    string `json:"cgroup,omitempty"`
	PGID      int    `json:"pgid,omitempty"`
	SID       int    `json:"sid,omitempty"`
	// Exited is set when the leader's exit was recorded (and reported)
	// while processes it started still ran.
	Exited bool `json:"exited,omitempty"`
	// ExitPending is set (with ConfirmExits) once the session ended and
	// its exit event went out, until the event is confirmed stored;
	// ExitStatus says how it ended.
	ExitPending bool   `json:"exitPending,omitempty"`
	ExitStatus  string `json:"exitStatus,omitempty"`
	// LostReason is set on a record a Manager kept after it reported the
	// session lost (ConfirmExits), until ExitStored: its processes were
	// ended, and a next Manager reports it again with this reason.
	LostReason string `json:"lostReason,omitempty"`
}

// LostSession is a session of an earlier run of a Manager on the same
// StateDir whose exit was never recorded: the process that ran it ended
// first (kill -9, a crash, an OOM kill of the daemon). Whatever was left
// of its processes was ended before the callback.
type LostSession struct {
	SessionID  string
	SessionKey string
	Command    string
	StartedAt  time.Time
	// Ended is the number of its processes that still ran and were ended.
	Ended int
	// Reason says what is known, for the agent ("exec.lost" event text).
	Reason string
}

// maxFreeSlots bounds the blank record slots a Manager keeps for reuse.
const maxFreeSlots = 64

// maxOpenSlots bounds the record files a Manager keeps open. A foreground
// session's record is written at its start, on the command's path, and
// blanked a moment after its end: through a kept descriptor each is one
// pwrite(2) instead of an open, a write and a close (the open's path walk
// was most of it). The files are kept by foreground sessions and by the
// free slots they leave; background sessions take slots without one (and
// give back the file of a foreground session that turns background), so
// that they hold only their pipes.
const maxOpenSlots = 16

// recordSlots hands out the state dir's record files.
type recordSlots struct {
	mu    sync.Mutex
	next  int                   // number of the next new slot
	free  []recordSlot          // blank slots without an open file
	inUse map[string]recordSlot // tree name → its slot
	// freeOpen are blank slots whose file is kept open; open counts the
	// slot files kept open, in use or free (at most maxOpenSlots). A kept
	// file is written and closed only under mu.
	freeOpen []recordSlot
	open     int
	// held are the trees (by session id) whose record waits for
	// ExitStored (Config.ConfirmExits); heldTrees the same by tree name,
	// so that a tree's end finds its hold without a scan of every
	// session's.
	held      map[string]*heldRecord
	heldTrees map[string]*heldRecord
	// heldIDs mirrors the keys of held (written with it, under mu) for
	// Manager.takenLocked, which runs under the Manager's lock and must
	// not wait for mu (held across record writes).
	heldIDs sync.Map
	// failure is the error of the last record write, nil once one
	// succeeds (RecordsHealthy).
	failure atomic.Pointer[error]
	// probedAt is when RecordsHealthy last tried a write (unix ns).
	probedAt atomic.Int64
}

// heldRecord is a record kept until its session's exit event is stored.
type heldRecord struct {
	tree     string
	exitOpen bool // the exit event is not confirmed stored yet
	gone     bool // the tree's processes are gone
}

// recordSlot is one file and the number of bytes it holds.
type recordSlot struct {
	n    int
	size int
	// file is the slot's file kept open (maxOpenSlots), or nil.
	file *os.File
}

// takeLocked takes a slot for a new record: for a foreground session
// (keep) one whose file is open when there is one, otherwise one
// without; a new slot when none is free. Caller holds mu.
func (rs *recordSlots) takeLocked(keep bool) recordSlot {
	pop := func(l *[]recordSlot) recordSlot {
		k := len(*l) - 1
		sl := (*l)[k]
		*l = (*l)[:k]
		return sl
	}
	switch {
	case keep && len(rs.freeOpen) > 0:
		return pop(&rs.freeOpen)
	case len(rs.free) > 0:
		return pop(&rs.free)
	case len(rs.freeOpen) > 0:
		return pop(&rs.freeOpen)
	}
	sl := recordSlot{n: rs.next}
	rs.next++
	return sl
}

// putFreeLocked returns a blank slot to its free list. Caller holds mu.
func (rs *recordSlots) putFreeLocked(sl recordSlot) {
	if sl.file != nil {
		rs.freeOpen = append(rs.freeOpen, sl)
	} else {
		rs.free = append(rs.free, sl)
	}
}

// closeLocked closes a slot's kept file. Caller holds mu.
func (rs *recordSlots) closeLocked(sl *recordSlot) {
	if sl.file != nil {
		_ = sl.file.Close()
		sl.file = nil
		rs.open--
	}
}

// recordPath is the file of a slot.
func (m *Manager) recordPath(n int) string {
	return filepath.Join(m.cfg.StateDir, "slot-"+strconv.Itoa(n)+".json")
}

// writeRecord records a started session, or (exited) that its leader's
// exit was recorded while processes it started still run. The error of
// the first record refuses the session (Manager.started); a later one is
// logged (the session runs either way), and both make RecordsHealthy
// fail until a record is written again.
func (m *Manager) writeRecord(s *session, exited bool) error {
	if m.cfg.StateDir == "" {
		return nil
	}
	r := record{
		SessionID:  s.id,
		SessionKey: s.scopeKey,
		Command:    s.command,
		PID:        s.pid,
		PIDStart:   s.leaderStart,
		StartedAt:  s.startedAt.UnixMilli(),
		Exited:     exited,
	}
	s.tree.where(&r)
	b, err := json.Marshal(r)
	if err == nil {
		err = m.storeRecord(s.treeName, b, !exited && !s.backgrounded)
	}
	if err != nil && exited {
		s.log.Warn("cannot record the session's exit in the state dir; a crash would report it lost", "err", err)
	}
	return err
}

// errUnrecorded ends a session whose state dir record could not be
// written (Manager.started).
var errUnrecorded = errors.New("session not recorded in the state dir")

// ErrRecords marks a state dir that cannot take session records (full,
// read-only): no session is started while it cannot.
var ErrRecords = errors.New("session records")

// recordsUnavailable is the answer of a call that cannot be recorded.
func recordsUnavailable(err error) error {
	return &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
		Message: fmt.Sprintf("the host cannot record sessions in its state dir (%v); nothing was started. Free space in (or make writable) the state dir, then retry.", err)}
}

// noteRecords keeps the outcome of the last record write for
// RecordsHealthy.
func (m *Manager) noteRecords(err error) {
	if err == nil {
		if m.records.failure.Load() != nil {
			m.records.failure.Store(nil)
		}
		return
	}
	e := fmt.Errorf("%w: %w", ErrRecords, err)
	m.records.failure.Store(&e)
}

// RecordsHealthy returns why the state dir cannot take session records
// (the last record write failed, and a write tried now fails too), or
// nil: while it fails, Exec refuses new sessions with a retryable error
// and the host should report itself unhealthy.
func (m *Manager) RecordsHealthy() error {
	if m.records.failure.Load() == nil {
		return nil
	}
	// At most one write a second for a health check, which anyone may
	// ask for (GET /healthz needs no token).
	now := time.Now().UnixNano()
	if last := m.records.probedAt.Load(); now-last >= int64(time.Second) && m.records.probedAt.CompareAndSwap(last, now) {
		if m.recordsUsable() == nil {
			return nil
		}
	}
	if p := m.records.failure.Load(); p != nil {
		return *p
	}
	return nil
}

// probeSize is what a probe writes into a new slot: more than a record
// takes, so that the session that gets the slot needs no more room.
const probeSize = 2048

// recordsUsable is asked before a spawn: nothing while records are
// written; after a failure, a slot for the next record is written (with
// blanks, kept free) to see whether the state dir takes records again.
// Only a failing state dir costs a write here.
func (m *Manager) recordsUsable() error {
	if m.cfg.StateDir == "" || m.records.failure.Load() == nil {
		return nil
	}
	rs := &m.records
	rs.mu.Lock()
	fresh := rs.next
	sl := rs.takeLocked(false)
	rs.closeLocked(&sl) // the probe writes by path: the check is of the directory
	rs.mu.Unlock()
	size, err := writeSlot(m.recordPath(sl.n), bytes.Repeat([]byte{' '}, max(sl.size, probeSize)), 0)
	if err != nil {
		if sl.n == fresh {
			_ = os.Remove(m.recordPath(sl.n))
		} else {
			rs.mu.Lock()
			rs.putFreeLocked(sl)
			rs.mu.Unlock()
		}
		m.noteRecords(err)
		return recordsUnavailable(err)
	}
	sl.size = size
	rs.mu.Lock()
	rs.putFreeLocked(sl)
	rs.mu.Unlock()
	m.noteRecords(nil)
	return nil
}

// storeRecord writes b into the slot of name, taking a slot when name has
// none yet; keep: the session is a foreground one, which may keep the
// slot's file open (maxOpenSlots).
func (m *Manager) storeRecord(name string, b []byte, keep bool) error {
	rs := &m.records
	rs.mu.Lock()
	sl, ok := rs.inUse[name]
	if !ok {
		sl = rs.takeLocked(keep)
	}
	if sl.file != nil {
		size, err := writeSlotFile(sl.file, b, sl.size)
		if (!ok && !keep) || err != nil {
			rs.closeLocked(&sl) // a background session's first record
		}
		if err == nil {
			sl.size = size
			rs.setInUseLocked(name, sl)
		} else if !ok {
			_ = os.Remove(m.recordPath(sl.n)) // not reused: its content is unknown
		}
		rs.mu.Unlock()
		m.noteRecords(err)
		return err
	}
	keep = keep && rs.open < maxOpenSlots
	if keep {
		rs.open++ // taken now, so that concurrent starts stay within the bound
	}
	rs.mu.Unlock()
	f, size, err := openWriteSlot(m.recordPath(sl.n), b, sl.size, keep)
	m.noteRecords(err)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if keep && f == nil {
		rs.open--
	}
	if err != nil {
		if !ok {
			_ = os.Remove(m.recordPath(sl.n)) // not reused: its content is unknown
		}
		return err
	}
	sl.size, sl.file = size, f
	rs.setInUseLocked(name, sl)
	return nil
}

// setInUseLocked records the slot of name. Caller holds mu.
func (rs *recordSlots) setInUseLocked(name string, sl recordSlot) {
	if rs.inUse == nil {
		rs.inUse = map[string]recordSlot{}
	}
	rs.inUse[name] = sl
}

// releaseRecordFile closes the kept file of name's slot: its session
// turned background, and background sessions hold only their pipes.
func (m *Manager) releaseRecordFile(name string) {
	rs := &m.records
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if sl, ok := rs.inUse[name]; ok && sl.file != nil {
		rs.closeLocked(&sl)
		rs.inUse[name] = sl
	}
}

// writeSlot writes b over the file at path with one write(2), padded with
// spaces to what the file held (size bytes), which JSON ignores. A process's
// death cannot cut a write of a record's size in half: the file holds the
// old content (a blank slot or the record before) or the new one. It
// returns the bytes the file now holds.
func writeSlot(path string, b []byte, size int) (int, error) {
	_, n, err := openWriteSlot(path, b, size, false)
	return n, err
}

// openWriteSlot is writeSlot that, with keep, returns the file open.
func openWriteSlot(path string, b []byte, size int, keep bool) (*os.File, int, error) {
	b = padSlot(b, size)
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, 0, &os.PathError{Op: "open", Path: path, Err: err}
	}
	n, err := unix.Pwrite(fd, b, 0)
	if err == nil && n != len(b) {
		err = fmt.Errorf("short write (%d of %d bytes)", n, len(b))
	}
	if err != nil || !keep {
		if cerr := unix.Close(fd); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, 0, &os.PathError{Op: "write", Path: path, Err: err}
		}
		return nil, max(size, len(b)), nil
	}
	return os.NewFile(uintptr(fd), path), max(size, len(b)), nil
}

// padSlot pads a record with spaces to the size its slot holds, so that
// one write replaces all of it.
func padSlot(b []byte, size int) []byte {
	if len(b) < size {
		b = append(b, bytes.Repeat([]byte{' '}, size-len(b))...)
	}
	return b
}

// writeSlotFile is writeSlot through the slot's kept file.
func writeSlotFile(f *os.File, b []byte, size int) (int, error) {
	b = padSlot(b, size)
	if _, err := f.WriteAt(b, 0); err != nil {
		return 0, err // an *os.PathError naming the file
	}
	return max(size, len(b)), nil
}

// markExitPending rewrites a held record to say the session ended and
// its exit event is not stored yet (best effort: a full disk may keep the
// record as it was, which the next Manager reports as lost too).
func (m *Manager) markExitPending(s *session) {
	rs := &m.records
	rs.mu.Lock()
	_, held := rs.held[s.id]
	rs.mu.Unlock()
	if !held {
		return
	}
	s.mu.Lock()
	status := s.res.status
	if s.res.code != nil {
		status += fmt.Sprintf(", exit code %d", *s.res.code)
	} else if s.res.signal != "" {
		status += ", signal " + s.res.signal
	}
	s.mu.Unlock()
	r := record{SessionID: s.id, SessionKey: s.scopeKey, Command: s.command, PID: s.pid, PIDStart: s.leaderStart,
		StartedAt: s.startedAt.UnixMilli(), ExitPending: true, ExitStatus: status}
	s.tree.where(&r)
	b, err := json.Marshal(r)
	if err == nil {
		err = m.storeRecord(s.treeName, b, false)
	}
	if err != nil {
		s.log.Debug("cannot mark the session's exit pending in its record", "err", err)
	}
}

// removeRecord blanks the record of a tree whose processes are gone and
// keeps its slot for the next session (or removes the file when enough
// blank slots are kept).
func (m *Manager) removeRecord(name string) {
	if m.cfg.StateDir == "" || name == "" {
		return
	}
	rs := &m.records
	rs.mu.Lock()
	sl, ok := rs.inUse[name]
	delete(rs.inUse, name)
	keep := len(rs.free)+len(rs.freeOpen) < maxFreeSlots
	if ok && sl.file != nil {
		var err error
		if keep {
			if _, err = writeSlotFile(sl.file, nil, sl.size); err == nil {
				rs.putFreeLocked(sl)
				rs.mu.Unlock()
				return
			}
		}
		rs.closeLocked(&sl)
		rs.mu.Unlock()
		m.removeSlotFile(sl.n, err)
		return
	}
	rs.mu.Unlock()
	if !ok {
		return
	}
	path := m.recordPath(sl.n)
	var err error
	if keep {
		if _, err = writeSlot(path, nil, sl.size); err == nil {
			rs.mu.Lock()
			rs.putFreeLocked(sl)
			rs.mu.Unlock()
			return
		}
	}
	m.removeSlotFile(sl.n, err)
}

// removeSlotFile removes the file of slot n, whose blanking failed with
// err (or was not tried: nil).
func (m *Manager) removeSlotFile(n int, err error) {
	path := m.recordPath(n)
	if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		err = errors.Join(err, rerr)
	} else {
		err = nil // removed: what the blanking said no longer matters
	}
	if err != nil {
		m.noteRecords(err)
		m.log.Warn("cannot remove a session record; the next run will report its session lost", "err", err)
	}
}

// holdRecord keeps the record of session id (tree name) until its exit
// event is settled (Config.ConfirmExits).
func (m *Manager) holdRecord(id, name string) {
	if !m.cfg.ConfirmExits || m.cfg.StateDir == "" || name == "" {
		return
	}
	rs := &m.records
	rs.mu.Lock()
	if rs.held == nil {
		rs.held = map[string]*heldRecord{}
		rs.heldTrees = map[string]*heldRecord{}
	}
	h := &heldRecord{tree: name, exitOpen: true}
	rs.held[id] = h
	rs.heldTrees[name] = h
	rs.heldIDs.Store(id, struct{}{})
	rs.mu.Unlock()
}

// treeRecordGone removes the record of a tree whose processes are gone,
// unless it is held for its exit event.
func (m *Manager) treeRecordGone(name string) {
	rs := &m.records
	rs.mu.Lock()
	if h := rs.heldTrees[name]; h != nil && h.exitOpen {
		h.gone = true
		rs.mu.Unlock()
		return
	}
	rs.mu.Unlock()
	m.removeRecord(name)
}

// settleExit ends the hold of session id's record, and removes the
// record when its tree is gone too. tree, when not "", names the
// session's tree: a hold of another tree (a later session under the same
// id) is not this session's to end.
func (m *Manager) settleExit(id, tree string) {
	rs := &m.records
	rs.mu.Lock()
	h := rs.held[id]
	if h == nil || (tree != "" && h.tree != tree) {
		rs.mu.Unlock()
		return
	}
	delete(rs.held, id)
	delete(rs.heldTrees, h.tree)
	rs.heldIDs.Delete(id)
	gone, name := h.gone, h.tree
	rs.mu.Unlock()
	if gone {
		m.removeRecord(name)
	}
}

// ExitStored confirms that the exit event of session id (given to
// OnExit) is stored where its agent will get it: with ConfirmExits its
// record is removed now (once its processes are gone). Unknown ids are
// ignored.
func (m *Manager) ExitStored(id string) { m.settleExit(id, "") }

// holdsRecordLocked reports whether a record is held for session id:
// its exit event (or lost report) is not confirmed yet, so the id stays
// taken (Manager.takenLocked) even after its session was dropped, or a
// session under the same id would take over the hold and ExitStored
// would end the wrong one. Caller holds m.mu (not records.mu).
func (m *Manager) holdsRecordLocked(id string) bool {
	_, ok := m.records.heldIDs.Load(id)
	return ok
}

// removeFreeSlots removes the blank slots (Close).
func (m *Manager) removeFreeSlots() {
	if m.cfg.StateDir == "" {
		return
	}
	rs := &m.records
	rs.mu.Lock()
	free := append(rs.free, rs.freeOpen...)
	rs.free, rs.freeOpen = nil, nil
	for i := range free {
		rs.closeLocked(&free[i])
	}
	for name, sl := range rs.inUse {
		if sl.file != nil { // its record stays, for the next run
			rs.closeLocked(&sl)
			rs.inUse[name] = sl
		}
	}
	rs.mu.Unlock()
	for _, sl := range free {
		if err := os.Remove(m.recordPath(sl.n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			m.log.Warn("cannot remove a blank session record", "err", err)
		}
	}
}

// recoverRecords ends what a previous run on the state dir left and
// returns its lost sessions.
func (m *Manager) recoverRecords() ([]LostSession, error) {
	if err := os.MkdirAll(m.cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("session: state dir: %w", err)
	}
	ents, err := os.ReadDir(m.cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("session: state dir: %w", err)
	}
	var recs []record
	var files []string
	for _, e := range ents {
		path := filepath.Join(m.cfg.StateDir, e.Name())
		switch {
		case strings.HasSuffix(e.Name(), ".json.tmp"):
			_ = os.Remove(path) // never renamed: its session had not started
			continue
		case !strings.HasSuffix(e.Name(), ".json") || e.IsDir():
			continue
		}
		b, err := os.ReadFile(path)
		if err == nil && len(bytes.TrimSpace(b)) == 0 {
			_ = os.Remove(path) // a blank slot (or a record cut at its open)
			continue
		}
		var r record
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err != nil {
			m.log.Warn("unreadable session record removed", "file", path, "err", err)
			_ = os.Remove(path)
			continue
		}
		recs = append(recs, r)
		files = append(files, path)
	}
	if len(recs) == 0 {
		return nil, nil
	}
	// With ConfirmExits the record of a lost session is kept, in its
	// slot, until ExitStored confirms its lost report was stored: a run
	// that stops before that (the event store still failing) leaves it
	// to the next one again. New slots are numbered after the kept ones.
	keep := func(r record, path string) bool {
		n, ok := slotNumber(filepath.Base(path))
		if !m.cfg.ConfirmExits || !ok {
			return false
		}
		// Its processes were ended: a next Manager has none to look for.
		r.PID, r.PIDStart, r.PGID, r.SID, r.Cgroup = 0, 0, 0, 0, ""
		b, err := json.Marshal(r)
		if err != nil {
			return false
		}
		var held int
		if fi, err := os.Stat(path); err == nil {
			held = int(fi.Size()) // padded over, so nothing of the old record is left
		}
		size, err := writeSlot(path, b, held)
		if err != nil {
			m.log.Warn("cannot rewrite the record of a lost session; removing it", "file", path, "err", err)
			return false
		}
		rs := &m.records
		name := "lost-" + r.SessionID
		if rs.inUse == nil {
			rs.inUse = map[string]recordSlot{}
		}
		if rs.held == nil {
			rs.held = map[string]*heldRecord{}
			rs.heldTrees = map[string]*heldRecord{}
		}
		rs.inUse[name] = recordSlot{n: n, size: size}
		h := &heldRecord{tree: name, exitOpen: true, gone: true}
		rs.held[r.SessionID] = h
		rs.heldTrees[name] = h
		rs.heldIDs.Store(r.SessionID, struct{}{})
		rs.next = max(rs.next, n+1)
		return true
	}
	var snap *procSnapshot
	var lost []LostSession
	for i, r := range recs {
		var ended int
		if r.Cgroup != "" {
			ended = endRecordedCgroup(r.Cgroup)
		} else {
			if snap == nil {
				if snap, err = readProcSnapshot(0); err != nil {
					return nil, fmt.Errorf("session: read /proc: %w", err)
				}
			}
			ended = m.endRecordedGroup(r, snap)
		}
		m.log.Info("ended what a previous run left of a session", "session", r.SessionID, "processes", ended, "exited", r.Exited)
		var l *LostSession
		if r.LostReason != "" {
			l = &LostSession{SessionID: r.SessionID, SessionKey: r.SessionKey, Command: r.Command,
				StartedAt: time.UnixMilli(r.StartedAt), Ended: ended, Reason: r.LostReason}
		} else if r.ExitPending {
			reason := "it ended"
			if r.ExitStatus != "" {
				reason += " (" + r.ExitStatus + ")"
			}
			reason += ", but execmesh stopped before its exit event was stored (the event store was full or failing)"
			l = &LostSession{SessionID: r.SessionID, SessionKey: r.SessionKey, Command: r.Command,
				StartedAt: time.UnixMilli(r.StartedAt), Ended: ended, Reason: reason}
		} else if !r.Exited {
			reason := "the execmesh process that ran this session ended before the session's end was recorded (a crash, kill -9, or a state dir it could not write)"
			if ended > 0 {
				reason += "; " + strconv.Itoa(ended) + " of its processes still ran and were ended when it restarted"
			} else {
				reason += "; none of its processes was left running"
			}
			l = &LostSession{SessionID: r.SessionID, SessionKey: r.SessionKey, Command: r.Command,
				StartedAt: time.UnixMilli(r.StartedAt), Ended: ended, Reason: reason}
		}
		if l == nil {
			_ = os.Remove(files[i])
			continue
		}
		lost = append(lost, *l)
		r.LostReason = l.Reason
		if !keep(r, files[i]) {
			_ = os.Remove(files[i])
		}
	}
	return lost, nil
}

// slotNumber returns n of a record file named slot-<n>.json.
func slotNumber(name string) (int, bool) {
	digits, ok := strings.CutPrefix(strings.TrimSuffix(name, ".json"), "slot-")
	if !ok || digits == "" {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	return n, err == nil && n >= 0
}

// endRecordedCgroup kills a recorded session group and removes it, with
// its parents (the Manager's and the process's groups of that run) when
// they are left empty. It returns the processes that were still alive.
func endRecordedCgroup(path string) int {
	base, err := cgroup.Self()
	if err != nil {
		return 0
	}
	// Only groups of this hierarchy that an execmesh run made.
	mount := strings.TrimSuffix(base.Path, strings.TrimSuffix(base.Rel, "/"))
	if !strings.HasPrefix(path, mount+"/") || !strings.HasPrefix(filepath.Base(filepath.Dir(path)), "m-") {
		return 0
	}
	d := cgroup.Dir{Path: path}
	if !d.Exists() {
		return 0
	}
	ended := 0
	for _, g := range d.Subtree() {
		pids, _ := g.Procs()
		ended += len(pids)
	}
	_ = d.Kill()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if p, err := d.Populated(); err != nil || !p {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = d.RemoveSubtree()
	mgr := d.Parent()
	if mgr.Remove() == nil && strings.HasPrefix(filepath.Base(mgr.Parent().Path), "execmesh-") {
		_ = mgr.Parent().Remove() // fails while another Manager of that run is recorded
	}
	return ended
}

// endRecordedGroup kills what is left of a recorded process group: the
// leader if its pid and start time still match, and every member of its
// group or terminal session that started no earlier than it.
func (m *Manager) endRecordedGroup(r record, snap *procSnapshot) int {
	set := map[int]uint64{}
	if p, ok := snap.procs[r.PID]; ok && p.start == r.PIDStart {
		set[r.PID] = p.start
	}
	for pid, p := range snap.procs {
		if pid == m.selfPID || p.start < r.PIDStart {
			continue
		}
		if (r.PGID > 1 && p.pgrp == r.PGID) || (r.SID > 1 && p.sid == r.SID) {
			set[pid] = p.start
		}
	}
	for pid := range set {
		for _, d := range snap.below(pid) {
			if snap.procs[d].start >= r.PIDStart {
				set[d] = snap.procs[d].start
			}
		}
	}
	delete(set, m.selfPID)
	alive := aliveProcs(set)
	_ = signalSet(alive, unix.SIGKILL)
	waitGone(alive, time.Now().Add(5*time.Second), nil)
	return len(alive)
}
