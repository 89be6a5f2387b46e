package session

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Key encoding for process send-keys and paste (spec §16,
// conformance/send_keys.json, paste.json): tmux-style key names, xterm
// modifier sequences, DECCKM application cursor keys.

const (
	esc                 = "\x1b"
	bracketedPasteStart = esc + "[200~"
	bracketedPasteEnd   = esc + "[201~"
)

// namedKeys maps lower-case key names to their bytes.
var namedKeys = map[string]string{
	"enter": "\r", "return": "\r",
	"tab":    "\t",
	"escape": esc, "esc": esc,
	"space":  " ",
	"bspace": "\x7f", "backspace": "\x7f",
	"up": esc + "[A", "down": esc + "[B", "right": esc + "[C", "left": esc + "[D",
	"home": esc + "[1~", "end": esc + "[4~",
	"pageup": esc + "[5~", "pgup": esc + "[5~", "ppage": esc + "[5~",
	"pagedown": esc + "[6~", "pgdn": esc + "[6~", "npage": esc + "[6~",
	"insert": esc + "[2~", "ic": esc + "[2~",
	"delete": esc + "[3~", "del": esc + "[3~", "dc": esc + "[3~",
	"btab": esc + "[Z",
	"f1":   esc + "OP", "f2": esc + "OQ", "f3": esc + "OR", "f4": esc + "OS",
	"f5": esc + "[15~", "f6": esc + "[17~", "f7": esc + "[18~", "f8": esc + "[19~",
	"f9": esc + "[20~", "f10": esc + "[21~", "f11": esc + "[23~", "f12": esc + "[24~",
	"kp/": esc + "Oo", "kp*": esc + "Oj", "kp-": esc + "Om", "kp+": esc + "Ok",
	"kp7": esc + "Ow", "kp8": esc + "Ox", "kp9": esc + "Oy",
	"kp4": esc + "Ot", "kp5": esc + "Ou", "kp6": esc + "Ov",
	"kp1": esc + "Oq", "kp2": esc + "Or", "kp3": esc + "Os",
	"kp0": esc + "Op", "kp.": esc + "On",
	"kpenter": esc + "OM",
}

// modifiableKeys take xterm modifier parameters (ESC[1;5A for C-up).
var modifiableKeys = map[string]bool{
	"up": true, "down": true, "left": true, "right": true, "home": true, "end": true,
	"pageup": true, "pgup": true, "ppage": true, "pagedown": true, "pgdn": true, "npage": true,
	"insert": true, "ic": true, "delete": true, "del": true, "dc": true,
}

// applicationKeys are the SS3 sequences of unmodified cursor keys in DECCKM
// application mode. Their names are the keys whose bytes depend on the
// mode, which is why send-keys refuses them while the mode is unknown.
var applicationKeys = map[string]string{
	"up": esc + "OA", "down": esc + "OB", "right": esc + "OC", "left": esc + "OD",
	"home": esc + "OH", "end": esc + "OF",
}

type keyMods struct{ ctrl, alt, shift bool }

func (m keyMods) any() bool { return m.ctrl || m.alt || m.shift }

// xterm is the xterm modifier parameter: 1 + shift + 2·alt + 4·ctrl.
func (m keyMods) xterm() int {
	v := 1
	if m.shift {
		v++
	}
	if m.alt {
		v += 2
	}
	if m.ctrl {
		v += 4
	}
	return v
}

// encodeKeys encodes a send-keys request: the literal text (UTF-8), then
// each valid hex byte, then each key token. Warnings name skipped hex
// bytes and unknown keys sent literally.
func encodeKeys(literal string, hexBytes, keys []string, mode cursorMode) ([]byte, []string) {
	var warnings []string
	data := []byte(literal)
	for _, raw := range hexBytes {
		b, ok := parseHexByte(raw)
		if !ok {
			warnings = append(warnings, "Invalid hex byte: "+raw)
			continue
		}
		data = append(data, b)
	}
	for _, tok := range keys {
		data = append(data, encodeKeyToken(tok, mode, &warnings)...)
	}
	return data, warnings
}

// hasCursorModeSensitiveKeys reports whether a request has an unmodified
// arrow, Home or End key, whose bytes depend on the cursor-key mode.
func hasCursorModeSensitiveKeys(keys []string) bool {
	for _, raw := range keys {
		tok := jsTrim(raw)
		if tok == "" {
			continue
		}
		mods, base, _ := parseModifiers(tok)
		if mods.any() {
			continue
		}
		if _, ok := applicationKeys[strings.ToLower(jsTrim(base))]; ok {
			return true
		}
	}
	return false
}

func encodeKeyToken(raw string, mode cursorMode, warnings *[]string) string {
	tok := jsTrim(raw)
	if tok == "" {
		return ""
	}
	if utf16Len(tok) == 2 && tok[0] == '^' {
		if c, ok := ctrlChar(tok[1:]); ok {
			return c
		}
	}
	mods, base, hasMods := parseModifiers(tok)
	lower := strings.ToLower(jsTrim(base))
	if lower == "tab" && mods.shift {
		return esc + "[Z"
	}
	if mode == cursorApplication && !mods.any() {
		if seq, ok := applicationKeys[lower]; ok {
			return seq
		}
	}
	if seq, ok := namedKeys[lower]; ok {
		if modifiableKeys[lower] && mods.any() {
			// ESC[A → ESC[1;mA, ESC[5~ → ESC[5;m~.
			param := seq[2 : len(seq)-1]
			if param == "" {
				param = "1"
			}
			return esc + "[" + param + ";" + strconv.Itoa(mods.xterm()) + seq[len(seq)-1:]
		}
		if mods.alt {
			return esc + seq
		}
		return seq
	}
	if utf16Len(base) == 1 {
		return applyCharModifiers(base, mods)
	}
	if hasMods {
		*warnings = append(*warnings, `Unknown key "`+base+`" for modifiers; sending literal.`)
	}
	return base
}

// parseModifiers strips C-, M- and S- prefixes (any case) while more than
// two UTF-16 units remain, so "C-" alone is literal text.
func parseModifiers(tok string) (keyMods, string, bool) {
	var mods keyMods
	rest := tok
	saw := false
	for utf16Len(rest) > 2 && rest[1] == '-' {
		switch rest[0] {
		case 'c', 'C':
			mods.ctrl = true
		case 'm', 'M':
			mods.alt = true
		case 's', 'S':
			mods.shift = true
		default:
			return mods, rest, saw
		}
		saw = true
		rest = rest[2:]
	}
	return mods, rest, saw
}

// applyCharModifiers applies modifiers to a single character.
func applyCharModifiers(ch string, mods keyMods) string {
	v := ch
	if mods.shift && len(v) == 1 && v[0] >= 'a' && v[0] <= 'z' {
		v = strings.ToUpper(v)
	}
	if mods.ctrl {
		if c, ok := ctrlChar(v); ok {
			v = c
		}
	}
	if mods.alt {
		v = esc + v
	}
	return v
}

// ctrlChar maps a character to its control code: ? → DEL, @ A–Z [ \ ] ^ _
// (either case) → 0x00–0x1f.
func ctrlChar(ch string) (string, bool) {
	r, size := utf8.DecodeRuneInString(ch)
	if size != len(ch) || runeUnits(r) != 1 {
		return "", false
	}
	if r == '?' {
		return "\x7f", true
	}
	if u := unicode.ToUpper(r); u >= 64 && u <= 95 {
		return string(rune(u & 0x1f)), true
	}
	return "", false
}

// parseHexByte parses one hex token: optional 0x, one or two hex digits.
func parseHexByte(raw string) (byte, bool) {
	s := strings.ToLower(jsTrim(raw))
	s = strings.TrimPrefix(s, "0x")
	if len(s) < 1 || len(s) > 2 {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 16, 8)
	if err != nil {
		return 0, false
	}
	return byte(v), true
}

// encodePaste wraps text in bracketed-paste markers unless bracketed is
// false.
func encodePaste(text string, bracketed bool) []byte {
	if !bracketed {
		return []byte(text)
	}
	return []byte(bracketedPasteStart + text + bracketedPasteEnd)
}

// sendKeysText is the result text of a successful send-keys.
func sendKeysText(sessionID string, n int, warnings []string) string {
	text := "Sent " + strconv.Itoa(n) + " bytes to session " + sessionID + "."
	if len(warnings) > 0 {
		text += "\nWarnings:\n- " + strings.Join(warnings, "\n- ")
	}
	return text
}
