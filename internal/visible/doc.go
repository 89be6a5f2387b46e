// Package visible shows text to an operator with every byte that could
// hide or disguise part of it written as a visible escape, so that what an
// operator approves is what they saw (DESIGN.md §3.4). A command line that
// carries "\x1b[2K" (erase the line), a backspace or a carriage return
// can overprint what a terminal shows; a U+202E (right-to-left override)
// or a zero-width space can reorder or hide characters on a page.
//
// The control page has a copy of String in JavaScript (function visible
// of ui/assets/visible.js); ui's TestVisibleMatchesGo holds the two equal
// code point for code point.
package visible
