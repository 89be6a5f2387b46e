package protocol

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
)

// encodingJSON is what the HTTP API's encoder writes for v.
func encodingJSON(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

var randomStrings = []string{"", "a", "sleep 600", "<b>&amp;</b>", "tab\there\nnl\r\x00\x1f\x7f", `quote " back \ slash`,
	"ünïcødé 日本語 🎉", "bad \xff\xfe utf8", "line\u2028sep\u2029", "/work/wt-scale18"}

func randomString(r *rand.Rand) string {
	s := randomStrings[r.IntN(len(randomStrings))]
	if r.IntN(3) == 0 {
		s += randomStrings[r.IntN(len(randomStrings))]
	}
	return s
}

func randomUsage(r *rand.Rand) Usage {
	u := Usage{CPUUserMs: r.Int64N(1 << 40), CPUSystemMs: -r.Int64N(3), Scope: randomString(r)}
	if r.IntN(2) == 0 {
		v := r.Uint64()
		u.MemoryPeakBytes = &v
	}
	if r.IntN(2) == 0 {
		v := uint64(r.IntN(100))
		u.PidsPeak = &v
	}
	return u
}

// randomDetails sets every field of Details at random: absent, null or a
// value; depth bounds nested sessions. A field of a type it does not know
// fails the test, so that a new field cannot go unchecked.
func randomDetails(t *testing.T, r *rand.Rand, depth int) Details {
	t.Helper()
	var d Details
	v := reflect.ValueOf(&d).Elem()
	for i := range v.NumField() {
		state := r.IntN(3) // 0 absent, 1 null, 2 set
		f := v.Field(i).Addr().Interface()
		switch p := f.(type) {
		case *Opt[string]:
			*p = pick(state, randomString(r))
		case *Opt[int]:
			*p = pick(state, r.IntN(1<<31)-1<<30)
		case *Opt[int64]:
			*p = pick(state, r.Int64()-1<<62)
		case *Opt[bool]:
			*p = pick(state, r.IntN(2) == 0)
		case *Opt[[]string]:
			var l []string
			if r.IntN(4) > 0 {
				l = []string{}
				for range r.IntN(3) {
					l = append(l, randomString(r))
				}
			}
			*p = pick(state, l)
		case *Opt[[]Move]:
			var l []Move
			if r.IntN(4) > 0 {
				l = []Move{}
				for range r.IntN(3) {
					l = append(l, Move{From: randomString(r), To: randomString(r)})
				}
			}
			*p = pick(state, l)
		case *Opt[Usage]:
			*p = pick(state, randomUsage(r))
		case *Opt[[]Details]:
			var l []Details
			if depth > 0 && r.IntN(4) > 0 {
				l = []Details{}
				for range r.IntN(3) {
					l = append(l, randomDetails(t, r, depth-1))
				}
			}
			*p = pick(state, l)
		default:
			t.Fatalf("Details.%s: type %T not covered by AppendDetails's test", v.Type().Field(i).Name, f)
		}
	}
	return d
}

func pick[T any](state int, v T) Opt[T] {
	switch state {
	case 1:
		return Null[T]()
	case 2:
		return Some(v)
	}
	return Opt[T]{}
}

// TestAppendJSONMatchesEncodingJSON: the hand-written encoders write what
// encoding/json writes, for random values of every field.
func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(18, 18))
	for i := range 2000 {
		d := randomDetails(t, r, 2)
		if got, want := AppendDetails(nil, &d), encodingJSON(t, d); !bytes.Equal(got, want) {
			t.Fatalf("case %d: AppendDetails\n got %s\nwant %s", i, got, want)
		}
		res := TextResult(randomString(r), d)
		if i%7 == 0 {
			res.Content = nil
		}
		if got, want := res.AppendJSON(nil), encodingJSON(t, res); !bytes.Equal(got, want) {
			t.Fatalf("case %d: Result.AppendJSON\n got %s\nwant %s", i, got, want)
		}
		reply := ListReply{Instance: randomString(r), Total: r.IntN(100), Partial: r.IntN(2) == 0}
		if i%5 > 0 {
			reply.Sessions = []ListedSession{}
			for range r.IntN(3) {
				reply.Sessions = append(reply.Sessions, ListedSession{SessionKey: randomString(r), Details: randomDetails(t, r, 0)})
			}
		}
		got := reply.AppendJSON(nil)
		if want := encodingJSON(t, reply); !bytes.Equal(got, want) {
			t.Fatalf("case %d: ListReply.AppendJSON\n got %s\nwant %s", i, got, want)
		}
		pr := ProcessReply{Result: res, Gone: r.IntN(2) == 0}
		if r.IntN(2) == 0 {
			pr.Instance = randomString(r)
		}
		if got, want := pr.AppendJSON(nil), encodingJSON(t, pr); !bytes.Equal(got, want) {
			t.Fatalf("case %d: ProcessReply.AppendJSON\n got %s\nwant %s", i, got, want)
		}
		er := ExecReply{Result: res}
		if r.IntN(2) == 0 {
			er.Instance = randomString(r)
		}
		if got, want := er.AppendJSON(nil), encodingJSON(t, er); !bytes.Equal(got, want) {
			t.Fatalf("case %d: ExecReply.AppendJSON\n got %s\nwant %s", i, got, want)
		}
		var back ListReply
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
	}
}

// TestOptFastUnmarshalMatchesEncodingJSON: the shortcut for plain scalars
// decodes what encoding/json decodes, and refuses what it refuses.
func TestOptFastUnmarshalMatchesEncodingJSON(t *testing.T) {
	inputs := []string{`"abc"`, `""`, `"a\"b"`, `"\u00e9"`, `"é"`, "\"\xff\"", `"<&>"`, `0`, `-0`, `7`, `-12`, `007`, `1.5`, `1e3`,
		`9223372036854775807`, `9223372036854775808`, `-9223372036854775808`, `true`, `false`, `"true"`, `12`, `"12"`}
	check := func(t *testing.T, in string, fast func([]byte) (any, error), slow func([]byte) (any, error)) {
		got, gerr := fast([]byte(in))
		want, werr := slow([]byte(in))
		if (gerr != nil) != (werr != nil) || gerr == nil && !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %v, %v; encoding/json %v, %v", in, got, gerr, want, werr)
		}
	}
	for _, in := range inputs {
		check(t, in, func(b []byte) (any, error) { var o Opt[string]; err := o.UnmarshalJSON(b); return o.Value(), err },
			func(b []byte) (any, error) { var v string; err := json.Unmarshal(b, &v); return v, err })
		check(t, in, func(b []byte) (any, error) { var o Opt[int]; err := o.UnmarshalJSON(b); return o.Value(), err },
			func(b []byte) (any, error) { var v int; err := json.Unmarshal(b, &v); return v, err })
		check(t, in, func(b []byte) (any, error) { var o Opt[int64]; err := o.UnmarshalJSON(b); return o.Value(), err },
			func(b []byte) (any, error) { var v int64; err := json.Unmarshal(b, &v); return v, err })
		check(t, in, func(b []byte) (any, error) { var o Opt[bool]; err := o.UnmarshalJSON(b); return o.Value(), err },
			func(b []byte) (any, error) { var v bool; err := json.Unmarshal(b, &v); return v, err })
	}
}
