package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Limits are the resource limits of one session's cgroup
// (tools.exec.limits, agents.list[].tools.exec.limits and the exec
// parameter "limits"). A zero field means no limit.
type Limits struct {
	// MemoryMax is memory.max in bytes. JSON takes a number of bytes or
	// a string with a binary suffix: "512M", "2G" (K, M, G, T; 1K = 1024).
	MemoryMax int64 `json:"memoryMax,omitempty"`
	// PidsMax is pids.max: the most processes and threads at once.
	PidsMax int64 `json:"pidsMax,omitempty"`
	// CPUMax is cpu.max in CPUs: 0.5 is half of one CPU, 2 is two.
	CPUMax float64 `json:"cpuMax,omitempty"`
}

// Bounds of the limits, so that a value can neither overflow the cgroup
// files nor make a command unstartable by accident.
const (
	minMemoryMax = 1 << 20 // 1 MiB
	minCPUMax    = 0.01    // cpu.max quota of 1 ms per 100 ms period
	maxCPUMax    = 4096
)

// IsZero reports whether no limit is set.
func (l Limits) IsZero() bool { return l == Limits{} }

// Tighten applies the limits of t that are set on top of l. A value in t
// that is larger than l's (a looser limit) is an ErrInvalidRequest naming
// the field as field(name), e.g. "limits.memoryMax".
func (l Limits) Tighten(t Limits, field func(string) string) (Limits, error) {
	check := func(name string, base, want float64) error {
		if want == 0 || base == 0 || want <= base {
			return nil
		}
		return Errorf(ErrInvalidRequest, "%s (%s) may only tighten the configured limit (%s)", field(name), formatLimit(name, want), formatLimit(name, base))
	}
	if err := check("memoryMax", float64(l.MemoryMax), float64(t.MemoryMax)); err != nil {
		return l, err
	}
	if err := check("pidsMax", float64(l.PidsMax), float64(t.PidsMax)); err != nil {
		return l, err
	}
	if err := check("cpuMax", l.CPUMax, t.CPUMax); err != nil {
		return l, err
	}
	return l.Override(t), nil
}

// Override returns l with each limit o sets in its place.
func (l Limits) Override(o Limits) Limits {
	if o.MemoryMax != 0 {
		l.MemoryMax = o.MemoryMax
	}
	if o.PidsMax != 0 {
		l.PidsMax = o.PidsMax
	}
	if o.CPUMax != 0 {
		l.CPUMax = o.CPUMax
	}
	return l
}

// String renders the limits that are set, e.g. "memoryMax=512M pidsMax=64".
func (l Limits) String() string {
	var parts []string
	if l.MemoryMax != 0 {
		parts = append(parts, "memoryMax="+formatLimit("memoryMax", float64(l.MemoryMax)))
	}
	if l.PidsMax != 0 {
		parts = append(parts, "pidsMax="+formatLimit("pidsMax", float64(l.PidsMax)))
	}
	if l.CPUMax != 0 {
		parts = append(parts, "cpuMax="+formatLimit("cpuMax", l.CPUMax))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

func formatLimit(name string, v float64) string {
	switch name {
	case "memoryMax":
		return FormatBytes(int64(v))
	case "cpuMax":
		return strconv.FormatFloat(v, 'f', -1, 64) + " CPUs"
	}
	return strconv.FormatInt(int64(v), 10)
}

// FormatBytes renders a byte count with the largest binary suffix that
// divides it: 536870912 → "512M".
func FormatBytes(n int64) string {
	for _, u := range []struct {
		s string
		v int64
	}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if n >= u.v && n%u.v == 0 {
			return strconv.FormatInt(n/u.v, 10) + u.s
		}
	}
	return strconv.FormatInt(n, 10)
}

// ParseBytes parses a byte count: digits with an optional K, M, G or T
// suffix (binary; "KiB"-style and "B" endings are accepted too).
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	t = strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(t), "B"), "I")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			t = t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(t), 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is not a byte count (a number, or digits with K, M, G or T)", s)
	}
	return n * mult, nil
}

// Validate checks the ranges: memoryMax at least 1M, pidsMax at least 1,
// cpuMax between 0.01 and 4096. field names a field in errors.
func (l Limits) Validate(field func(string) string) error {
	switch {
	case l.MemoryMax < 0 || (l.MemoryMax > 0 && l.MemoryMax < minMemoryMax):
		return Errorf(ErrInvalidRequest, "%s must be at least 1M (1048576 bytes)", field("memoryMax"))
	case l.PidsMax < 0:
		return Errorf(ErrInvalidRequest, "%s must be at least 1", field("pidsMax"))
	case l.CPUMax < 0 || math.IsNaN(l.CPUMax) || (l.CPUMax > 0 && (l.CPUMax < minCPUMax || l.CPUMax > maxCPUMax)):
		return Errorf(ErrInvalidRequest, "%s must be between 0.01 and 4096 (CPUs)", field("cpuMax"))
	}
	return nil
}

// UnmarshalJSON decodes limits strictly: only the three keys, memoryMax a
// number or a byte-count string, pidsMax an integer, cpuMax a number;
// null leaves a field unset. Errors name the key ("memoryMax ...").
func (l *Limits) UnmarshalJSON(b []byte) error {
	out, err := DecodeLimits(b, func(k string) string {
		if k == "" {
			return "limits"
		}
		return k
	})
	if err != nil {
		return err
	}
	*l = out
	return nil
}

// DecodeLimits decodes a limits object strictly (see UnmarshalJSON),
// naming a field in errors as field(key) and the object as field("").
func DecodeLimits(raw []byte, field func(string) string) (Limits, error) {
	var l Limits
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return l, nil
	}
	if raw[0] != '{' {
		return l, Errorf(ErrInvalidRequest, "%s must be an object (memoryMax, pidsMax, cpuMax)", field(""))
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return l, Errorf(ErrInvalidRequest, "%s is not valid JSON: %v", field(""), err)
	}
	for _, k := range sortedKeys(fields) {
		v := fields[k]
		if isNull(v) {
			continue
		}
		switch k {
		case "memoryMax":
			if f, ok := jsonNumber(v); ok {
				if f != math.Trunc(f) || f < 0 || f > math.MaxInt64/2 {
					return Limits{}, Errorf(ErrInvalidRequest, "%s must be a whole number of bytes", field(k))
				}
				l.MemoryMax = int64(f)
				continue
			}
			var s string
			if json.Unmarshal(v, &s) != nil {
				return Limits{}, Errorf(ErrInvalidRequest, "%s must be a number of bytes or a string such as \"512M\"", field(k))
			}
			n, err := ParseBytes(s)
			if err != nil {
				return Limits{}, Errorf(ErrInvalidRequest, "%s: %v", field(k), err)
			}
			l.MemoryMax = n
		case "pidsMax":
			f, ok := jsonNumber(v)
			if !ok || f != math.Trunc(f) || f > math.MaxInt32 {
				return Limits{}, Errorf(ErrInvalidRequest, "%s must be an integer", field(k))
			}
			l.PidsMax = int64(f)
		case "cpuMax":
			f, ok := jsonNumber(v)
			if !ok {
				return Limits{}, Errorf(ErrInvalidRequest, "%s must be a number of CPUs", field(k))
			}
			l.CPUMax = f
		default:
			return Limits{}, Errorf(ErrInvalidRequest, "%s is unsupported (known: cpuMax, memoryMax, pidsMax)", field(k))
		}
	}
	if err := l.Validate(field); err != nil {
		return Limits{}, err
	}
	return l, nil
}
