//go:build race

package engine

// raceEnabled is set when the tests run under the race detector, which
// slows the long replays about twentyfold.
const raceEnabled = true
