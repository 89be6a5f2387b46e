//go:build race

package hostbus

// raceEnabled: the race detector slows the session core's reading of
// random output tenfold; the tests stream less under it.
const raceEnabled = true
