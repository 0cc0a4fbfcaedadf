package redislayout

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// MaxKeyTag is the longest Request.Key used verbatim as a key's hash tag.
// Longer keys, and keys with bytes that could break the tag, are hashed.
const MaxKeyTag = 200

// keyParts name a counter's key per algorithm. Keying the state by
// algorithm makes an algorithm edit start afresh (ALGORITHMS.md section
// 2, rule 7), and gives every script exactly one key, so a slot migration
// redirects it with ASK instead of failing it with TRYAGAIN.
//
// The trailing ":2" is the state format: version 2 packs the state into
// one string of doubles (version 1 was a hash). A new format gets new key
// names, so that during a rolling upgrade sidecars of either version never
// read the other's state (they count apart until the old ones are gone,
// and the old keys expire by their TTL).
var keyParts = [...]string{
	limiter.TokenBucket:   "tb:2",
	limiter.GCRA:          "gcra:2",
	limiter.FixedWindow:   "fw:2",
	limiter.SlidingWindow: "sw:2",
	limiter.SlidingLog:    "sl:2",
}

// keyTag returns the hash tag for a counter: Request.Key itself when it is
// short and plain, otherwise "#" and the first 128 bits of its SHA-256 in
// hex. A verbatim tag never starts with '#', so the two forms cannot
// collide. The engine builds keys as <policy-uid>:<rule>:<hash>, which
// pass verbatim; the hashing defends against any caller that would embed a
// client string, so that no input can move a counter to another slot (a
// '{' or '}' would change which part Redis hashes) or grow a key without
// bound.
func keyTag(key string) string {
	if plainTag(key) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "#" + hex.EncodeToString(sum[:16])
}

// plainTag reports whether key can be a hash tag verbatim: non-empty, at
// most MaxKeyTag bytes, printable ASCII without braces, and not starting
// with '#'.
func plainTag(key string) bool {
	if len(key) == 0 || len(key) > MaxKeyTag || key[0] == '#' {
		return false
	}
	for i := 0; i < len(key); i++ {
		if !tagByte[key[i]] {
			return false
		}
	}
	return true
}

// tagByte marks the bytes a verbatim tag may hold: printable ASCII but
// the braces.
var tagByte = func() (t [256]bool) {
	for c := '!'; c < 0x7f; c++ {
		t[c] = c != '{' && c != '}'
	}
	return t
}()

// Keys name a key space's Redis keys: the keys of one tenant. A
// non-empty Space (a Kubernetes namespace, as the sidecar's
// --redis-key-namespace sets it) goes first inside every key's hash tag:
// fg:{<space>/<tag>}:<part>. A store user's ACL key pattern
// ~fg:{<space>/* then covers exactly that space's counters, whatever the
// Request.Key (a hashed tag keeps the space verbatim), and each counter
// stays on one slot. The zero Keys is the unnamed space, fg:{<tag>}:<part>,
// for a store that is not shared between tenants.
type Keys struct {
	// Space is a DNS label (ValidKeySpace) or empty.
	Space string
}

// ValidKeySpace reports why space cannot name a key space: it must be
// empty or a DNS label (RFC 1123), as Kubernetes namespace names are, so
// that it holds no '/', brace or glob character.
func ValidKeySpace(space string) error {
	if space == "" {
		return nil
	}
	if len(space) > MaxKeySpace {
		return fmt.Errorf("key space %q: at most %d characters", space, MaxKeySpace)
	}
	for i := 0; i < len(space); i++ {
		c := space[i]
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' && i > 0 && i < len(space)-1
		if !ok {
			return fmt.Errorf("key space %q: must be a DNS label (lower-case letters, digits and inner '-')", space)
		}
	}
	return nil
}

// MaxKeySpace is the longest key space: a DNS label.
const MaxKeySpace = 63

// tag returns the hash tag of the counter with Request.Key key.
func (k Keys) tag(key string) string {
	if k.Space == "" {
		return keyTag(key)
	}
	return k.Space + "/" + keyTag(key)
}

// Counter returns the Redis key that holds the state of the counter with
// the given Request.Key under alg: fg:{<tag>}:<part>. It returns "" for
// an unknown algorithm.
func (k Keys) Counter(key string, alg limiter.Algorithm) string {
	if alg == 0 || int(alg) >= len(keyParts) {
		return ""
	}
	return "fg:{" + k.tag(key) + "}:" + keyParts[alg]
}

// slotKeyPart names the sorted set of a key's concurrency leases. Its
// ":1" is the state format, as for the rate counters' keys.
const slotKeyPart = "cc:1"

// Slots returns the Redis key of the concurrency slots (leases) of the
// counter with the given Request.Key.
func (k Keys) Slots(key string) string { return "fg:{" + k.tag(key) + "}:" + slotKeyPart }

// Slot returns the Redis Cluster hash slot of the counter with the given
// Request.Key, whatever its algorithm: what CLUSTER KEYSLOT answers for
// its Redis keys.
func (k Keys) Slot(key string) int { return int(crc16(k.tag(key)) % 16384) }

// Pattern is the ACL key pattern that covers the space's keys and no
// other space's: ~fg:{<space>/*, or ~fg:* for the unnamed space.
func (k Keys) Pattern() string {
	if k.Space == "" {
		return "~fg:*"
	}
	return "~fg:{" + k.Space + "/*"
}

// SlotKey is Keys{}.Slots, for tools and tests that inspect Redis.
func SlotKey(key string) string { return Keys{}.Slots(key) }

// CounterKey is Keys{}.Counter, for tools and tests that inspect Redis.
func CounterKey(key string, alg limiter.Algorithm) string { return Keys{}.Counter(key, alg) }

// KeySlot is Keys{}.Slot.
func KeySlot(key string) int { return Keys{}.Slot(key) }

// MaxRedisKeyLen is the longest Redis key the store ever writes.
const MaxRedisKeyLen = len("fg:{") + MaxKeySpace + len("/") + MaxKeyTag + len("}:gcra:2")

// crc16 is CRC16-CCITT (XMODEM), the Redis Cluster key hash.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16tab[byte(crc>>8)^s[i]]
	}
	return crc
}

var crc16tab = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()
