package descriptor

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
)

// Counter keys
//
// A rule's counter key is the rule's prefix, "<policy-uid>:<rule>:",
// followed by the hash of the request's descriptor values: the hex of the
// first 128 bits of their SHA-256. Every value enters the hash input as a
// field, its length in four big-endian bytes and then its bytes, so values
// cannot run into each other. Both of the sidecar's fronts build their keys
// with these functions:
//
//   - the HTTP proxy (Extractor.Key) writes, for each key part of the rule,
//     one byte naming the part's kind (0xff for a missing part counted as
//     shared) and then the part's value as a field;
//   - the Envoy rate-limit service writes each descriptor entry as two
//     fields, its key and then its value.
//
// The two inputs differ in shape because the fronts' rules do: a rule is
// either an HTTP rule or a descriptor rule (match.descriptors), never both,
// and the prefix names the rule, so a key of one front never meets a key of
// the other. Either input, once deployed, must never change: a key that
// changes is a counter that restarts from full.

// HashLen is the length of a key's hash: 128 bits in hex.
const HashLen = 32

// Hash is the hash of one request's descriptor values.
type Hash [HashLen]byte

// AppendField appends v to a hash input as one field.
func AppendField(in []byte, v string) []byte {
	in, start := beginField(in)
	in = append(in, v...)
	return endField(in, start)
}

// beginField starts a field whose value the caller appends in place, and
// returns where it starts, for endField.
func beginField(in []byte) ([]byte, int) {
	return append(in, 0, 0, 0, 0), len(in)
}

// endField writes the length of the field that starts at start and runs
// to the end of in.
func endField(in []byte, start int) []byte {
	binary.BigEndian.PutUint32(in[start:], uint32(len(in)-start-4))
	return in
}

// Sum returns the hash of a hash input.
func Sum(in []byte) Hash {
	sum := sha256.Sum256(in)
	var h Hash
	hex.Encode(h[:], sum[:HashLen/2])
	return h
}

// Key returns the counter key of the rule whose keys start with prefix,
// in one allocation: the key is the one string a decision keeps.
func (h *Hash) Key(prefix string) string {
	var b strings.Builder
	b.Grow(len(prefix) + HashLen)
	b.WriteString(prefix)
	b.Write(h[:])
	return b.String()
}
