package protocol

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
)

// decodeReplyBoth checks that DecodeExecReply and DecodeProcessReply
// agree with json.Unmarshal on b: the same error or none, the same value.
func decodeReplyBoth(t *testing.T, b []byte) {
	t.Helper()
	var ge, we ExecReply
	gerr, werr := DecodeExecReply(b, &ge), json.Unmarshal(b, &we)
	if (gerr == nil) != (werr == nil) || (werr == nil && !reflect.DeepEqual(ge, we)) {
		t.Fatalf("%q:\nDecodeExecReply %+v (%v)\njson.Unmarshal  %+v (%v)", b, ge, gerr, we, werr)
	}
	var gp, wp ProcessReply
	gerr, werr = DecodeProcessReply(b, &gp), json.Unmarshal(b, &wp)
	if (gerr == nil) != (werr == nil) || (werr == nil && !reflect.DeepEqual(gp, wp)) {
		t.Fatalf("%q:\nDecodeProcessReply %+v (%v)\njson.Unmarshal     %+v (%v)", b, gp, gerr, wp, werr)
	}
}

// TestDecodeRepliesMatchEncodingJSON: the plain-form parser decodes exec
// and process replies as encoding/json does, from random results in both
// encodings and from mangled copies (cut short, a byte changed, a key in
// another letter case), where it must refuse or agree; the plain form of
// a result without lists is taken by the parser itself.
func TestDecodeRepliesMatchEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(18, 20000))
	for i := range 1500 {
		d := randomDetails(t, r, 0)
		if i%2 == 0 {
			d = Details{Status: Some(StatusCompleted), ExitCode: Some(r.IntN(3)), DurationMs: Some(int64(r.IntN(1000))),
				Aggregated: Some(randomString(r)), Cwd: Some(randomString(r)), SessionID: Null[string]()}
		}
		res := TextResult(randomString(r), d)
		if i%7 == 0 {
			res.Content = append(res.Content, Content{Type: "text", Text: randomString(r)})
		}
		er := ExecReply{Result: res, Instance: randomString(r)}
		pr := ProcessReply{Result: res, Gone: r.IntN(2) == 0, Instance: randomString(r)}
		for _, v := range []any{er, pr} {
			marshalled, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			hand := er.AppendJSON(nil)
			if p, ok := v.(ProcessReply); ok {
				hand = p.AppendJSON(nil)
			}
			for _, b := range [][]byte{hand, marshalled} {
				decodeReplyBoth(t, b)
				var fast ProcessReply
				if p := (listParser{b: b, s: string(b)}); i%2 == 0 && !(p.reply(&fast.Result, &fast.Instance, &fast.Gone) && p.end()) {
					t.Fatalf("plain reply not taken by the fast parser: %s", b)
				}
				for range 6 {
					decodeReplyBoth(t, mangled(r, b, `"text"`))
				}
			}
		}
	}
	for _, b := range []string{`null`, ` {} `, `{"result":null}`, `{"result":{"content":[]}}`, `{"result":{"content":null,"content":[]}}`,
		`{"gone":true,"gone":false}`, `{"result":{"details":{"exitCode":1.5}}}`, `{"instance":"a\u00e9"}`, `{"result":{"content":[{"type":"text","text":"\ud800"}]}}`,
		`{"result":{"details":{"added":["a"]}}}`, `{"result":{},"extra":1}`} {
		decodeReplyBoth(t, []byte(b))
	}
}

// FuzzDecodeReplies: on any input (a node's reply is untrusted), the exec
// and process reply parsers agree with encoding/json and never panic.
func FuzzDecodeReplies(f *testing.F) {
	f.Add([]byte(`{"result":{"content":[{"type":"text","text":"hi\n"}],"details":{"status":"completed","exitCode":0}},"instance":"i"}`))
	f.Add([]byte(`{"result":{"content":[],"details":{"status":"running","sessionId":"a"}},"gone":true}`))
	f.Fuzz(func(t *testing.T, b []byte) { decodeReplyBoth(t, b) })
}
