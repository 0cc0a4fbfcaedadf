package config

import "time"

// The usage report: what a sidecar's rules decided since it started,
// served as JSON at UsagePath on its admin port. floodgate-manager reads it
// at a low rate, off the decision path, to report each rule's recent
// denials (and a Shadow rule's would-be denials) in the policies' status.

// UsagePath is the admin path of the usage report.
const UsagePath = "/usage"

// Usage is the usage report.
type Usage struct {
	// Started is when the sidecar process started: the counters count
	// from then, so a later Started means they restarted from zero.
	Started time.Time `json:"started"`
	// Revision is the config revision in force.
	Revision string `json:"revision,omitempty"`
	// Rules are the counters of every rule the sidecar has decided,
	// including rules removed since, until a config change forgets them.
	Rules []RuleUsage `json:"rules"`
}

// RuleUsage are one rule's counters since the sidecar started. Policy is
// the name a policy has in the config: a RateLimitPolicy's name, or
// "cluster.<name>" for a ClusterRateLimitPolicy.
type RuleUsage struct {
	Policy string `json:"policy"`
	Rule   string `json:"rule"`
	// Allowed, Denied, ShadowDenied and Unavailable count decisions by
	// result, as floodgate_sidecar_decisions_total does.
	Allowed      uint64 `json:"allowed"`
	Denied       uint64 `json:"denied"`
	ShadowDenied uint64 `json:"shadowDenied"`
	Unavailable  uint64 `json:"unavailable"`
	// Exempt counts requests the rule left alone as exempt.
	Exempt uint64 `json:"exempt"`
}
