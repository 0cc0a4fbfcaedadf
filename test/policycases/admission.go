package policycases

// The bad input of concurrency rules, priorities and the load shedder,
// which the schema's CEL rules and ValidateSemantics both refuse.
func init() {
	Schema = append(Schema, admissionSchema...)
}

var admissionSchema = []Bad{
	{Name: "limit and concurrency in one rule", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}
    concurrency: {max: 5}`,
		Want: []string{"spec.rules[0]", "set limit (a rate) or concurrency (requests in flight), not both"}},
	{Name: "a rule with neither limit, concurrency nor priority", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]`,
		Want: []string{"spec.rules[0]", "a rule needs a limit, a concurrency cap, or a priority"}},
	{Name: "limit.split on a concurrency rule", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s, split: 2}
    concurrency: {max: 5}`,
		Want: []string{limitSplit, "does not apply to a concurrency rule"}},
	{Name: "concurrency max 0", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    concurrency: {max: 0}`,
		Want: []string{"spec.rules[0].concurrency.max", atLeastOne}},
	{Name: "concurrency max above 100000", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    concurrency: {max: 100001}`,
		Want: []string{"spec.rules[0].concurrency.max", "should be less than or equal to 100000"}},
	{Name: "a lease TTL above 10m", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    concurrency: {max: 5, leaseTTL: 1h}`,
		Want: []string{"spec.rules[0].concurrency.leaseTTL", "must be between 1s and 10m"}},
	{Name: "a cost on a concurrency rule", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    concurrency: {max: 5}
    cost: {default: 2}`,
		Want: []string{"spec.rules[0].cost", "cost applies to rate limits only"}},
	{Name: "an unknown priority", Doc: `
  podSelector: {}
  rules:
  - name: r
    priority: Urgent`,
		Want: []string{"spec.rules[0].priority", "Unsupported value: \"Urgent\""}},
	{Name: "an unknown shedding mode", Doc: `
  podSelector: {}
  loadShedding: {mode: Loud}
  rules:` + okRule,
		Want: []string{"spec.loadShedding.mode", "Unsupported value: \"Loud\""}},
	{Name: "reserves above 90 percent together", Doc: `
  podSelector: {}
  loadShedding: {reserved: {critical: 85}}
  rules:` + okRule,
		Want: []string{"spec.loadShedding.reserved", "critical and default together must reserve at most 90 percent"}},
	{Name: "a reserve above 90", Doc: `
  podSelector: {}
  loadShedding: {reserved: {critical: 95, default: 0}}
  rules:` + okRule,
		Want: []string{"spec.loadShedding.reserved.critical", "should be less than or equal to 90"}},
	{Name: "shedding minLimit above maxLimit", Doc: `
  podSelector: {}
  loadShedding: {minLimit: 50, maxLimit: 10}
  rules:` + okRule,
		Want: []string{"spec.loadShedding.minLimit", "minLimit must not exceed maxLimit"}},
}
