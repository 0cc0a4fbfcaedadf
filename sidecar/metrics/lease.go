package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// Label names the lease metrics share with the others.
const (
	labelPolicy = "policy"
	labelRule   = "rule"
	labelResult = "result"
)

// Lease call results, the values of the "result" label of LeaseCallsTotal.
const (
	LeaseGranted = "granted"
	LeaseDenied  = "denied"
	LeaseError   = "error"
)

// Reasons unused lease tokens go back to the store, the values of the
// "reason" label of LeaseReturnedTokensTotal.
const (
	ReturnExpiry       = "expiry"
	ReturnRenewal      = "renewal"
	ReturnPolicyChange = "policy_change"
	ReturnShutdown     = "shutdown"
)

// Leases are the metrics of leased budgets and split counters. All their
// collectors are registered by NewMetrics.
type Leases struct {
	// HitsTotal counts rule decisions answered from a local lease,
	// without a store call, by policy and rule.
	HitsTotal *CounterVec
	// CallsTotal counts lease calls to the store by policy, rule and
	// result (granted, denied, error).
	CallsTotal *CounterVec
	// GrantedTokensTotal counts the tokens lease calls took from the
	// store, the asking requests' own costs included.
	GrantedTokensTotal *CounterVec
	// ReturnedTokensTotal counts unused lease tokens given back to the
	// store, by policy, rule and reason (expiry, renewal, policy_change,
	// shutdown).
	ReturnedTokensTotal *CounterVec
	// LostTokensTotal counts unused lease tokens that could not be given
	// back: the store was unavailable, or the window they counted in had
	// ended. It is the under-admission leases caused.
	LostTokensTotal *CounterVec
	// Keys is the number of keys with lease state in the engine.
	Keys prometheus.GaugeFunc
	// SplitCallsTotal counts store calls on the sub-counters of split
	// keys, by policy, rule and sub-counter index: their balance.
	SplitCallsTotal *CounterVec
	// SplitBorrowsTotal counts store calls that went to another
	// sub-counter because the one tried before had too little left.
	SplitBorrowsTotal *CounterVec

	keys func() float64
}

func newLeases() *Leases {
	l := &Leases{
		HitsTotal: NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "lease_hits_total",
			Help: "Rule decisions answered from a local lease, without a store call, by policy and rule.",
		}, []string{labelPolicy, labelRule}),
		CallsTotal: NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "lease_calls_total",
			Help: "Lease calls to the counter store by policy, rule and result (granted, denied, error).",
		}, []string{labelPolicy, labelRule, labelResult}),
		GrantedTokensTotal: NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "lease_granted_tokens_total",
			Help: "Tokens lease calls took from the counter store, the asking requests' own costs included, by policy and rule.",
		}, []string{labelPolicy, labelRule}),
		ReturnedTokensTotal: NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "lease_returned_tokens_total",
			Help: "Unused lease tokens given back to the counter store, by policy, rule and reason (expiry, renewal, policy_change, shutdown).",
		}, []string{labelPolicy, labelRule, "reason"}),
		LostTokensTotal: NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "lease_lost_tokens_total",
			Help: "Unused lease tokens that could not be given back (the store was unavailable, or their window had ended): the under-admission leases caused, by policy and rule.",
		}, []string{labelPolicy, labelRule}),
		SplitCallsTotal: NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "split_calls_total",
			Help: "Counter store calls on the sub-counters of split keys, by policy, rule and sub-counter: their balance.",
		}, []string{labelPolicy, labelRule, "sub"}),
		SplitBorrowsTotal: NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "split_borrows_total",
			Help: "Store calls on a split key that went to another sub-counter because the one tried before had too little left, by policy and rule.",
		}, []string{labelPolicy, labelRule}),
	}
	l.Keys = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Name: "lease_keys",
		Help: "Keys with lease state (a lease, or a local arrival rate being measured).",
	}, func() float64 {
		if l.keys == nil {
			return 0
		}
		return l.keys()
	})
	return l
}

