package protocol

import "strconv"

// This file writes the JSON of results by hand: encoding/json validates
// and re-compacts what every Opt's MarshalJSON returns, at each level of
// nesting, which made a process list of 10 000 entries (4 MB) take
// hundreds of milliseconds to encode. The output is byte for byte what
// encoding/json writes with HTML escaping off (TestAppendJSONMatchesEncodingJSON
// checks every field of Details).

// AppendJSON appends the JSON of the result, as an encoding/json Encoder
// with SetEscapeHTML(false) writes it (without the newline).
func (r *Result) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"content":`...)
	if r.Content == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '[')
		for i, c := range r.Content {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"type":`...)
			dst = AppendJSONString(dst, c.Type)
			dst = append(dst, `,"text":`...)
			dst = AppendJSONString(dst, c.Text)
			dst = append(dst, '}')
		}
		dst = append(dst, ']')
	}
	dst = append(dst, `,"details":`...)
	dst = AppendDetails(dst, &r.Details)
	return append(dst, '}')
}

// AppendJSON appends the JSON of the reply, as encoding/json writes it
// with HTML escaping off.
func (r *ListReply) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"instance":`...)
	dst = AppendJSONString(dst, r.Instance)
	dst = append(dst, `,"sessions":`...)
	if r.Sessions == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '[')
		for i := range r.Sessions {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"sessionKey":`...)
			dst = AppendJSONString(dst, r.Sessions[i].SessionKey)
			dst = append(dst, `,"details":`...)
			dst = AppendDetails(dst, &r.Sessions[i].Details)
			dst = append(dst, '}')
		}
		dst = append(dst, ']')
	}
	dst = append(dst, `,"total":`...)
	dst = strconv.AppendInt(dst, int64(r.Total), 10)
	if r.Partial {
		dst = append(dst, `,"partial":true`...)
	}
	return append(dst, '}')
}

// AppendJSON appends the JSON of the reply, as encoding/json writes it
// with HTML escaping off.
func (r *ProcessReply) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"result":`...)
	dst = r.Result.AppendJSON(dst)
	if r.Gone {
		dst = append(dst, `,"gone":true`...)
	}
	if r.Instance != "" {
		dst = append(dst, `,"instance":`...)
		dst = AppendJSONString(dst, r.Instance)
	}
	return append(dst, '}')
}

// AppendJSON appends the JSON of the reply, as encoding/json writes it
// with HTML escaping off (a node's exec answer, on every exec's path).
func (r *ExecReply) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"result":`...)
	dst = r.Result.AppendJSON(dst)
	if r.Instance != "" {
		dst = append(dst, `,"instance":`...)
		dst = AppendJSONString(dst, r.Instance)
	}
	return append(dst, '}')
}

