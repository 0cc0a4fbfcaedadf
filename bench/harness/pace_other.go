//go:build !linux

package harness

import "time"

// Pacer sleeps until an arrival's scheduled instant (with time.Sleep's
// precision on this platform).
type Pacer struct{}

// NewPacer returns a Pacer.
func NewPacer() (*Pacer, error) { return &Pacer{}, nil }

// Sleep returns after d.
func (p *Pacer) Sleep(d time.Duration) {
	if d > 0 {
		time.Sleep(d)
	}
}

// Close releases the Pacer.
func (p *Pacer) Close() {}
