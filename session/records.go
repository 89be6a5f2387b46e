package session

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/execmesh/execmesh/internal/cgroup"
)

// Session records. A Manager with a state directory (Config.StateDir)
// keeps one small file per session whose processes may be running,
// <StateDir>/<seq>-<id>.json, written with one write(2) when the command
// has started and removed when its last process is gone.
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

// recordPath is the file of a session's record.
func (m *Manager) recordPath(name string) string {
	return filepath.Join(m.cfg.StateDir, name+".json")
}

// writeRecord records a started session; errors are logged, never fatal
// (the session runs either way).
func (m *Manager) writeRecord(s *session, exited bool) {
	if m.cfg.StateDir == "" {
		return
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
		err = writeRecordFile(m.recordPath(s.treeName), b, exited)
	}
	if err != nil {
		s.log.Warn("cannot record the session in the state dir; a crash would leave it untracked", "err", err)
	}
}

// writeRecordFile writes a record with one write(2), which a process's
// death cannot cut in half: a new record is created exclusively (only a
// kill between open and write can leave it empty, and an empty record is
// dropped at recovery); the exited rewrite of an existing one goes to a
// temporary file renamed over it.
func writeRecordFile(path string, b []byte, replace bool) error {
	if replace {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			return err
		}
		return os.Rename(tmp, path)
	}
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &os.PathError{Op: "create", Path: path, Err: err}
	}
	n, err := unix.Write(fd, b)
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err == nil && n != len(b) {
		err = fmt.Errorf("short write (%d of %d bytes)", n, len(b))
	}
	if err != nil {
		return &os.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}

// removeRecord drops the record of a session whose processes are gone.
func (m *Manager) removeRecord(name string) {
	if m.cfg.StateDir == "" || name == "" {
		return
	}
	if err := os.Remove(m.recordPath(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		m.log.Warn("cannot remove a session record", "err", err)
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
		if !r.Exited {
			reason := "the execmesh process that ran this session ended before the session did (crash or kill -9)"
			if ended > 0 {
				reason += "; " + strconv.Itoa(ended) + " of its processes still ran and were ended when it restarted"
			} else {
				reason += "; none of its processes was left running"
			}
			lost = append(lost, LostSession{
				SessionID: r.SessionID, SessionKey: r.SessionKey, Command: r.Command,
				StartedAt: time.UnixMilli(r.StartedAt), Ended: ended, Reason: reason,
			})
		}
		_ = os.Remove(files[i])
	}
	return lost, nil
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