// AppendDetails appends the JSON of d, as encoding/json writes it with
// HTML escaping off: absent fields left out, null ones null.
func AppendDetails(dst []byte, d *Details) []byte {
	n := len(dst)
	dst = append(dst, '{')
	key := func(dst []byte, k string) []byte {
		if len(dst) > n+1 {
			dst = append(dst, ',')
		}
		dst = append(dst, '"')
		dst = append(dst, k...)
		return append(dst, '"', ':')
	}
	switch d.Added.state {
	case optSet:
		dst = key(dst, "added")
		v := d.Added.v
		dst = appendStrings(dst, v)
	case optNull:
		dst = append(key(dst, "added"), "null"...)
	}
	switch d.Aggregated.state {
	case optSet:
		dst = key(dst, "aggregated")
		v := d.Aggregated.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "aggregated"), "null"...)
	}
	switch d.ApprovalID.state {
	case optSet:
		dst = key(dst, "approvalId")
		v := d.ApprovalID.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "approvalId"), "null"...)
	}
	switch d.ApprovalSlug.state {
	case optSet:
		dst = key(dst, "approvalSlug")
		v := d.ApprovalSlug.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "approvalSlug"), "null"...)
	}
	switch d.Command.state {
	case optSet:
		dst = key(dst, "command")
		v := d.Command.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "command"), "null"...)
	}
	switch d.Cwd.state {
	case optSet:
		dst = key(dst, "cwd")
		v := d.Cwd.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "cwd"), "null"...)
	}
	switch d.Deleted.state {
	case optSet:
		dst = key(dst, "deleted")
		v := d.Deleted.v
		dst = appendStrings(dst, v)
	case optNull:
		dst = append(key(dst, "deleted"), "null"...)
	}
	switch d.DurationMs.state {
	case optSet:
		dst = key(dst, "durationMs")
		v := d.DurationMs.v
		dst = strconv.AppendInt(dst, v, 10)
	case optNull:
		dst = append(key(dst, "durationMs"), "null"...)
	}
	switch d.EndedAt.state {
	case optSet:
		dst = key(dst, "endedAt")
		v := d.EndedAt.v
		dst = strconv.AppendInt(dst, v, 10)
	case optNull:
		dst = append(key(dst, "endedAt"), "null"...)
	}
	switch d.Error.state {
	case optSet:
		dst = key(dst, "error")
		v := d.Error.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "error"), "null"...)
	}
	switch d.ExitCode.state {
	case optSet:
		dst = key(dst, "exitCode")
		v := d.ExitCode.v
		dst = strconv.AppendInt(dst, int64(v), 10)
	case optNull:
		dst = append(key(dst, "exitCode"), "null"...)
	}
	switch d.ExitReason.state {
	case optSet:
		dst = key(dst, "exitReason")
		v := d.ExitReason.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "exitReason"), "null"...)
	}
	switch d.ExitSignal.state {
	case optSet:
		dst = key(dst, "exitSignal")
		v := d.ExitSignal.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "exitSignal"), "null"...)
	}
	switch d.ExpiresAtMs.state {
	case optSet:
		dst = key(dst, "expiresAtMs")
		v := d.ExpiresAtMs.v
		dst = strconv.AppendInt(dst, v, 10)
	case optNull:
		dst = append(key(dst, "expiresAtMs"), "null"...)
	}
	switch d.FailureKind.state {
	case optSet:
		dst = key(dst, "failureKind")
		v := d.FailureKind.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "failureKind"), "null"...)
	}
	switch d.FollowUp.state {
	case optSet:
		dst = key(dst, "followUp")
		v := d.FollowUp.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "followUp"), "null"...)
	}
	switch d.Host.state {
	case optSet:
		dst = key(dst, "host")
		v := d.Host.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "host"), "null"...)
	}
	switch d.IdleMs.state {
	case optSet:
		dst = key(dst, "idleMs")
		v := d.IdleMs.v
		dst = strconv.AppendInt(dst, v, 10)
	case optNull:
		dst = append(key(dst, "idleMs"), "null"...)
	}
	switch d.LastOutputAt.state {
	case optSet:
		dst = key(dst, "lastOutputAt")
		v := d.LastOutputAt.v
		dst = strconv.AppendInt(dst, v, 10)
	case optNull:
		dst = append(key(dst, "lastOutputAt"), "null"...)
	}
	switch d.Limit.state {
	case optSet:
		dst = key(dst, "limit")
		v := d.Limit.v
		dst = strconv.AppendInt(dst, int64(v), 10)
	case optNull:
		dst = append(key(dst, "limit"), "null"...)
	}
	switch d.Lost.state {
	case optSet:
		dst = key(dst, "lost")
		v := d.Lost.v
		dst = strconv.AppendBool(dst, v)
	case optNull:
		dst = append(key(dst, "lost"), "null"...)
	}
	switch d.Modified.state {
	case optSet:
		dst = key(dst, "modified")
		v := d.Modified.v
		dst = appendStrings(dst, v)
	case optNull:
		dst = append(key(dst, "modified"), "null"...)
	}
	switch d.Moved.state {
	case optSet:
		dst = key(dst, "moved")
		v := d.Moved.v
		dst = appendMoves(dst, v)
	case optNull:
		dst = append(key(dst, "moved"), "null"...)
	}
	switch d.Name.state {
	case optSet:
		dst = key(dst, "name")
		v := d.Name.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "name"), "null"...)
	}
	switch d.NextOffset.state {
	case optSet:
		dst = key(dst, "nextOffset")
		v := d.NextOffset.v
		dst = strconv.AppendInt(dst, int64(v), 10)
	case optNull:
		dst = append(key(dst, "nextOffset"), "null"...)
	}
	switch d.NoOutputTimedOut.state {
	case optSet:
		dst = key(dst, "noOutputTimedOut")
		v := d.NoOutputTimedOut.v
		dst = strconv.AppendBool(dst, v)
	case optNull:
		dst = append(key(dst, "noOutputTimedOut"), "null"...)
	}
	switch d.NodeID.state {
	case optSet:
		dst = key(dst, "nodeId")
		v := d.NodeID.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "nodeId"), "null"...)
	}
	switch d.NodeName.state {
	case optSet:
		dst = key(dst, "nodeName")
		v := d.NodeName.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "nodeName"), "null"...)
	}
	switch d.Offset.state {
	case optSet:
		dst = key(dst, "offset")
		v := d.Offset.v
		dst = strconv.AppendInt(dst, int64(v), 10)
	case optNull:
		dst = append(key(dst, "offset"), "null"...)
	}
	switch d.Output.state {
	case optSet:
		dst = key(dst, "output")
		v := d.Output.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "output"), "null"...)
	}
	switch d.PID.state {
	case optSet:
		dst = key(dst, "pid")
		v := d.PID.v
		dst = strconv.AppendInt(dst, int64(v), 10)
	case optNull:
		dst = append(key(dst, "pid"), "null"...)
	}
	switch d.RetryInMs.state {
	case optSet:
		dst = key(dst, "retryInMs")
		v := d.RetryInMs.v
		dst = strconv.AppendInt(dst, int64(v), 10)
	case optNull:
		dst = append(key(dst, "retryInMs"), "null"...)
	}
	switch d.RuntimeMs.state {
	case optSet:
		dst = key(dst, "runtimeMs")
		v := d.RuntimeMs.v
		dst = strconv.AppendInt(dst, v, 10)
	case optNull:
		dst = append(key(dst, "runtimeMs"), "null"...)
	}
	switch d.SessionID.state {
	case optSet:
		dst = key(dst, "sessionId")
		v := d.SessionID.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "sessionId"), "null"...)
	}
	switch d.Sessions.state {
	case optSet:
		dst = key(dst, "sessions")
		v := d.Sessions.v
		dst = appendDetailsList(dst, v)
	case optNull:
		dst = append(key(dst, "sessions"), "null"...)
	}
	switch d.StartedAt.state {
	case optSet:
		dst = key(dst, "startedAt")
		v := d.StartedAt.v
		dst = strconv.AppendInt(dst, v, 10)
	case optNull:
		dst = append(key(dst, "startedAt"), "null"...)
	}
	switch d.Status.state {
	case optSet:
		dst = key(dst, "status")
		v := d.Status.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "status"), "null"...)
	}
	switch d.StdinWritable.state {
	case optSet:
		dst = key(dst, "stdinWritable")
		v := d.StdinWritable.v
		dst = strconv.AppendBool(dst, v)
	case optNull:
		dst = append(key(dst, "stdinWritable"), "null"...)
	}
	switch d.Tail.state {
	case optSet:
		dst = key(dst, "tail")
		v := d.Tail.v
		dst = AppendJSONString(dst, v)
	case optNull:
		dst = append(key(dst, "tail"), "null"...)
	}
	switch d.TimedOut.state {
	case optSet:
		dst = key(dst, "timedOut")
		v := d.TimedOut.v
		dst = strconv.AppendBool(dst, v)
	case optNull:
		dst = append(key(dst, "timedOut"), "null"...)
	}
	switch d.Total.state {
	case optSet:
		dst = key(dst, "total")
		v := d.Total.v
		dst = strconv.AppendInt(dst, int64(v), 10)
	case optNull:
		dst = append(key(dst, "total"), "null"...)
	}
	switch d.TotalChars.state {
	case optSet:
		dst = key(dst, "totalChars")
		v := d.TotalChars.v
		dst = strconv.AppendInt(dst, int64(v), 10)
	case optNull:
		dst = append(key(dst, "totalChars"), "null"...)
	}
	switch d.TotalLines.state {
	case optSet:
		dst = key(dst, "totalLines")
		v := d.TotalLines.v
		dst = strconv.AppendInt(dst, int64(v), 10)
	case optNull:
		dst = append(key(dst, "totalLines"), "null"...)
	}
	switch d.Truncated.state {
	case optSet:
		dst = key(dst, "truncated")
		v := d.Truncated.v
		dst = strconv.AppendBool(dst, v)
	case optNull:
		dst = append(key(dst, "truncated"), "null"...)
	}
	switch d.Usage.state {
	case optSet:
		dst = key(dst, "usage")
		v := d.Usage.v
		dst = appendUsage(dst, &v)
	case optNull:
		dst = append(key(dst, "usage"), "null"...)
	}
	switch d.WaitingForInput.state {
	case optSet:
		dst = key(dst, "waitingForInput")
		v := d.WaitingForInput.v
		dst = strconv.AppendBool(dst, v)
	case optNull:
		dst = append(key(dst, "waitingForInput"), "null"...)
	}
	return append(dst, '}')
}

