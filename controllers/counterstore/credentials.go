package counterstore

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
)

// Redis users and the Secrets that hold their passwords.
//
// A managed store has one admin user, the default user, with the password
// under PasswordKey of its auth Secret: it forms and heals the cluster,
// the replicas authenticate with it, and the probes use it; it never
// leaves the manager's namespace.
//
// Every namespace whose sidecars use the store has a Redis user of its own,
// NamespaceUser(ns), with NamespaceACLRules(ns): the counter functions on
// that namespace's keys (fg:{<ns>/...}) and the cluster's topology, and
// nothing else. Its passwords live in a Secret of the manager's namespace,
// UserSecretName(store, ns), which the sidecaraccess controller creates
// (empty) when the namespace needs the store, and deletes when it no
// longer does. The store's controller fills it in: it generates the
// password, rotates it on request with an overlap, and writes a password
// there only once every reachable node accepts it. The sidecaraccess
// controller then mirrors the current password into the namespace.
const (
	// UserPasswordKey holds a namespace user's password in its Secret.
	UserPasswordKey = "password"
	// PreviousUserPasswordKey holds its previous password while a
	// rotation overlaps the two.
	PreviousUserPasswordKey = "password-previous"
	// UserPrefix starts every namespace user's name.
	UserPrefix = "floodgate-ns-"
	// LegacySidecarUser is the one sidecar user that every namespace
	// shared before namespace users; the manager deletes it from the
	// nodes.
	LegacySidecarUser = "floodgate-sidecar"

	// RotateAnnotation on a namespace user's Secret asks for a new
	// password: set it to a new value (a timestamp) to rotate.
	RotateAnnotation = "floodgate.dev/rotate"
	// RotatedAnnotation records the RotateAnnotation value the manager
	// has acted on.
	RotatedAnnotation = "ratelimit.floodgate.dev/rotated"
	// PreviousExpiresAnnotation says until when (RFC 3339) the previous
	// password is accepted.
	PreviousExpiresAnnotation = "ratelimit.floodgate.dev/password-previous-expires"
	// UserNamespaceLabel on a namespace user's Secret names its namespace.
	UserNamespaceLabel = "ratelimit.floodgate.dev/namespace"
	// UserStoreLabel on a namespace user's Secret names its CounterStore.
	UserStoreLabel = "ratelimit.floodgate.dev/store-user"
)

// NamespaceUser returns the Redis ACL user of namespace ns's sidecars.
func NamespaceUser(ns string) string { return UserPrefix + ns }

// NamespaceACLRules are NamespaceUser(ns)'s ACL rules: what ns's sidecars
// need, and nothing else.
//
//   - Keys: only ns's counters, whose hash tags start with "<ns>/"
//     (redislayout.Keys). A sidecar of another namespace cannot name them.
//   - Scripts: FCALL and FCALL_RO, which run only the functions the
//     manager loaded (redislayout.Library); no EVAL, EVALSHA, SCRIPT or
//     FUNCTION, so no code of the sidecar's own can run on the store, and
//     nothing can hold it busy.
//   - Data commands: Redis checks the commands a function calls against
//     the caller's rules, so the ones the library calls (GET, SET,
//     PEXPIRE, the sorted-set ones; TestLibraryCommandsAllowed checks the
//     list against the library) are allowed, on ns's keys only: a
//     namespace can at worst reset its own counters, which its own
//     credential allows anyway.
//   - The rest is what the store's connections need: AUTH, HELLO and
//     CLIENT SETNAME for the handshake, the cluster topology for the slot
//     map, ASKING for a slot in migration, TIME and PING.
func NamespaceACLRules(ns string) []string {
	return []string{
		"resetchannels", "resetkeys", redislayout.Keys{Space: ns}.Pattern(), "-@all",
		"+fcall", "+fcall_ro",
		"+get", "+set", "+pexpire",
		"+zadd", "+zcard", "+zcount", "+zrange", "+zrevrange", "+zrem", "+zremrangebyscore", "+zscore",
		"+time", "+ping", "+auth", "+hello", "+client|setname", "+asking",
		"+cluster|slots", "+cluster|shards", "+cluster|nodes", "+cluster|info", "+cluster|myid",
	}
}

// UserCredentials are a namespace user's passwords, as its Secret holds
// them.
type UserCredentials struct {
	// Password is the current password: what the namespace's sidecars
	// get.
	Password string
	// Previous is the password before the last rotation, accepted until
	// PreviousExpires; empty outside a rotation.
	Previous        string
	PreviousExpires time.Time
	// Rotated is the RotateAnnotation value last acted on.
	Rotated string
}

// Passwords returns the passwords the user is accepted with: the current
// one, and the previous one during a rotation.
func (c UserCredentials) Passwords() []string {
	if c.Previous != "" {
		return []string{c.Password, c.Previous}
	}
	return []string{c.Password}
}

// NextUserCredentials returns the credentials a reconcile at now should
// hold, given the current ones and the Secret's RotateAnnotation: a
// missing password is generated; a RotateAnnotation value not yet acted on
// moves the password to Previous, accepted for overlap more, and generates
// a new one; a Previous past its expiry is dropped. The bool reports a
// change. gen returns a new password.
func NextUserCredentials(cur UserCredentials, rotate string, now time.Time, overlap time.Duration, gen func() (string, error)) (UserCredentials, bool, error) {
	next := cur
	var err error
	switch {
	case next.Password == "":
		if next.Password, err = gen(); err != nil {
			return cur, false, err
		}
		next.Rotated = rotate
	case rotate != "" && rotate != next.Rotated:
		next.Previous, next.PreviousExpires = next.Password, now.Add(overlap).UTC().Truncate(time.Second)
		if next.Password, err = gen(); err != nil {
			return cur, false, err
		}
		next.Rotated = rotate
	}
	if next.Previous != "" && !now.Before(next.PreviousExpires) {
		next.Previous, next.PreviousExpires = "", time.Time{}
	}
	return next, next != cur, nil
}

// GeneratePassword returns 64 random hexadecimal characters.
func GeneratePassword() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate a password: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// ValidatePassword accepts what redis.conf can carry: 16 to 512 printable
// ASCII characters other than '"', '\' and space.
func ValidatePassword(p string) error {
	if len(p) < 16 || len(p) > 512 {
		return fmt.Errorf("must be 16 to 512 characters, got %d", len(p))
	}
	if i := strings.IndexFunc(p, func(r rune) bool {
		return r <= ' ' || r > '~' || r == '"' || r == '\\'
	}); i >= 0 {
		return fmt.Errorf("character %d is not printable ASCII or is '\"', '\\' or a space", i)
	}
	return nil
}