func (l *Leases) collectors() []prometheus.Collector {
	return []prometheus.Collector{l.HitsTotal, l.CallsTotal, l.GrantedTokensTotal, l.ReturnedTokensTotal,
		l.LostTokensTotal, l.Keys, l.SplitCallsTotal, l.SplitBorrowsTotal}
}

// SetLeaseKeys installs the function Keys reads. It must be called before
// the metrics are scraped concurrently.
func (l *Leases) SetLeaseKeys(f func() float64) { l.keys = f }

// LeaseRule holds the pre-resolved lease counters of one rule.
type LeaseRule struct {
	Hits                      prometheus.Counter
	Granted, Denied, Errors   prometheus.Counter
	GrantedTokens, LostTokens prometheus.Counter
	Expired, Renewed, Changed prometheus.Counter // returned tokens by reason
	Shutdown                  prometheus.Counter // returned at shutdown
	Borrows                   prometheus.Counter
	split                     *CounterVec
	policy, rule              string
}

// ForLeaseRule resolves a rule's lease counters.
func (l *Leases) ForLeaseRule(policy, rule string) *LeaseRule {
	return &LeaseRule{
		Hits:          l.HitsTotal.WithLabelValues(policy, rule),
		Granted:       l.CallsTotal.WithLabelValues(policy, rule, LeaseGranted),
		Denied:        l.CallsTotal.WithLabelValues(policy, rule, LeaseDenied),
		Errors:        l.CallsTotal.WithLabelValues(policy, rule, LeaseError),
		GrantedTokens: l.GrantedTokensTotal.WithLabelValues(policy, rule),
		LostTokens:    l.LostTokensTotal.WithLabelValues(policy, rule),
		Expired:       l.ReturnedTokensTotal.WithLabelValues(policy, rule, ReturnExpiry),
		Renewed:       l.ReturnedTokensTotal.WithLabelValues(policy, rule, ReturnRenewal),
		Changed:       l.ReturnedTokensTotal.WithLabelValues(policy, rule, ReturnPolicyChange),
		Shutdown:      l.ReturnedTokensTotal.WithLabelValues(policy, rule, ReturnShutdown),
		Borrows:       l.SplitBorrowsTotal.WithLabelValues(policy, rule),
		split:         l.SplitCallsTotal,
		policy:        policy, rule: rule,
	}
}

// SplitCalls resolves the call counters of a split rule's k sub-counters.
func (r *LeaseRule) SplitCalls(k int) []prometheus.Counter {
	out := make([]prometheus.Counter, k)
	for i := range out {
		out[i] = r.split.WithLabelValues(r.policy, r.rule, strconv.Itoa(i))
	}
	return out
}

// Returned returns the counter of tokens returned for reason.
func (r *LeaseRule) Returned(reason string) prometheus.Counter {
	switch reason {
	case ReturnRenewal:
		return r.Renewed
	case ReturnPolicyChange:
		return r.Changed
	case ReturnShutdown:
		return r.Shutdown
	}
	return r.Expired
}

// forget deletes a rule's series by their exact labels, so that
// forgetting n rules costs O(n), as ForgetRule promises.
func (l *Leases) forget(policy, rule string) {
	for _, v := range []*CounterVec{l.HitsTotal, l.GrantedTokensTotal, l.LostTokensTotal, l.SplitBorrowsTotal} {
		v.DeleteLabelValues(policy, rule)
	}
	for _, result := range []string{LeaseGranted, LeaseDenied, LeaseError} {
		l.CallsTotal.DeleteLabelValues(policy, rule, result)
	}
	for _, reason := range []string{ReturnExpiry, ReturnRenewal, ReturnPolicyChange, ReturnShutdown} {
		l.ReturnedTokensTotal.DeleteLabelValues(policy, rule, reason)
	}
	for i := range limiter.MaxSplit {
		l.SplitCallsTotal.DeleteLabelValues(policy, rule, strconv.Itoa(i))
	}
}
