//go:build !race

package monolock

const raceEnabled = false
