package protocol

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// checkEntries fails unless DecodeListEntries of b agrees with want, what
// json.Unmarshal decoded (or refused with werr): each entry's Details and
// fields are want's, its JSON what AppendDetails writes of them, and so
// after SetNode.
func checkEntries(t *testing.T, b []byte, want ListReply, werr error) {
	t.Helper()
	got, err := DecodeListEntries(b)
	if (err == nil) != (werr == nil) {
		t.Fatalf("%q: DecodeListEntries error %v, json.Unmarshal error %v", b, err, werr)
	}
	if werr != nil {
		return
	}
	if got.Instance != want.Instance || got.Total != want.Total || got.Partial != want.Partial ||
		(got.Entries == nil) != (want.Sessions == nil) || len(got.Entries) != len(want.Sessions) {
		t.Fatalf("%q: DecodeListEntries %+v, json.Unmarshal %+v", b, got, want)
	}
	for i := range got.Entries {
		e, d := got.Entries[i], want.Sessions[i].Details
		checkEntry(t, b, &e, d)
		d.NodeID = Some("node-" + want.Instance)
		if i%3 == 2 {
			d.NodeID = Some("") // not a node's, but named as given
		}
		if i%2 == 0 {
			d.NodeName = Some("name <&> \u2028" + want.Instance)
		}
		e.SetNode(d.NodeID.Value(), d.NodeName.Value())
		checkEntry(t, b, &e, d)
	}
	lr := ListResult{Text: "t", Details: Details{Status: Some(StatusCompleted), Total: Some(3), Offset: Some(0)}, Entries: got.Entries}
	res := lr.Result()
	if a, w := lr.AppendJSON(nil), res.AppendJSON(nil); !bytes.Equal(a, w) {
		t.Fatalf("%q: ListResult.AppendJSON\n%s\nResult().AppendJSON\n%s", b, a, w)
	}
}

func checkEntry(t *testing.T, b []byte, e *ListEntry, d Details) {
	t.Helper()
	if got := e.Details(); !reflect.DeepEqual(got, d) {
		t.Fatalf("%q: entry Details\n%+v\nwant\n%+v", b, got, d)
	}
	if got, want := e.AppendJSON(nil), AppendDetails(nil, &d); !bytes.Equal(got, want) {
		t.Fatalf("%q: entry JSON\n%s\nwant\n%s", b, got, want)
	}
	var f ListEntry
	f.fill(&d)
	if e.SessionID != f.SessionID || e.Status != f.Status || e.Name != f.Name || e.Command != f.Command ||
		e.ExitReason != f.ExitReason || e.StartedAt != f.StartedAt || e.RuntimeMs != f.RuntimeMs || e.WaitingForInput != f.WaitingForInput {
		t.Fatalf("%q: entry fields %+v, want %+v", b, e, f)
	}
}

// TestDecodeListEntriesKeepsOnlyThePlainForm: an entry is kept as the
// host wrote it only in the form AppendDetails writes; in any other form
// (space, keys out of order or twice, escapes AppendJSONString does not
// write, -0, usage keys out of order, a node named already) its JSON is
// encoded again, so the answer is the same bytes.
func TestDecodeListEntriesKeepsOnlyThePlainForm(t *testing.T) {
	for _, entry := range []string{
		`{"sessionId":"a","status":"running"}`,
		`{}`,
		`{"command":"x"}`,
		`{"command":"x","status":"running"}`,
		`{ "sessionId":"a"}`,
		`{"status":"running","sessionId":"a"}`,
		`{"status":"running","status":"failed"}`,
		`{"command":"\u0041\/"}`,
		`{"command":"a\u2028b"}`,
		`{"command":"é\u00e9"}`,
		`{"command":"caf\u00e9","name":"\ud800"}`,
		`{"command":"\"q\"\n\u001b"}`,
		`{"command":"<&>"}`,
		`{"pid":-0}`,
		`{"usage":{"cpuSystemMs":1,"cpuUserMs":2,"scope":"tree"}}`,
		`{"usage":{"cpuUserMs":2,"cpuSystemMs":1,"memoryPeakBytes":null,"scope":"tree"}}`,
		`{"usage":{"cpuUserMs":2,"cpuSystemMs":1,"pidsPeak":3,"scope":"tree"}}`,
		`{"usage":null,"waitingForInput":true}`,
		`{"name":"n","nodeId":"old","sessionId":"a"}`,
		`{"nodeName":"old","sessionId":"a"}`,
		`{"nodeName":null}`,
		`{"noOutputTimedOut":false,"offset":1}`,
		`{"noOutputTimedOut":false}`,
		`{"tail":"a\u001fb\u000a"}`,
		`{"tail":"\u001F"}`,
		`{"tail":"\u001f\u2028"}`,
		`{"cwd":"\u2029x","tail":"\t"}`,
		`{"cwd":" "}`,
		`{"cwd":"\ud83c\udf89"}`,
		`{"cwd":"🎉"}`,
		`{"usage":{"cpuUserMs":1,"cpuSystemMs":2,"pidsPeak":3,"memoryPeakBytes":4,"scope":"tree"}}`,
		`{"usage":{"cpuUserMs":1,"cpuSystemMs":2,"memoryPeakBytes":4,"pidsPeak":3,"scope":"tree"}}`,
		`{"usage":{"cpuUserMs":1,"cpuSystemMs":2,"scope":"tree","pidsPeak":3}}`,
		`{"usage":{"cpuUserMs":-1,"cpuSystemMs":-0,"scope":"tree"}}`,
		`{"usage":{"cpuUserMs":1,"cpuSystemMs":2,"scope":null}}`,
		`{"exitCode":-12,"runtimeMs":null,"startedAt":1764600000000,"waitingForInput":true}`,
		`{"runtimeMs":1234567890123456789}`,
		`{"lost":true,"timedOut":false,"truncated":null}`,
		`{"sessionId":"a","status":"running","waitingForInput":true}`,
	} {
		b := []byte(`{"instance":"i","sessions":[{"sessionKey":"k","details":` + entry + `},{"sessionKey":"k","details":` + entry + `}],"total":2}`)
		var want ListReply
		werr := json.Unmarshal(b, &want)
		if werr != nil {
			t.Fatalf("%s: %v", entry, werr)
		}
		checkEntries(t, b, want, nil)
		got, _ := DecodeListEntries(b)
		plain := bytes.Equal(AppendDetails(nil, &want.Sessions[0].Details), []byte(entry))
		if kept := &got.Entries[0].JSON[0] == &b[bytes.Index(b, []byte(entry))]; kept != plain && !strings.Contains(entry, "node") {
			t.Errorf("%s: kept as written %v, want %v", entry, kept, plain)
		}
	}
}

