//go:build !race

package hostbus

const raceEnabled = false
