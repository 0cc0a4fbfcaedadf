package shares

import (
	"net/http"
	"testing"
	"time"
)

// epoch is a whole second since the Unix epoch: token 0 of every limit
// here, at 10 per second, is due at it.
var epoch = time.Unix(2_000_000_000, 0)

func at(ms int) time.Time { return epoch.Add(time.Duration(ms) * time.Millisecond) }

func TestTokensAreDealtInTurn(t *testing.T) {
	t.Parallel()
	// 10 per second: a token every 100 ms, replica i of 3 owning every
	// third.
	fleet := Share{Of: 1, Requests: 10, Period: time.Second}
	if got := fleet.Tokens(at(0), at(1000)); got != 10 {
		t.Errorf("the fleet's tokens in a second: %d, want 10", got)
	}
	if got := fleet.Tokens(at(0), at(99)); got != 0 {
		t.Errorf("the fleet's tokens in (0, 99ms]: %d, want 0", got)
	}
	if got := fleet.Tokens(at(0), at(100)); got != 1 {
		t.Errorf("the fleet's tokens in (0, 100ms]: %d, want 1 (the one due at 100ms)", got)
	}
	sum := 0
	for i := range 3 {
		sum += Share{Index: i, Of: 3, Requests: 10, Period: time.Second}.Tokens(at(0), at(3000))
	}
	if sum != 30 {
		t.Errorf("the three shares' tokens in 3 s: %d, want the fleet's 30", sum)
	}
}

func TestRefusedBetweenCountsOnlyCertainTokens(t *testing.T) {
	t.Parallel()
	s := Share{Of: 1, Requests: 10, Period: time.Second}
	refused := func(sent, done int) Answer {
		return Answer{Sent: at(sent), Done: at(done), Code: http.StatusTooManyRequests}
	}
	// Refusals answered by 50 ms and sent again at 450 ms: the tokens due
	// at 100..400 ms came between them and were spent.
	if got := s.RefusedBetween([]Answer{refused(40, 50), {Sent: at(200), Done: at(210), Code: 200}, refused(450, 460)}); got != 4 {
		t.Errorf("between two refusals: %d, want 4", got)
	}
	// Refusals further apart than the capacity's span: tokens may have
	// expired unasked, nothing is certain.
	if got := s.RefusedBetween([]Answer{refused(0, 10), refused(2000, 2010)}); got != 0 {
		t.Errorf("refusals 2 s apart: %d, want 0", got)
	}
	// Overlapping refusals say nothing of the time between them.
	if got := s.RefusedBetween([]Answer{refused(0, 500), refused(100, 600)}); got != 0 {
		t.Errorf("overlapping refusals: %d, want 0", got)
	}
}