// TestListEntriesOfManyReplies: long random replies in both encodings.
func TestListEntriesOfManyReplies(t *testing.T) {
	r := rand.New(rand.NewPCG(19, 10000))
	reply := ListReply{Instance: "i", Sessions: []ListedSession{}, Total: 400}
	for j := range 400 {
		d := listEntry(j)
		if j%4 == 0 {
			d = randomDetails(t, r, 1)
			d.Added, d.Deleted, d.Modified, d.Moved, d.Sessions = Opt[[]string]{}, Opt[[]string]{}, Opt[[]string]{}, Opt[[]Move]{}, Opt[[]Details]{}
		}
		reply.Sessions = append(reply.Sessions, ListedSession{SessionKey: "k", Details: d})
	}
	b := reply.AppendJSON(nil)
	var want ListReply
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	checkEntries(t, b, want, nil)
}

func BenchmarkDecodeListEntries(b *testing.B) {
	data := bigListReply(10000)
	b.Run("entries", func(b *testing.B) {
		for b.Loop() {
			if _, err := DecodeListEntries(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reply", func(b *testing.B) { // the Details of every entry
		for b.Loop() {
			var r ListReply
			if err := DecodeListReply(data, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	l, _ := DecodeListEntries(data)
	for i := range l.Entries {
		l.Entries[i].SetNode("c2bjexyc6hq5vj5q", "alpha")
	}
	r := ListResult{Text: strings.Repeat("x", 80*10000), Details: Details{Status: Some(StatusCompleted)}, Entries: l.Entries}
	b.Run("append", func(b *testing.B) {
		for b.Loop() {
			r.AppendJSON(make([]byte, 0, r.JSONSize()))
		}
	})
}

// TestDetailKeys: fastEntry's table is Details's keys in AppendDetails's
// order, each with the kind of its field.
func TestDetailKeys(t *testing.T) {
	typ := reflect.TypeOf(Details{})
	if typ.NumField() != len(detailKeys) {
		t.Fatalf("Details has %d fields, detailKeys %d", typ.NumField(), len(detailKeys))
	}
	kinds := map[reflect.Type]int{
		reflect.TypeOf(Opt[string]{}): kindString, reflect.TypeOf(Opt[int]{}): kindInt, reflect.TypeOf(Opt[int64]{}): kindInt,
		reflect.TypeOf(Opt[bool]{}): kindBool, reflect.TypeOf(Opt[Usage]{}): kindUsage,
	}
	for i := range typ.NumField() {
		f := typ.Field(i)
		key, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		kind := kinds[f.Type]
		if key == "nodeId" || key == "nodeName" {
			kind = kindNone
		}
		if detailKeys[i].key != key || detailKeys[i].kind != kind {
			t.Errorf("detailKeys[%d] = %v, want {%s %d}", i, detailKeys[i], key, kind)
		}
		if i > 0 && detailKeys[i-1].key >= key {
			t.Errorf("key %s after %s", key, detailKeys[i-1].key)
		}
	}
	for want, k := range map[string]int{"command": keyCommand, "exitReason": keyExitReason, "name": keyName, "nodeName": keyNodeName,
		"runtimeMs": keyRuntimeMs, "sessionId": keySessionID, "startedAt": keyStartedAt, "status": keyStatus, "waitingForInput": keyWaitingForInput} {
		if detailKeys[k].key != want {
			t.Errorf("index %d is %s, want %s", k, detailKeys[k].key, want)
		}
	}
}
