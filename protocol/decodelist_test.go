package protocol

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// listEntry is a running session's list entry as a host writes it.
func listEntry(i int) Details {
	return Details{SessionID: Some("nimble-coral"), Status: Some(StatusRunning), RuntimeMs: Some(int64(1234 + i)),
		PID: Some(4000 + i), Usage: Some(Usage{CPUUserMs: 1, CPUSystemMs: 2, Scope: UsageScopeTree}), StartedAt: Some(int64(1764600000000 + i)),
		Cwd: Some("/home/u"), Command: Some("sleep 600"), Tail: Some(""), Truncated: Some(false), Name: Some("sleep 600"),
		StdinWritable: Some(false), WaitingForInput: Some(false), IdleMs: Some(int64(5)), LastOutputAt: Some(int64(1764600000000))}
}

// decodeBoth decodes b with DecodeListReply and with json.Unmarshal and
// fails unless they agree (on the value, or on refusing).
func decodeBoth(t *testing.T, b []byte) {
	t.Helper()
	var got, want ListReply
	gerr := DecodeListReply(b, &got)
	werr := json.Unmarshal(b, &want)
	if (gerr == nil) != (werr == nil) {
		t.Fatalf("%q: DecodeListReply error %v, json.Unmarshal error %v", b, gerr, werr)
	}
	if werr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\nDecodeListReply %+v\njson.Unmarshal  %+v", b, got, want)
	}
	// DecodeListEntries: the same entries, kept as they are.
	checkEntries(t, b, want, werr)
}

// TestDecodeListReplyMatchesEncodingJSON: the parser of the plain form
// decodes what encoding/json decodes from random replies in both
// encodings, and from mangled copies of them (cut short, a byte changed,
// keys in other letter cases), where it must refuse or agree.
func TestDecodeListReplyMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(18, 10000))
	for i := range 1500 {
		reply := ListReply{Instance: randomString(r), Total: r.IntN(100), Partial: r.IntN(2) == 0}
		if i%9 > 0 {
			reply.Sessions = []ListedSession{}
			for j := range r.IntN(4) {
				d := listEntry(j)
				if i%3 == 0 {
					d = randomDetails(t, r, 0)
				}
				reply.Sessions = append(reply.Sessions, ListedSession{SessionKey: randomString(r), Details: d})
			}
		}
		marshalled, err := json.Marshal(reply)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range [][]byte{reply.AppendJSON(nil), marshalled} {
			decodeBoth(t, b)
			var fast ListReply
			if p := (listParser{b: b, s: string(b)}); i%3 != 0 && !(p.listReply(&fast) && p.end()) {
				t.Fatalf("plain reply not taken by the fast parser: %s", b)
			}
			for range 8 {
				decodeBoth(t, mangled(r, b, `"sessionId"`))
			}
		}
	}
	for _, b := range []string{`null`, ` {} `, `{"sessions":null}`, `{"sessions":[],"sessions":[{}]}`, `{"total":1.0}`, `{"total":1e2}`,
		`{"total":01}`, `{"instance":"a\u00e9\n"}`, `{"instance":"\ud800"}`, `{"sessions":[{"details":{"usage":{"cpuUserMs":null}}}]}`,
		`{"sessions":[{"details":{"pid":99999999999999999999}}]}`, `{"sessions":[{"details":{"usage":{"pidsPeak":-1}}}]}`,
		`{"sessions":[{"details":{"usage":{"pidsPeak":1,"pidsPeak":null}}}]}`, `{"sessions":[{"details":{"tail":"x","tail":null}}]}`,
		`{"unknown":1}`, `{"total":1}x`, `{"partial":truex}`} {
		decodeBoth(t, []byte(b))
	}
}

// bigListReply is the encoded list reply of n sessions, for benchmarks.
func bigListReply(n int) []byte {
	reply := ListReply{Instance: "i", Total: n}
	for i := range n {
		reply.Sessions = append(reply.Sessions, ListedSession{SessionKey: "agent:main:main", Details: listEntry(i)})
	}
	return reply.AppendJSON(nil)
}

func BenchmarkDecodeListReply(b *testing.B) {
	data := bigListReply(10000)
	b.Run("fast", func(b *testing.B) {
		for b.Loop() {
			var r ListReply
			if err := DecodeListReply(data, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			var r ListReply
			if err := json.Unmarshal(data, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// mangled returns a copy of b cut short, with one byte changed, or with
// key (a quoted key) in other letter cases: what a decoder must refuse or
// read as encoding/json does.
func mangled(r *rand.Rand, b []byte, key string) []byte {
	const mangle = `{}[]",:-.0123456789eEnultrfase\ aXé` + "\x00\xff"
	m := bytes.Clone(b)
	switch r.IntN(3) {
	case 0:
		return m[:r.IntN(len(m))]
	case 1:
		m[r.IntN(len(m))] = mangle[r.IntN(len(mangle))]
		return m
	default:
		return bytes.Replace(m, []byte(key), []byte(strings.ToUpper(key[:2])+key[2:]), 1)
	}
}

// FuzzDecodeListReply: on any input (a node's reply is untrusted), the
// list parsers agree with encoding/json, never panic, and keep only
// entries that re-encode as they came.
func FuzzDecodeListReply(f *testing.F) {
	f.Add(bigListReply(2))
	f.Add([]byte(`{"instance":"i","sessions":[{"sessionKey":"k","details":{"sessionId":"a"}}],"total":1}`))
	f.Add([]byte(`{"sessions":null}`))
	f.Fuzz(func(t *testing.T, b []byte) { decodeBoth(t, b) })
}
