package protocol

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/execmesh/execmesh/internal/testutil"
)

// TestDetailsFieldOrder: the fields are declared in the byte order of
// their JSON names, which is the order encoding/json gave the keys of the
// map[string]any that Details replaced; that keeps every result's JSON
// byte for byte what it was.
func TestDetailsFieldOrder(t *testing.T) {
	typ := reflect.TypeOf(Details{})
	var names []string
	for i := range typ.NumField() {
		tag := typ.Field(i).Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if opts != "omitzero" {
			t.Errorf("field %s: tag %q, want omitzero (absent keys must stay absent)", typ.Field(i).Name, tag)
		}
		names = append(names, name)
	}
	if !slices.IsSorted(names) {
		sorted := slices.Clone(names)
		slices.Sort(sorted)
		t.Fatalf("fields not in JSON-name order:\n got  %v\n want %v", names, sorted)
	}
}

// asMap re-encodes a JSON object through map[string]any, as results were
// encoded before Details was a struct.
func asMap(t *testing.T, b []byte, escapeHTML bool) []byte {
	t.Helper()
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(escapeHTML)
	if err := enc.Encode(m); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

func encode(t *testing.T, v any, escapeHTML bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(escapeHTML)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// TestDetailsGoldenAgainstFixtures decodes the details of every answer in
// results.json (OpenClaw's own results, placeholders given values) into
// Details and checks that encoding it gives exactly the bytes the map
// encoding gives, with and without HTML escaping (the HTTP API's encoder
// and json.Marshal), and that no key is lost.
func TestDetailsGoldenAgainstFixtures(t *testing.T) {
	data, err := os.ReadFile(testutil.ConformanceFile(t, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fx struct {
		Cases []struct {
			Calls []struct {
				Result *struct {
					Details map[string]any `json:"details"`
				} `json:"result"`
			} `json:"calls"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(data, &fx); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range fx.Cases {
		for _, call := range c.Calls {
			if call.Result == nil {
				continue
			}
			d := fill(call.Result.Details).(map[string]any)
			raw, _ := json.Marshal(d)
			var typed Details
			if err := json.Unmarshal(raw, &typed); err != nil {
				t.Fatalf("decode %s: %v", raw, err)
			}
			for _, html := range []bool{false, true} {
				got := encode(t, typed, html)
				want := asMap(t, raw, html)
				if !bytes.Equal(got, want) {
					t.Fatalf("details differ (escapeHTML=%v):\n got  %s\n want %s", html, got, want)
				}
			}
			n++
		}
	}
	if n < 50 {
		t.Fatalf("only %d results checked", n)
	}
}

// fill replaces the fixture's placeholders with values of the right type.
func fill(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = fill(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = fill(e)
		}
		return x
	case string:
		switch x {
		case "<ms>", "<pid>":
			return 1234
		case "<cwd>":
			return "/work/a&b<c>"
		}
		return strings.NewReplacer("<sid>", "calm-reef", "<sid2>", "nimble-coral", "<cwd>", "/work/a&b<c>").Replace(x)
	}
	return v
}

// TestDetailsPresence: absent, null and set are three different JSON
// shapes, and decoding keeps them apart.
func TestDetailsPresence(t *testing.T) {
	d := Details{Status: Some(StatusFailed), ExitCode: Null[int](), ExitSignal: Some("SIGTERM"), Tail: Some(""), Sessions: Some([]Details{})}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"exitCode":null,"exitSignal":"SIGTERM","sessions":[],"status":"failed","tail":""}`
	if string(b) != want {
		t.Fatalf("got %s, want %s", b, want)
	}
	var back Details
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !back.ExitCode.IsNull() || back.ExitCode.Set() || !back.PID.IsZero() || !back.Tail.Set() || back.Tail.Value() != "" {
		t.Fatalf("decoded %+v", back)
	}
	if sessions, ok := back.Sessions.Get(); !ok || sessions == nil || len(sessions) != 0 {
		t.Fatalf("sessions %v %v", sessions, ok)
	}
	if again, _ := json.Marshal(back); string(again) != want {
		t.Fatalf("round trip %s", again)
	}
	if b, _ := json.Marshal(Details{}); string(b) != "{}" {
		t.Fatalf("zero Details: %s", b)
	}
	if p := Some(3).Ptr(); p == nil || *p != 3 || Null[int]().Ptr() != nil {
		t.Fatal("Ptr")
	}
}

// TestAppendJSONString checks the string encoder against encoding/json
// with HTML escaping off, on tricky and random strings.
func TestAppendJSONString(t *testing.T) {
	cases := []string{"", "plain", `"quoted" \back\`, "<a href='x'>&amp;</a>", "\x00\x01\b\f\n\r\t\x1f\x7f",
		"\u2028\u2029", "héllo 世界 🎉", "\xff\xfe bad utf8 \xc3", "\xed\xa0\x80 surrogate"}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b := make([]byte, rng.IntN(40))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		cases = append(cases, string(b))
		var r []rune
		for range rng.IntN(20) {
			r = append(r, rune(rng.IntN(0x2100)))
		}
		cases = append(cases, string(r))
	}
	for _, s := range cases {
		got := AppendJSONString(nil, s)
		want := encode(t, s, false)
		if !bytes.Equal(got, want) {
			t.Fatalf("%q: got %s, want %s", s, got, want)
		}
	}
}

// FuzzAppendJSONString: any string encodes as encoding/json encodes it.
func FuzzAppendJSONString(f *testing.F) {
	f.Add("<&>\u2028\x00\xff")
	f.Fuzz(func(t *testing.T, s string) {
		got := AppendJSONString(nil, s)
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(s)
		if want := bytes.TrimSuffix(buf.Bytes(), []byte("\n")); !bytes.Equal(got, want) {
			t.Fatalf("%q: got %s, want %s", s, got, want)
		}
		if !utf8.Valid(got) {
			t.Fatalf("invalid UTF-8 out: %q", got)
		}
	})
}
