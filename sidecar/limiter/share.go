package limiter

import (
	"fmt"
	"math/bits"
)

// Shared limits (see Share and ALGORITHMS.md, section 8).
//
// Token j of a limit of R requests per P µs arrives at ceil(j*P/R) µs
// since the epoch, so the newest token at now is m = floor(now*R/P). A
// token is usable while it is among the newest C (the limit's capacity):
// j > m - C. Replica i of Of owns the tokens j with j mod Of = i. Its state
// for a key is one number, A = N: the lowest token index it may still
// spend; the tokens below N are spent, or were there before the replica
// first saw the key (which sets N = m+1: an empty bucket).

// sameShareScale reports whether a shared state written under sp reads the
// same under p: token indexes count the same tokens.
func (p *Params) sameShareScale(sp *Params) bool {
	return sp == p || (sp.Limit.Shared() && sp.Limit.Requests == p.Limit.Requests && sp.PeriodMicros == p.PeriodMicros)
}

// tokenAt returns m = floor(nowUs*R/P), the newest token at nowUs.
func (p *Params) tokenAt(nowUs int64) int64 {
	hi, lo := bits.Mul64(uint64(nowUs), uint64(p.Limit.Requests))
	// hi < P: nowUs < 2^53 and R <= 2^30, so the product is below 2^83,
	// and P >= 10^6 > 2^19.
	q, _ := bits.Div64(hi, lo, uint64(p.PeriodMicros))
	return int64(q)
}

// arrival returns ceil(j*P/R), the instant token j arrives, in µs since
// the epoch. j is at most the newest token plus the tokens a replica may
// wait for (Of + Capacity), so the result stays within MaxFillTime and
// MaxShareReplicas periods of now.
func (p *Params) arrival(j int64) int64 {
	if j <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(j), uint64(p.PeriodMicros))
	r := uint64(p.Limit.Requests)
	if hi >= r {
		return maxNowMicros
	}
	q, rem := bits.Div64(hi, lo, r)
	if rem != 0 {
		q++
	}
	return int64(q)
}

// TakeShare is Take on replica sh.Index's share of p's limit among sh.Of
// replicas, whatever p's own Share says: a store that keeps many replica
// counts of one limit interns the limit once (see Share) and passes the
// share with each call. sh.Of must be at least 2 and sh.Index within it.
func (p *Params) TakeShare(s *State, sp *Params, sh Share, nowUs, n int64) (d Decision, write bool, err error) {
	if err := checkTake(nowUs, n); err != nil {
		return Decision{}, false, err
	}
	if sh.Of < 2 || sh.Index < 0 || sh.Index >= sh.Of || sh.Of > MaxShareReplicas {
		return Decision{}, false, fmt.Errorf("take share %d of %d: not a replica's share", sh.Index, sh.Of)
	}
	st := *s
	if st.Set && sp != nil && !p.sameShareScale(sp) {
		st = State{}
	}
	d, write = p.share(&st, sh, nowUs, n)
	if write {
		st.Set = true
		*s = st
	}
	return d, write, nil
}

// share decides a request of cost n on replica sh.Index's share; a peek
// (n = 0) is decided as a cost of 1 and spends nothing. It writes the
// state when it admits a non-zero cost and when the key is new, a peek's
// key too, so that a new key starts empty and its tokens arrive from its
// first sight: a key seen only by peeks (a gateway that checks before it
// charges) would otherwise be new, and empty, at every peek.
func (p *Params) share(s *State, sh Share, now, n int64) (Decision, bool) {
	of, idx := int64(sh.Of), int64(sh.Index)
	c := p.Capacity
	m := p.tokenAt(now)
	fresh := !s.Set
	next := s.A
	if fresh {
		next = m + 1
	}
	lo := max(next, m-c+1)
	first := lo + modPos(idx-lo, of) // the replica's lowest usable token
	owned := int64(0)                // usable tokens the replica holds now
	if first <= m {
		owned = (m-first)/of + 1
	}
	// Full again once the newest C tokens are all unspent: when token
	// next+C-1 has arrived.
	resetUs := max(0, p.arrival(next+c-1)-now)
	d := Decision{Limit: ceilDiv(c, of), Remaining: owned}
	n1 := max(n, 1)           // a peek decides as a cost of 1
	last := first + (n1-1)*of // the n-th token the request needs
	switch {
	case last <= m && n == 0:
		d.Allowed = true
	case last <= m:
		next = last + 1
		s.A = next
		d.Allowed, d.Remaining = true, owned-n
		d.ResetAfter = micros(max(0, p.arrival(next+c-1)-now))
		return d, true
	case (n1-1)*of >= c:
		// n of the replica's tokens are never usable at once: the share
		// cannot admit this cost. Report a period's wait.
		d.RetryAfter = micros(p.PeriodMicros)
	default:
		d.RetryAfter = micros(max(1, p.arrival(last)-now))
	}
	d.ResetAfter = micros(resetUs)
	s.A = next
	return d, fresh
}

// modPos returns a mod b in [0, b) for b > 0.
func modPos(a, b int64) int64 {
	r := a % b
	if r < 0 {
		r += b
	}
	return r
}
