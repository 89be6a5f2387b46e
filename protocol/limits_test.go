package protocol

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestDecodeExecArgsLimits(t *testing.T) {
	for _, tc := range []struct {
		args string
		want *Limits
		err  string
	}{
		{`{"command":"x","limits":{"memoryMax":"512M","pidsMax":64,"cpuMax":0.5}}`, &Limits{MemoryMax: 512 << 20, PidsMax: 64, CPUMax: 0.5}, ""},
		{`{"command":"x","limits":{"memoryMax":1073741824}}`, &Limits{MemoryMax: 1 << 30}, ""},
		{`{"command":"x","limits":{"memoryMax":"2GiB"}}`, &Limits{MemoryMax: 2 << 30}, ""},
		{`{"command":"x","limits":null}`, nil, ""},
		{`{"command":"x","limits":{}}`, nil, ""},
		{`{"command":"x","limits":{"memory":"1G"}}`, nil, `exec parameter "limits.memory" is unsupported (known: cpuMax, memoryMax, pidsMax)`},
		{`{"command":"x","limits":{"memoryMax":"lots"}}`, nil, `exec parameter "limits.memoryMax": "lots" is not a byte count`},
		{`{"command":"x","limits":{"memoryMax":1000}}`, nil, `exec parameter "limits.memoryMax" must be at least 1M`},
		{`{"command":"x","limits":{"pidsMax":1.5}}`, nil, `exec parameter "limits.pidsMax" must be an integer`},
		{`{"command":"x","limits":{"pidsMax":-1}}`, nil, `exec parameter "limits.pidsMax" must be at least 1`},
		{`{"command":"x","limits":{"cpuMax":"1"}}`, nil, `exec parameter "limits.cpuMax" must be a number of CPUs`},
		{`{"command":"x","limits":{"cpuMax":0.001}}`, nil, `exec parameter "limits.cpuMax" must be between 0.01 and 4096`},
		{`{"command":"x","limits":[1]}`, nil, `exec parameter "limits" must be an object`},
	} {
		a, err := DecodeExecArgs([]byte(tc.args))
		if tc.err != "" {
			if err == nil || !strings.HasPrefix(err.Error(), tc.err) || AsError(err).Type != ErrInvalidRequest {
				t.Errorf("%s: error %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.args, err)
			continue
		}
		if (a.Limits == nil) != (tc.want == nil) || (a.Limits != nil && *a.Limits != *tc.want) {
			t.Errorf("%s: limits %+v, want %+v", tc.args, a.Limits, tc.want)
		}
	}
}

func TestLimitsTighten(t *testing.T) {
	field := func(k string) string { return "limits." + k }
	base := Limits{MemoryMax: 1 << 30, PidsMax: 100}
	got, err := base.Tighten(Limits{MemoryMax: 256 << 20, CPUMax: 2}, field)
	if err != nil || got != (Limits{MemoryMax: 256 << 20, PidsMax: 100, CPUMax: 2}) {
		t.Errorf("tighten: %+v %v", got, err)
	}
	if _, err := base.Tighten(Limits{MemoryMax: 2 << 30}, field); err == nil || err.Error() != "limits.memoryMax (2G) may only tighten the configured limit (1G)" {
		t.Errorf("loosen memory: %v", err)
	}
	if _, err := base.Tighten(Limits{PidsMax: 101}, field); err == nil || !strings.Contains(err.Error(), "limits.pidsMax (101)") {
		t.Errorf("loosen pids: %v", err)
	}
	if got, err := (Limits{}).Tighten(Limits{PidsMax: 5}, field); err != nil || got.PidsMax != 5 {
		t.Errorf("no base: %+v %v", got, err)
	}
	if s := (Limits{MemoryMax: 3 << 20, PidsMax: 7, CPUMax: 0.25}).String(); s != "memoryMax=3M pidsMax=7 cpuMax=0.25 CPUs" {
		t.Errorf("String: %q", s)
	}
}

func TestLimitsJSON(t *testing.T) {
	var l Limits
	if err := json.Unmarshal([]byte(`{"memoryMax":"1G","pidsMax":10}`), &l); err != nil || l != (Limits{MemoryMax: 1 << 30, PidsMax: 10}) {
		t.Errorf("unmarshal: %+v %v", l, err)
	}
	if err := json.Unmarshal([]byte(`{"memoryMax":"1G","bogus":1}`), &l); err == nil || !strings.Contains(err.Error(), "bogus is unsupported") {
		t.Errorf("unknown key: %v", err)
	}
	b, _ := json.Marshal(Limits{MemoryMax: 1 << 20})
	if string(b) != `{"memoryMax":1048576}` {
		t.Errorf("marshal: %s", b)
	}
	for in, want := range map[string]int64{"0": 0, "10": 10, "1k": 1024, "3M": 3 << 20, "1 G": 1 << 30, "2TiB": 2 << 40, "5MB": 5 << 20} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "M", "-1", "1.5G", "9999999999T"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) accepted", bad)
		}
	}
}
