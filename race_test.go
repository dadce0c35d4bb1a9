//go:build race

package monolock

// raceEnabled: the race detector is on, and stacks are larger under it.
const raceEnabled = true
