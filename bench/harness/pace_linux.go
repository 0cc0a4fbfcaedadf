//go:build linux

package harness

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Pacer sleeps until an arrival's scheduled instant. time.Sleep cannot do
// this on Linux: when the Go scheduler has nothing else to run it blocks in
// epoll_wait, whose timeout is in whole milliseconds, so arrivals due every
// 250µs would leave in bursts once a millisecond. The pacer arms a timerfd
// instead and reads it through the runtime's poller, which wakes on the
// timer's expiry to within microseconds.
type Pacer struct {
	fd int
	f  *os.File
}

// NewPacer returns a Pacer; Close releases it.
func NewPacer() (*Pacer, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	return &Pacer{fd: fd, f: os.NewFile(uintptr(fd), "timerfd")}, nil
}

// Sleep returns after d; at once when d is not positive. A Pacer is for
// one goroutine at a time.
func (p *Pacer) Sleep(d time.Duration) {
	if d <= 0 {
		return
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	if err := unix.TimerfdSettime(p.fd, 0, &spec, nil); err != nil {
		time.Sleep(d)
		return
	}
	var buf [8]byte
	if _, err := p.f.Read(buf[:]); err != nil {
		time.Sleep(d)
	}
}

// Close releases the Pacer.
func (p *Pacer) Close() { _ = p.f.Close() }
