package ruleset

// scratchSlack is the room a Scratch keeps beyond twice the rules of the
// set in force, so that a small set does not make it drop its buffers
// over a few hits.
const scratchSlack = 16

// Fit drops sc's buffers when they are more than twice the size a request
// on s can fill (s's rules, plus scratchSlack), as after a config change
// that left fewer rules, and reports whether it did. A Scratch kept for a
// connection otherwise stays at the size of the largest set it served:
// after 10,000 rules that all matched, 10,000 hits for each connection.
// The factor of two leaves the growth of append alone.
func (sc *Scratch) Fit(s *Set) bool {
	most := 2*len(s.Rules) + scratchSlack
	if cap(sc.Hits) <= most && cap(sc.Rules) <= most && cap(sc.idx) <= most {
		return false
	}
	sc.Hits, sc.Rules, sc.idx = nil, nil, nil
	return true
}
