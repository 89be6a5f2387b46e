// visible(s) is the control page's copy of Go's internal/visible.String:
// every character that could hide or disguise part of a command (C0 and C1
// controls, DEL, format and bidi characters, separators, spaces other than
// U+0020, private-use and unassigned code points, default-ignorable
// fillers) becomes a visible escape, so that what an operator approves is
// what they saw. ui's TestVisibleMatchesGo holds the two equal code point
// for code point; change them together.
'use strict';

const VISIBLE_HIDDEN = /[^\p{L}\p{M}\p{N}\p{P}\p{S} ]|\p{Default_Ignorable_Code_Point}/gu;
const VISIBLE_SHORT = { '\x07': '\\a', '\b': '\\b', '\t': '\\t', '\n': '\\n', '\v': '\\v', '\f': '\\f', '\r': '\\r' };

function visible(s) {
  return String(s).replace(VISIBLE_HIDDEN, (c) => {
    if (VISIBLE_SHORT[c]) return VISIBLE_SHORT[c];
    const cp = c.codePointAt(0);
    const h = cp.toString(16);
    if (cp < 0x80) return '\\x' + h.padStart(2, '0');
    if (cp <= 0xffff) return '\\u' + h.padStart(4, '0');
    return '\\U' + h.padStart(8, '0');
  });
}

// Node (ui's tests) loads this file as a module; the page as a script.
if (typeof module === 'object' && module.exports) module.exports = visible;
