package redisstore

import (
	"crypto/sha256"
	"encoding/hex"
)

// MaxKeyTag is the longest Request.Key used verbatim as a key's hash tag.
// Longer keys, and keys with bytes that could break the tag, are hashed.
const MaxKeyTag = 200

// Key parts: every counter has a state hash (TokenBucket, GCRA,
// FixedWindow, SlidingWindow) and a log (SlidingLog). Both are passed to
// every script, so that a write under one algorithm removes the other's
// state.
const (
	statePart = ":s"
	logPart   = ":l"
)

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
		c := key[i]
		if c <= ' ' || c >= 0x7f || c == '{' || c == '}' {
			return false
		}
	}
	return true
}

// counterKeys returns a counter's state and log keys:
// fg:{<tag>}:s and fg:{<tag>}:l, in the same slot by construction.
func counterKeys(key string) (state, log string) {
	base := "fg:{" + keyTag(key) + "}"
	return base + statePart, base + logPart
}

// MaxRedisKeyLen is the longest Redis key the store ever writes.
const MaxRedisKeyLen = len("fg:{") + MaxKeyTag + len("}") + len(statePart)

// KeySlot returns the Redis Cluster hash slot of the counter with the given
// Request.Key. It computes what CLUSTER KEYSLOT computes for both of its
// keys.
func KeySlot(key string) int {
	return int(crc16(keyTag(key)) % 16384)
}

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
