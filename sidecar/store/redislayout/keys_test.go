package redislayout

import (
	"strings"
	"testing"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

func TestKeyTag(t *testing.T) {
	t.Parallel()
	plain := []string{
		"3f2a6c1e-8d1b-4c55-9a51-1b7e2f0c9d4e:per-user:9c2f1a7b3e4d5f60",
		"a", "uid:rule:" + strings.Repeat("f", MaxKeyTag-9),
	}
	for _, k := range plain {
		if got := keyTag(k); got != k {
			t.Errorf("keyTag(%q) = %q, want it verbatim", k, got)
		}
	}
	hashed := []string{
		"", "a{b}c", "{", "}", "{}", "#abc", "a b", "a\tb", "a\x00b", "\xff\xfe",
		"naïve", strings.Repeat("x", MaxKeyTag+1), strings.Repeat("k", 64<<10),
	}
	seen := map[string]string{}
	for _, k := range hashed {
		got := keyTag(k)
		if len(got) != 33 || got[0] != '#' || strings.ContainsAny(got, "{}") {
			t.Errorf("keyTag(%q) = %q, want # and 32 hex digits", k, got)
		}
		if prev, dup := seen[got]; dup {
			t.Errorf("keyTag(%q) = keyTag(%q) = %q", k, prev, got)
		}
		seen[got] = k
	}
	if got, want := len(CounterKey(strings.Repeat("k", 1<<20), limiter.GCRA)), len("fg:{")+33+len("}:gcra:2"); got != want {
		t.Errorf("key of a 1 MiB Request.Key is %d bytes, want %d", got, want)
	}
	longest := Keys{Space: strings.Repeat("n", MaxKeySpace)}
	if got := len(longest.Counter(plain[2], limiter.GCRA)); got != MaxRedisKeyLen {
		t.Errorf("longest verbatim key is %d bytes, MaxRedisKeyLen = %d", got, MaxRedisKeyLen)
	}
}

// TestKeySpaces: a key space goes first in every key's hash tag, verbatim
// whatever the Request.Key (a hashed tag too), so that the space's ACL
// pattern covers all of its keys and none of another space's, however the
// spaces' names overlap.
func TestKeySpaces(t *testing.T) {
	t.Parallel()
	keys := []string{"pol:rule:abc", strings.Repeat("k", 1<<12), "{brace}", "#hash", "tenant-b/x", "*", ""}
	spaces := []string{"team", "team-a", "team-b", "a"}
	for _, sp := range spaces {
		k := Keys{Space: sp}
		pat := strings.TrimPrefix(k.Pattern(), "~")
		for _, key := range keys {
			names := []string{k.Counter(key, limiter.GCRA), k.Counter(key, limiter.SlidingLog), k.Slots(key)}
			for _, name := range names {
				if !globMatch(pat, name) {
					t.Errorf("space %q: %s is not covered by its pattern %s", sp, name, pat)
				}
				for _, other := range spaces {
					if other != sp && globMatch(strings.TrimPrefix(Keys{Space: other}.Pattern(), "~"), name) {
						t.Errorf("space %q's key %s is covered by space %q's pattern", sp, name, other)
					}
				}
				// The slot is the hash tag's, which holds the space.
				tag := name[strings.IndexByte(name, '{')+1 : strings.IndexByte(name, '}')]
				if !strings.HasPrefix(tag, sp+"/") || k.Slot(key) != int(crc16(tag)%16384) {
					t.Errorf("space %q: %s has tag %q, slot %d", sp, name, tag, k.Slot(key))
				}
			}
		}
	}
	for _, bad := range []string{"A", "-a", "a-", "a/b", "a*", "a{", strings.Repeat("a", MaxKeySpace+1)} {
		if err := ValidKeySpace(bad); err == nil {
			t.Errorf("ValidKeySpace(%q) = nil", bad)
		}
	}
}

// globMatch is Redis's glob for ACL key patterns, for the patterns Keys
// makes: a literal prefix and a final '*'.
func globMatch(pat, s string) bool {
	prefix, ok := strings.CutSuffix(pat, "*")
	if !ok || strings.ContainsAny(prefix, "*?[\\") {
		panic("unexpected pattern " + pat)
	}
	return strings.HasPrefix(s, prefix)
}

func TestCRC16(t *testing.T) {
	t.Parallel()
	// The check value of CRC-16/XMODEM, and the example of the Redis
	// Cluster specification.
	if got, want := crc16("123456789"), uint16(0x31C3); got != want {
		t.Errorf("crc16(123456789) = %#x, want %#x", got, want)
	}
}
