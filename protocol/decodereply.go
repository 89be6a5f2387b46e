package protocol

import "encoding/json"

// DecodeExecReply decodes an ExecReply as json.Unmarshal does. The plain
// form (what ExecReply.AppendJSON and json.Marshal write, a result whose
// details hold no lists) is read by the parser of DecodeListReply, on
// every node exec's path; anything else goes to json.Unmarshal, with its
// result and its errors.
func DecodeExecReply(b []byte, r *ExecReply) error {
	var fast ExecReply
	p := listParser{b: b, s: string(b)}
	if p.reply(&fast.Result, &fast.Instance, nil) && p.end() {
		*r = fast
		return nil
	}
	*r = ExecReply{}
	return json.Unmarshal(b, r)
}

// DecodeProcessReply is DecodeExecReply for a ProcessReply (a poll's, a
// kill's answer).
func DecodeProcessReply(b []byte, r *ProcessReply) error {
	var fast ProcessReply
	p := listParser{b: b, s: string(b)}
	if p.reply(&fast.Result, &fast.Instance, &fast.Gone) && p.end() {
		*r = fast
		return nil
	}
	*r = ProcessReply{}
	return json.Unmarshal(b, r)
}

// reply reads {"result":…,"instance":…} (and "gone" where gone is not
// nil), each key once.
func (p *listParser) reply(res *Result, instance *string, gone *bool) bool {
	var seen [3]bool
	once := func(i int) bool {
		if seen[i] {
			return false
		}
		seen[i] = true
		return true
	}
	return p.object(func(key string) bool {
		var ok bool
		switch key {
		case "result":
			return once(0) && p.result(res)
		case "instance":
			if !once(1) {
				return false
			}
			*instance, ok = p.str()
		case "gone":
			if gone == nil || !once(2) {
				return false
			}
			*gone, ok = p.bool()
		}
		return ok
	})
}

// result reads a Result: content blocks and details, each key once.
func (p *listParser) result(r *Result) bool {
	var seenContent, seenDetails bool
	return p.object(func(key string) bool {
		switch key {
		case "content":
			if seenContent {
				return false
			}
			seenContent = true
			if p.literal("null") {
				return true
			}
			if !p.byte('[') {
				return false
			}
			r.Content = []Content{}
			if p.byte(']') {
				return true
			}
			for {
				var c Content
				if !p.content(&c) {
					return false
				}
				r.Content = append(r.Content, c)
				if p.byte(']') {
					return true
				}
				if !p.byte(',') {
					return false
				}
			}
		case "details":
			if seenDetails {
				return false
			}
			seenDetails = true
			return p.details(&r.Details)
		}
		return false
	})
}

// content reads one {"type":…,"text":…} block.
func (p *listParser) content(c *Content) bool {
	var seenType, seenText bool
	return p.object(func(key string) bool {
		var ok bool
		switch key {
		case "type":
			if seenType {
				return false
			}
			seenType = true
			c.Type, ok = p.str()
		case "text":
			if seenText {
				return false
			}
			seenText = true
			c.Text, ok = p.str()
		}
		return ok
	})
}
