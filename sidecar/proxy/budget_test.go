package proxy

import (
	"testing"
	"time"
)

// TestBudgetEvictsTheOldestIdle: at the cap, a new connection takes the
// place of the connection that has waited longest, once it has waited
// IdleEvictAfter; one that has started a request, or taken back by
// Active, is passed over.
func TestBudgetEvictsTheOldestIdle(t *testing.T) {
	now := time.Unix(1000, 0)
	b := NewBudget(BudgetOptions{MaxConnections: 3})
	b.now = func() time.Time { return now }
	var closed []string
	conn := func(name string, closes bool) (*IdleConn, func() bool) {
		return &IdleConn{}, func() bool {
			if closes {
				closed = append(closed, name)
			}
			return closes
		}
	}
	for range 3 {
		if !b.AcquireConn() {
			t.Fatal("refused below the cap")
		}
	}
	a, closeA := conn("a", true)
	started, closeStarted := conn("started", false)
	c, closeC := conn("c", true)
	b.Idle(started, 0, closeStarted) // the oldest, but it has begun a request
	now = now.Add(100 * time.Millisecond)
	b.Idle(a, 0, closeA)
	now = now.Add(100 * time.Millisecond)
	b.Idle(c, 0, closeC)

	now = now.Add(IdleEvictAfter - 150*time.Millisecond) // a has waited 950ms
	if b.AcquireConn() {
		t.Fatalf("a connection was admitted at the cap before any had waited %v", IdleEvictAfter)
	}
	now = now.Add(50 * time.Millisecond)
	if !b.AcquireConn() {
		t.Fatal("refused at the cap with a connection idle for IdleEvictAfter")
	}
	if len(closed) != 1 || closed[0] != "a" {
		t.Errorf("closed %v, want [a]: the oldest idle one that had not begun a request", closed)
	}
	b.Active(c) // c starts a request
	now = now.Add(time.Hour)
	if b.AcquireConn() {
		t.Errorf("admitted at the cap with no idle connection left (closed %v)", closed)
	}
	if b.idle.head != nil {
		t.Errorf("the idle list is not empty")
	}
}
