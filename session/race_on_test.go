//go:build race

package session

// raceEnabled: the race detector slows the output path so much that a
// flood may never reach floodBytes within floodWindow.
const raceEnabled = true
