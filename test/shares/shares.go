// Package shares judges what fail-open replicas admitted against the
// tokens the limiter deals them (sidecar/limiter/ALGORITHMS.md, section
// 8), from the outside: each request's answer bounds when it was decided,
// after it was sent and before it came back, so a busy machine that holds
// the clients or answers late widens the bounds instead of failing a
// check that was met.
package shares

import (
	"net/http"
	"time"
)

// Answer is one request's outcome: sent before it was decided, done once
// it was answered; Code is 0 when the request failed.
type Answer struct {
	Replica    int
	Sent, Done time.Time
	Code       int
}

// Share is replica Index's share, among Of, of a fail-open limit of
// Requests per Period whose capacity is Requests: token j arrives
// j*Period/Requests after the epoch, belongs to replica j mod Of alone,
// and may be spent while it is among the newest Requests tokens; a key
// the replica has not seen starts empty. The shares of every index
// together are one bucket of the limit: Share{Of: 1} is the fleet's.
type Share struct {
	Index, Of int
	Requests  int64
	Period    time.Duration
}

// newest is the index of the newest token at t. Token arrivals fall on
// whole microseconds for the limits tests use, so the truncation to
// microseconds never moves an arrival across t.
func (s Share) newest(t time.Time) int64 {
	return t.UnixMicro() * s.Requests / s.Period.Microseconds()
}

// owned counts the replica's tokens with an index of at most j (j is far
// above Index: a token index since the epoch).
func (s Share) owned(j int64) int64 {
	return (j-int64(s.Index))/int64(s.Of) + 1
}

// Tokens counts the replica's tokens that arrive in (from, to].
func (s Share) Tokens(from, to time.Time) int {
	return int(s.owned(s.newest(to)) - s.owned(s.newest(from)))
}

// RefusedBetween counts the replica's tokens that it certainly admitted
// requests on, given its answers in the order they were sent: a refusal
// (429) means it held no usable token, so every token of its own that
// arrived between two refusals close enough that none of those tokens
// could expire in between (the capacity's span less one token) was spent
// on a request admitted between them.
func (s Share) RefusedBetween(answers []Answer) int {
	var refused []Answer
	for _, a := range answers {
		if a.Code == http.StatusTooManyRequests {
			refused = append(refused, a)
		}
	}
	within := time.Duration(s.Requests-1) * s.Period / time.Duration(s.Requests)
	n := 0
	for i := 0; i < len(refused); {
		a, j := refused[i], -1
		for k := i + 1; k < len(refused) && refused[k].Done.Sub(a.Sent) <= within; k++ {
			if refused[k].Sent.After(a.Done) {
				j = k
			}
		}
		if j < 0 {
			i++
			continue
		}
		n += s.Tokens(a.Done, refused[j].Sent)
		i = j
	}
	return n
}
