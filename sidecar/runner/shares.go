package runner

import (
	"fmt"
	"strings"

	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
)

// placeShares returns why this sidecar refuses to enforce set, or nil.
//
// While the store is unreachable, each replica of a policy admits on its
// own share of the policy's limit, found from its place among the replicas
// (ruleset.ReplicaShare), and the shares hold the limit together only when
// no two replicas stand in one place. So a sidecar refuses a set that has
// a policy with more than one replica and a rule that fails open on such a
// share when
//   - it has no pod name (--pod-name, or $POD_NAME): every replica
//     without one stands in the same place, so a fleet of them admits the
//     limit once per replica;
//   - it runs standalone (--policy-file) and the policy's replicaPods does
//     not list its pod: its place then comes from a hash of its name, and
//     ten names in ten places almost surely collide, while nothing will
//     ever list it in a file written by hand. In Kubernetes mode
//     floodgate-manager lists a pod that just became ready in its next
//     revision, within seconds, so the hashed place is only a stopgap
//     there and is kept.
//
// remote says whether the counter store is a remote one: the memory store
// is never unreachable, so a sidecar on it never falls back to a share.
func (c *Config) placeShares(set *ruleset.Set, remote bool) error {
	if !remote {
		return nil
	}
	var msgs []string
	for _, s := range set.Shares {
		switch {
		case s.Placement == ruleset.PlacedUnnamed:
			msgs = append(msgs, fmt.Sprintf("policy %q: replicas is %d but this sidecar has no pod identity (--pod-name): "+
				"its fail-open share could collide with every other replica's; set --pod-name, or replicas to 1", s.ID(), s.Share.Of))
		case s.Placement == ruleset.PlacedByName && !c.Kubernetes:
			msgs = append(msgs, fmt.Sprintf("policy %q: replicas is %d but this sidecar's pod %q (--pod-name) is not in its replicaPods: "+
				"its fail-open share, placed by a hash of the name, could collide with another replica's; "+
				"list every replica in pods and replicaPods, or set replicas to 1", s.ID(), s.Share.Of, c.PodName))
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return &unplacedError{msg: strings.Join(msgs, "\n")}
}

// unplacedError is a config refused because this sidecar cannot take a
// fail-open share of its own in it (see placeShares).
type unplacedError struct{ msg string }

// Error implements error.
func (e *unplacedError) Error() string { return e.msg }
