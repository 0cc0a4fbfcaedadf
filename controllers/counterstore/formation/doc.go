// Package formation forms and heals a Redis Cluster over the Redis
// protocol, given only the addresses of the nodes that should make it up.
// It is the part of the CounterStore controller that talks to Redis; it
// knows nothing of Kubernetes.
//
// # Passes
//
// The work is level-based and done in passes. A pass observes every member
// (Session.Observe: CLUSTER MYID, CLUSTER NODES, CLUSTER INFO and DBSIZE in
// one round trip per node), plans (Plan, a pure function of the snapshot
// and the Spec), and runs the plan's actions (Session.Execute). The caller
// repeats passes, with a short pause for gossip, until Pass.Converged;
// Session.Reconcile is one pass. A pass acts on the first step that has
// work, in this order, and leaves the rest to later passes, which see the
// result first:
//
//  1. Meet: fresh nodes get distinct config epochs, then the anchor (the
//     node most others know) MEETs every member it does not know, and
//     every member re-MEETs a peer it knows at an old address, so a node
//     that came back with a new IP is updated at once.
//  2. Join: wait until every member sees every other, connected.
//  3. FixSlots: a migration left half done (a slot MIGRATING or IMPORTING)
//     is finished toward the importing side, or closed with SETSLOT STABLE
//     when the other side is gone.
//  4. Forget: once every member is reachable, every member's ID is known,
//     and a node the cluster remembers that is no member's is a ghost: a
//     ghost master that serves slots is failed over to its replica
//     (CLUSTER FAILOVER FORCE: a Pod replaced at the same address makes
//     its peers drop the old node's address, and Redis never fails such a
//     node over by itself); a ghost master without a replica, or any other
//     ghost, is forgotten on every node (CLUSTER FORGET), which leaves its
//     slots unassigned.
//  5. Failover: a master the operator cannot reach is left to Redis's own
//     failover; when half the masters or more are down, so Redis cannot
//     elect anyone, its replica takes over (CLUSTER FAILOVER TAKEOVER).
//  6. Assign: a leaving master hands its slots to a replica that stays
//     (manual CLUSTER FAILOVER, no data moves); unassigned slots go to the
//     designated masters (ADDSLOTSRANGE), one contiguous range each on a
//     fresh cluster; replicas are placed (REPLICATE) on a master on
//     another host where possible.
//  7. Rebalance: when every view agrees on the slot owners, slots move,
//     keys included, until they are split evenly over the designated
//     masters (SETSLOT IMPORTING and MIGRATING, GETKEYSINSLOT, MIGRATE ...
//     KEYS, SETSLOT NODE).
//
// # Safety
//
// The formation never runs CLUSTER RESET and never flushes a node. It only
// makes a node a replica (which discards its data) when the node serves no
// slot and holds no key. A slot changes owner only after its source holds
// no key of it (Redis refuses SETSLOT NODE otherwise), so a migration loses
// nothing, and an interrupted one is finished by the next pass. A node
// that serves slots of another cluster is never met. Nodes are forgotten
// only when every member has answered, so a member that is merely down is
// never mistaken for a ghost. Running a pass on a healthy, formed cluster
// does nothing.
//
// # Pure planning
//
// The layout decisions are pure functions with unit tests of their own:
// SlotTargets and AssignFree (the even slot layout), PlanMigrations (the
// moves that reach it, and drain masters that leave) and PlaceReplicas (a
// maximum matching of replicas to masters on other hosts). Plan composes
// them over a Snapshot. Health and Assess turn a snapshot into what the
// CounterStore status reports.
//
// # Concurrency
//
// A Session is safe for concurrent use, but passes on one cluster must not
// run concurrently: the store controller runs at most one reconcile per
// store at a time.
package formation
