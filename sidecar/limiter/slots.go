package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Bounds on a SlotRequest.
const (
	// MaxSlots bounds SlotRequest.Max: a store keeps one entry per lease.
	MaxSlots = 100_000
	// MinSlotTTL and MaxSlotTTL bound SlotRequest.TTL.
	MinSlotTTL = time.Millisecond
	MaxSlotTTL = time.Hour
)

// SlotRequest is one operation on a key's slots: the requests of the key in
// flight, each holding a lease that expires unless it is renewed.
type SlotRequest struct {
	// Key is the counter identity, as for Request.Key.
	Key string
	// Lease identifies the request's slot among the key's leases. It is
	// chosen by the caller, unique among the key's live leases, and never
	// 0.
	Lease uint64
	// Max is the most leases the key may hold at once.
	Max int64
	// TTL is how long the lease lives from the store's now unless it is
	// renewed or released.
	TTL time.Duration
}

// Check reports what is wrong with r, or nil.
func (r SlotRequest) Check() error {
	var errs []error
	if r.Key == "" {
		errs = append(errs, errors.New("key: must not be empty"))
	}
	if r.Lease == 0 || r.Lease > 1<<63-1 {
		errs = append(errs, fmt.Errorf("lease: must be between 1 and 2^63-1, got %d", r.Lease))
	}
	if r.Max < 1 || r.Max > MaxSlots {
		errs = append(errs, fmt.Errorf("max: must be between 1 and %d, got %d", MaxSlots, r.Max))
	}
	if r.TTL < MinSlotTTL || r.TTL > MaxSlotTTL || r.TTL%time.Microsecond != 0 {
		errs = append(errs, fmt.Errorf("ttl: must be a whole number of microseconds between %v and %v, got %v", MinSlotTTL, MaxSlotTTL, r.TTL))
	}
	return errors.Join(errs...)
}

// SlotDecision is the answer to an Acquire.
type SlotDecision struct {
	// Acquired reports that the request holds a slot (its lease).
	Acquired bool
	// InFlight is the number of live leases on the key after the call.
	InFlight int64
	// Max is the key's cap (SlotRequest.Max).
	Max int64
}

// String formats d compactly, for logs and test failures.
func (d SlotDecision) String() string {
	verdict := "deny"
	if d.Acquired {
		verdict = "acquired"
	}
	return fmt.Sprintf("{%s in-flight=%d max=%d}", verdict, d.InFlight, d.Max)
}

// SlotStore keeps the leases of keys' requests in flight, at the instant
// its own clock gives. Every operation is atomic on its key. A lease that
// is neither renewed nor released expires TTL after it was last taken or
// renewed, and its slot comes back: the slots of a caller that crashed are
// never lost for longer. Implementations are safe for concurrent use.
type SlotStore interface {
	// Acquire takes a slot for req.Lease when the key holds fewer than
	// req.Max live leases, and reports the leases in flight. Acquiring a
	// lease the key already holds renews it.
	Acquire(ctx context.Context, req SlotRequest) (d SlotDecision, shard string, err error)
	// Renew extends req.Lease to TTL from now. When the lease has expired
	// meanwhile it is taken again if the key has room; held reports
	// whether the caller holds it after the call.
	Renew(ctx context.Context, req SlotRequest) (held bool, shard string, err error)
	// Release gives req.Lease back; releasing a lease the key does not
	// hold does nothing. Only Key and Lease are read.
	Release(ctx context.Context, req SlotRequest) (shard string, err error)
}

// Slots are the leases of one key: the reference semantics of a
// SlotStore, which the in-memory store uses as they are and the Redis
// store's scripts mirror. A lease whose expiry is at or before now is gone.
// The zero value holds no lease. Slots are not safe for concurrent use.
type Slots struct {
	leases map[uint64]int64 // lease -> expiry, µs since the epoch
	// next is at or before the earliest expiry: no lease has expired
	// before it, so pruning can wait until then.
	next int64
}

// prune drops the leases that have expired at now (µs).
func (s *Slots) prune(now int64) {
	if len(s.leases) == 0 || now < s.next {
		return
	}
	next := int64(1<<63 - 1)
	for id, exp := range s.leases {
		if exp <= now {
			delete(s.leases, id)
		} else if exp < next {
			next = exp
		}
	}
	s.next = next
}

func (s *Slots) put(id uint64, exp int64) {
	if s.leases == nil {
		s.leases = map[uint64]int64{}
	}
	if len(s.leases) == 0 || exp < s.next {
		s.next = exp
	}
	s.leases[id] = exp
}

// Acquire takes a slot for lease at now (µs) if the key has room under max,
// with the lease expiring ttl later.
func (s *Slots) Acquire(now int64, lease uint64, maxN int64, ttl time.Duration) SlotDecision {
	s.prune(now)
	_, held := s.leases[lease]
	if !held && int64(len(s.leases)) >= maxN {
		return SlotDecision{InFlight: int64(len(s.leases)), Max: maxN}
	}
	s.put(lease, now+ttl.Microseconds())
	return SlotDecision{Acquired: true, InFlight: int64(len(s.leases)), Max: maxN}
}

// Renew extends lease to ttl after now (µs), or takes it again if it has
// expired and the key has room under max. It reports whether the lease is
// held.
func (s *Slots) Renew(now int64, lease uint64, maxN int64, ttl time.Duration) bool {
	return s.Acquire(now, lease, maxN, ttl).Acquired
}

// Release drops lease.
func (s *Slots) Release(lease uint64) { delete(s.leases, lease) }

// InFlight returns the number of leases live at now (µs).
func (s *Slots) InFlight(now int64) int64 {
	s.prune(now)
	return int64(len(s.leases))
}

// Empty reports whether no lease is live at now (µs); an empty Slots may
// be dropped.
func (s *Slots) Empty(now int64) bool { return s.InFlight(now) == 0 }
