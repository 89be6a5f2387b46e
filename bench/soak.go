package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Soak: `execmesh up` under a sustained mixed load for -soak-duration
// (10 min): soakCallers callers, each with its own sessionKey, run
// foreground `echo hi` with yieldMs 10 (many end right as their window
// passes), yielded sleeps that turn background and background sleeps;
// nobody reads events, so the queues (events.maxQueued 5) are full and
// drop. Every minute the daemon's RSS, open descriptors, goroutines
// (/metrics), session records in its state dir and log lines (at
// --log-level warn) are reported; what grows from minute to minute under
// a steady load is a leak. Once the load stops, the records left are
// counted (0 expected).

const (
	soakCallers = 20
	soakToken   = "bench-soak"
)

// soakSample is one minute of the soak.
type soakSample struct {
	calls, errors                                  int64
	rssKiB, fds, goroutines, records, files, lines int
}

func benchSoak(ctx context.Context, o *options, res *results) error {
	dir, err := os.MkdirTemp("", "execmesh-bench-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg, _ := json.Marshal(map[string]any{
		"gateway": map[string]any{"auth": map[string]any{"token": soakToken}},
		"tools":   map[string]any{"exec": map[string]any{"security": "full", "ask": "off"}},
		"events":  map[string]any{"maxQueued": 5},
	})
	cfgPath := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		return err
	}
	u, err := startUp(ctx, o.bin, filepath.Join(dir, "up"), "--config", cfgPath)
	if err != nil {
		return err
	}
	defer func() {
		if err := u.stop(); err != nil {
			o.progress("soak: %v", err)
		}
	}()
	pid := u.cmd.Process.Pid
	records := filepath.Join(u.state, "sessions", "gateway")
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * soakCallers}, Timeout: time.Minute}
	defer hc.CloseIdleConnections()

	var calls, failures atomic.Int64
	var firstErr atomic.Value
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for c := range soakCallers {
		wg.Go(func() {
			key := fmt.Sprintf("agent:soak%d:main", c)
			for i := 0; lctx.Err() == nil; i++ {
				args := map[string]any{"command": "echo hi", "yieldMs": 10}
				switch i % 10 {
				case 4:
					args = map[string]any{"command": "sleep 0.05", "yieldMs": 10}
				case 9:
					args = map[string]any{"command": "sleep 0.2", "background": true}
				}
				if err := soakInvoke(lctx, hc, u.base, key, args); err != nil && lctx.Err() == nil {
					if failures.Add(1) == 1 {
						firstErr.Store(err.Error())
					}
				}
				calls.Add(1)
			}
		})
	}
	stopLoad := sync.OnceFunc(func() { stop(); wg.Wait() })
	defer stopLoad()

	minutes := max(int(o.soakDur/time.Minute), 1)
	var samples []soakSample
	lines := u.log.lines()
	o.progress("soak: %d callers for %d min; per minute:", soakCallers, minutes)
	for m := 1; m <= minutes; m++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Minute):
		}
		s := soakSample{calls: calls.Swap(0), errors: failures.Swap(0)}
		rss, _, err := procStatus(pid)
		if err != nil {
			return fmt.Errorf("soak: execmesh up gone: %w (%s)", err, u.log.String())
		}
		s.rssKiB = int(rss)
		s.fds, _ = fdCount(pid)
		if s.goroutines, err = soakGoroutines(ctx, hc, u.base); err != nil {
			return err
		}
		s.records, s.files = soakRecords(records)
		now := u.log.lines()
		s.lines, lines = now-lines, now
		samples = append(samples, s)
		o.progress("soak: minute %2d  calls %6d  errors %d  rss %6d KiB  fds %4d  goroutines %5d  records %4d (slot files %4d)  log lines %5d",
			m, s.calls, s.errors, s.rssKiB, s.fds, s.goroutines, s.records, s.files, s.lines)
	}
	stopLoad()
	if e := firstErr.Load(); e != nil {
		o.progress("soak: first failed call: %v", e)
	}
	// Idle: the longest session runs 0.2 s; its exit event is stored a
	// moment later, and then its record goes.
	var left int
	for deadline := time.Now().Add(30 * time.Second); ; {
		if left, _ = soakRecords(records); left == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}

	first, last := samples[0], samples[len(samples)-1]
	note := fmt.Sprintf("report only: %d callers, %d min, minute 1 → minute %d (per minute above)", soakCallers, minutes, minutes)
	for _, f := range []struct {
		name        string
		first, last int
		unit        string
	}{
		{"RSS of execmesh up", first.rssKiB / 1024, last.rssKiB / 1024, "MiB"},
		{"open fds of execmesh up", first.fds, last.fds, ""},
		{"goroutines of execmesh up", first.goroutines, last.goroutines, ""},
		{"session records in the state dir", first.records, last.records, ""},
		{"log lines per minute", first.lines, last.lines, ""},
	} {
		res.add(figure{Section: "soak", Figure: f.name + ", first minute", Value: float64(f.first), Unit: f.unit, Note: note})
		res.add(figure{Section: "soak", Figure: f.name + ", last minute", Value: float64(f.last), Unit: f.unit, Note: note})
	}
	var total int64
	for _, s := range samples {
		total += s.calls
	}
	res.add(figure{Section: "soak", Figure: "exec calls", Value: float64(total), Unit: "", Note: note})
	res.add(figure{Section: "soak", Figure: "session records left 30 s after the load", Value: float64(left), Unit: "",
		Target: "value<1", Note: "every session ended and its exit event was stored: none may keep its record"})
	return nil
}

// soakInvoke runs one exec call.
func soakInvoke(ctx context.Context, hc *http.Client, base, key string, args map[string]any) error {
	b, _ := json.Marshal(map[string]any{"tool": "exec", "sessionKey": key, "args": args})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/tools/invoke", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+soakToken)
	req.Header.Set("Content-Type", "application/json")
	res, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("exec %v: %d %s", args, res.StatusCode, body)
	}
	return nil
}

// soakGoroutines reads go_goroutines from /metrics.
func soakGoroutines(ctx context.Context, hc *http.Client, base string) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+soakToken)
	res, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("soak: /metrics: %w", err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(f), err
		}
	}
	return 0, fmt.Errorf("soak: no go_goroutines in /metrics (%v)", sc.Err())
}

// soakRecords counts the session records in dir (slot files holding more
// than blanks) and the slot files.
func soakRecords(dir string) (records, files int) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err == nil && len(bytes.TrimSpace(b)) > 0 {
			records++
		}
	}
	return records, len(ents)
}