func appendStrings(dst []byte, v []string) []byte {
	if v == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i, s := range v {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = AppendJSONString(dst, s)
	}
	return append(dst, ']')
}

func appendMoves(dst []byte, v []Move) []byte {
	if v == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i, m := range v {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"from":`...)
		dst = AppendJSONString(dst, m.From)
		dst = append(dst, `,"to":`...)
		dst = AppendJSONString(dst, m.To)
		dst = append(dst, '}')
	}
	return append(dst, ']')
}

func appendDetailsList(dst []byte, v []Details) []byte {
	if v == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i := range v {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = AppendDetails(dst, &v[i])
	}
	return append(dst, ']')
}

func appendUsage(dst []byte, u *Usage) []byte {
	dst = append(dst, `{"cpuUserMs":`...)
	dst = strconv.AppendInt(dst, u.CPUUserMs, 10)
	dst = append(dst, `,"cpuSystemMs":`...)
	dst = strconv.AppendInt(dst, u.CPUSystemMs, 10)
	if u.MemoryPeakBytes != nil {
		dst = append(dst, `,"memoryPeakBytes":`...)
		dst = strconv.AppendUint(dst, *u.MemoryPeakBytes, 10)
	}
	if u.PidsPeak != nil {
		dst = append(dst, `,"pidsPeak":`...)
		dst = strconv.AppendUint(dst, *u.PidsPeak, 10)
	}
	dst = append(dst, `,"scope":`...)
	dst = AppendJSONString(dst, u.Scope)
	return append(dst, '}')
}
