//go:build !race

package runner

// raceEnabled is set when the tests run under the race detector, which
// slows compiling and deciding thousands of rules about tenfold.
const raceEnabled = false
