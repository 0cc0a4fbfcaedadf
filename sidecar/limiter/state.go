package limiter

// State is the fixed-size state of one key for TokenBucket, GCRA,
// FixedWindow and SlidingWindow, in the layout of ALGORITHMS.md:
//
//	TokenBucket    A = L (level, units)        B = T (last tick)
//	GCRA           A = A (TAT, whole ticks)    B = F (TAT fraction, units)
//	FixedWindow    A = W (window start, µs)    B = N (count)
//	SlidingWindow  A = W (window start, µs)    B = cur             C = prev
//
// The accessors name the fields for each algorithm; a store that only
// keeps a State copies A, B and C as they are. SlidingLog keeps a Log
// instead, and has no State.
//
// The zero State is absent, which every algorithm reads as a full key. A
// State is written with the Params of the limit in force; a store keeps
// those Params (or their identity) beside it so that a later limit edit can
// convert it.
type State struct {
	A, B, C int64
	// Set is false for an absent state.
	Set bool
}

// Level is a TokenBucket's level L: what it holds, in units of
// Params.TokenUnits per token.
func (s State) Level() int64 { return s.A }

// LastTick is a TokenBucket's T: the tick (of Params.TickMicros) it was
// last refilled at.
func (s State) LastTick() int64 { return s.B }

// TAT is the whole ticks of a GCRA's theoretical arrival time, A + F/U
// ticks: the instant the key is back to full.
func (s State) TAT() int64 { return s.A }

// TATFraction is F, the part of a GCRA's theoretical arrival time below a
// tick, in units (0 <= F < Params.TickUnits).
func (s State) TATFraction() int64 { return s.B }

// WindowStart is W for FixedWindow and SlidingWindow: the start of the
// current window, µs since the epoch.
func (s State) WindowStart() int64 { return s.A }

// Count is what the current window has admitted: N for FixedWindow, cur
// for SlidingWindow.
func (s State) Count() int64 { return s.B }

// PrevCount is a SlidingWindow's prev: what the window before the current
// one admitted.
func (s State) PrevCount() int64 { return s.C }

func (s *State) setTokenBucket(level, lastTick int64) { s.A, s.B = level, lastTick }

func (s *State) setGCRA(tat, fraction int64) { s.A, s.B = tat, fraction }

func (s *State) setWindow(start, count, prev int64) { s.A, s.B, s.C = start, count, prev }
