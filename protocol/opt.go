package protocol

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// Opt is a value of a result's details that may be absent, null or set.
// OpenClaw's results tell these apart (a failed exec has "exitCode": null,
// a poll of a killed session has no exitCode at all), so a details field
// is an Opt and says which one it is. The zero value is absent.
//
// In JSON an absent Opt is left out (struct fields are tagged omitzero), a
// null one is null, a set one is its value.
type Opt[T any] struct {
	v     T
	state optState
}

type optState uint8

const (
	optAbsent optState = iota
	optSet
	optNull
)

// Some returns an Opt holding v.
func Some[T any](v T) Opt[T] { return Opt[T]{v: v, state: optSet} }

// Null returns an Opt that is present with a null value.
func Null[T any]() Opt[T] { return Opt[T]{state: optNull} }

// SomeOrNull returns Some(*p), or Null when p is nil.
func SomeOrNull[T any](p *T) Opt[T] {
	if p == nil {
		return Null[T]()
	}
	return Some(*p)
}

// Get returns the value and whether one is set (false when absent or null).
func (o Opt[T]) Get() (T, bool) { return o.v, o.state == optSet }

// Value returns the value, or the zero value when absent or null.
func (o Opt[T]) Value() T { return o.v }

// Set reports whether the Opt holds a value (not absent, not null).
func (o Opt[T]) Set() bool { return o.state == optSet }

// IsNull reports whether the Opt is present with a null value.
func (o Opt[T]) IsNull() bool { return o.state == optNull }

// IsZero reports whether the Opt is absent; encoding/json's omitzero uses
// it to leave absent fields out.
func (o Opt[T]) IsZero() bool { return o.state == optAbsent }

// Ptr returns a pointer to a copy of the value, or nil when absent or null.
func (o Opt[T]) Ptr() *T {
	if o.state != optSet {
		return nil
	}
	v := o.v
	return &v
}

// MarshalJSON writes the value without escaping HTML characters: the
// encoder that calls it applies its own escaping policy to the whole
// document (json.Marshal escapes <, > and &; the HTTP API's encoder does
// not), exactly as it did for the map of values this type replaced.
func (o Opt[T]) MarshalJSON() ([]byte, error) {
	if o.state != optSet {
		return []byte("null"), nil
	}
	return appendJSON(nil, o.v)
}

// UnmarshalJSON reads a value, or null. A key that is not in the document
// stays absent (encoding/json does not call UnmarshalJSON for it).
func (o *Opt[T]) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		var zero T
		o.v, o.state = zero, optNull
		return nil
	}
	if fastUnmarshal(b, &o.v) {
		o.state = optSet
		return nil
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	o.v, o.state = v, optSet
	return nil
}

// fastUnmarshal decodes the common scalars of plain form without a second
// encoding/json pass (which validates b again and decodes by reflection):
// strings without escapes or non-ASCII bytes, integers of digits only,
// true and false. It reports false for anything else, which then takes
// encoding/json's way, with its errors.
func fastUnmarshal(b []byte, p any) bool {
	switch p := p.(type) {
	case *string:
		if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
			return false
		}
		for _, c := range b[1 : len(b)-1] {
			if c < 0x20 || c == '\\' || c == '"' || c >= utf8.RuneSelf {
				return false
			}
		}
		*p = string(b[1 : len(b)-1])
		return true
	case *int:
		n, ok := plainInt(b)
		if ok && int64(int(n)) == n {
			*p = int(n)
		}
		return ok && int64(int(n)) == n
	case *int64:
		n, ok := plainInt(b)
		if ok {
			*p = n
		}
		return ok
	case *bool:
		switch string(b) {
		case "true":
			*p = true
			return true
		case "false":
			*p = false
			return true
		}
	}
	return false
}

// plainInt parses an optional minus and decimal digits (no leading zero
// but "0"), as JSON writes an integer.
func plainInt(b []byte) (int64, bool) {
	digits := b
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 1 && digits[0] == '0' {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	return n, err == nil
}

// appendJSON appends the JSON of v with HTML characters unescaped. The
// common scalar types are written directly; anything else goes through an
// encoder that does not escape HTML.
func appendJSON(dst []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case string:
		return AppendJSONString(dst, x), nil
	case int:
		return strconv.AppendInt(dst, int64(x), 10), nil
	case int64:
		return strconv.AppendInt(dst, x, 10), nil
	case bool:
		return strconv.AppendBool(dst, x), nil
	case []string:
		if x == nil {
			return append(dst, "null"...), nil
		}
		dst = append(dst, '[')
		for i, s := range x {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendJSONString(dst, s)
		}
		return append(dst, ']'), nil
	}
	var buf bytes.Buffer
	buf.Write(dst)
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

const hexDigits = "0123456789abcdef"

// AppendJSONString appends s as a JSON string the way encoding/json writes
// it with HTML escaping off: control characters escaped (\b, \f, \n, \r,
// \t by name, the others as \u00XX), invalid UTF-8 as \ufffd, U+2028 and
// U+2029 escaped, everything else as is.
func AppendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
