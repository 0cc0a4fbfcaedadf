package policycases

// The bad input of onExceed: Delay, which the schema's CEL rules and
// ValidateSemantics both refuse, each naming the field.
func init() {
	Schema = append(Schema, delaySchema...)
	ClusterSchema = append(ClusterSchema, delayClusterSchema...)
}

// delayRule is a policy of one rule whose limit is 100 per second and
// the fields in limit, and whose other fields are the lines in rest.
func delayRule(limit string, rest ...string) string {
	doc := `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 100, per: 1s, ` + limit + `}`
	for _, line := range rest {
		doc += "\n    " + line
	}
	return doc
}

var delaySchema = []Bad{
	{Name: "an unknown onExceed", Doc: delayRule("onExceed: Queue"),
		Want: []string{"spec.rules[0].limit.onExceed", unsupported}},
	{Name: "maxDelay without onExceed: Delay", Doc: delayRule("maxDelay: 1s"),
		Want: []string{"spec.rules[0].limit.maxDelay", "maxDelay applies only with onExceed: Delay"}},
	{Name: "delayAfter with onExceed: Deny", Doc: delayRule("onExceed: Deny, delayAfter: 5"),
		Want: []string{"spec.rules[0].limit.delayAfter", "delayAfter applies only with onExceed: Delay"}},
	{Name: "onExceed: Delay without maxDelay", Doc: delayRule("onExceed: Delay"),
		Want: []string{"spec.rules[0].limit.maxDelay", "maxDelay is required with onExceed: Delay"}},
	{Name: "maxDelay above 1m", Doc: delayRule("onExceed: Delay, maxDelay: 2m"),
		Want: []string{"spec.rules[0].limit.maxDelay", "must be between 1ms and 1m"}},
	{Name: "maxDelay below 1ms", Doc: delayRule("onExceed: Delay, maxDelay: 500us"),
		Want: []string{"spec.rules[0].limit.maxDelay", "must be between 1ms and 1m"}},
	{Name: "delayAfter 0", Doc: delayRule("onExceed: Delay, maxDelay: 1s, delayAfter: 0"),
		// Go reads an explicit 0 as unset: 1.
		Want: []string{"spec.rules[0].limit.delayAfter", atLeastOne}, SchemaOnly: true},
	{Name: "burst with onExceed: Delay", Doc: delayRule("onExceed: Delay, maxDelay: 1s, burst: 20"),
		Want: []string{"spec.rules[0].limit.burst", "delayAfter sets how many requests of a burst pass at once"}},
	{Name: "a window algorithm with onExceed: Delay", Doc: delayRule("onExceed: Delay, maxDelay: 1s, algorithm: SlidingWindow"),
		Want: []string{"spec.rules[0].limit.algorithm", "a Delay rule is metered with GCRA"}},
	{Name: "split with onExceed: Delay", Doc: delayRule("onExceed: Delay, maxDelay: 1s, split: 2"),
		Want: []string{limitSplit, "a Delay rule never splits"}},
	{Name: "lease Auto with onExceed: Delay", Doc: delayRule("onExceed: Delay, maxDelay: 1s, lease: Auto"),
		Want: []string{"spec.rules[0].limit.lease", "a Delay rule never leases"}},
	{Name: "a cost above delayAfter", Doc: delayRule("onExceed: Delay, maxDelay: 1s, delayAfter: 2", "cost: {default: 3}"),
		Want: []string{"spec.rules[0].cost.default", "limit.delayAfter, or 1, under onExceed: Delay"}},
	{Name: "onExceed: Delay in Shadow mode", Doc: delayRule("onExceed: Delay, maxDelay: 1s", "mode: Shadow"),
		Want: []string{"spec.rules[0].mode", "a Shadow rule never holds a request"}},
	{Name: "onExceed: Delay with a targetRef", Doc: `
  targetRef: {group: gateway.networking.k8s.io, kind: HTTPRoute, name: api}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 100, per: 1s, onExceed: Delay, maxDelay: 1s}`,
		Want: []string{"spec.targetRef", "the central rate-limit service answers the gateway allow or deny and cannot hold a request"}},
}

var delayClusterSchema = []Bad{
	{Name: "a ClusterRateLimitPolicy Delay rule in Shadow mode", Doc: `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: ClusterRateLimitPolicy
metadata: {name: bad-delay}
spec:
  namespaceSelector: {}
  podSelector: {}
  defaults:
    rules:
    - name: r
      key: [{clientIP: {}}]
      limit: {requests: 100, per: 1s, onExceed: Delay, maxDelay: 1s}
      mode: Shadow`,
		Want: []string{"spec.defaults.rules[0].mode", "a Shadow rule never holds a request"}},
}
