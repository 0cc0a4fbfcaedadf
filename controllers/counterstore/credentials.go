package counterstore

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// Redis users and the keys of the auth Secret of a managed store.
//
// A managed store has two Redis users. The default user, with the password
// under PasswordKey, is the manager's admin user: it forms and heals the
// cluster, the replicas authenticate with it, and the probes use it; it
// never leaves the manager's namespace. SidecarUser, with the password
// under SidecarPasswordKey, is what the sidecars get (mirrored into their
// namespaces): it may run the counter scripts on fg:* keys and read the
// cluster's topology, and nothing else.
const (
	// SidecarUser is the Redis ACL user of the sidecars.
	SidecarUser = "floodgate-sidecar"
	// SidecarPasswordKey holds SidecarUser's password in the auth Secret.
	SidecarPasswordKey = "sidecar-password"
	// PreviousSidecarPasswordKey holds SidecarUser's previous password
	// while a rotation overlaps the two.
	PreviousSidecarPasswordKey = "sidecar-password-previous"

	// RotateAnnotation on the auth Secret asks for a new sidecar
	// password: set it to a new value (a timestamp) to rotate.
	RotateAnnotation = "floodgate.dev/rotate"
	// RotatedAnnotation records the RotateAnnotation value the manager
	// has acted on.
	RotatedAnnotation = "ratelimit.floodgate.dev/rotated"
	// PreviousExpiresAnnotation says until when (RFC 3339) the previous
	// sidecar password is accepted.
	PreviousExpiresAnnotation = "ratelimit.floodgate.dev/sidecar-password-previous-expires"
)

// SidecarACLRules are SidecarUser's ACL rules: the keys and commands the
// sidecars need, and nothing else. Redis checks the commands a script
// calls against the caller's rules too, so the scripts' own commands (GET,
// SET, PEXPIRE and the sorted-set ones of SlidingLog) are allowed, on fg:*
// keys only. The rest is what the store's connections need: AUTH, HELLO
// and CLIENT SETNAME for the handshake, the cluster topology for the slot
// map, ASKING for a slot in migration, TIME and PING.
var SidecarACLRules = []string{
	"resetchannels", "resetkeys", "~fg:*", "-@all",
	"+evalsha", "+eval", "+script|load", "+script|exists",
	"+get", "+set", "+pexpire",
	"+zadd", "+zcard", "+zcount", "+zrange", "+zrevrange", "+zremrangebyscore",
	"+time", "+ping", "+auth", "+hello", "+client|setname", "+asking",
	"+cluster|slots", "+cluster|shards", "+cluster|nodes", "+cluster|info", "+cluster|myid",
}

// Credentials are a managed store's passwords, as its auth Secret holds
// them.
type Credentials struct {
	// Admin is the default user's password (PasswordKey).
	Admin string
	// Sidecar is SidecarUser's password.
	Sidecar string
	// Previous is SidecarUser's previous password, accepted until
	// PreviousExpires; empty outside a rotation.
	Previous        string
	PreviousExpires time.Time
	// Rotated is the RotateAnnotation value last acted on.
	Rotated string
}

// SidecarPasswords returns the passwords SidecarUser is accepted with:
// the current one, and the previous one during a rotation.
func (c Credentials) SidecarPasswords() []string {
	if c.Previous != "" {
		return []string{c.Sidecar, c.Previous}
	}
	return []string{c.Sidecar}
}

// NextCredentials returns the credentials a reconcile at now should hold,
// given the current ones and the Secret's RotateAnnotation: missing
// passwords are generated; a RotateAnnotation value not yet acted on
// moves the sidecar password to Previous, accepted for overlap more, and
// generates a new one; a Previous past its expiry is dropped. The bool
// reports a change. gen returns a new password.
func NextCredentials(cur Credentials, rotate string, now time.Time, overlap time.Duration, gen func() (string, error)) (Credentials, bool, error) {
	next := cur
	var err error
	if next.Admin == "" {
		if next.Admin, err = gen(); err != nil {
			return cur, false, err
		}
	}
	switch {
	case next.Sidecar == "":
		if next.Sidecar, err = gen(); err != nil {
			return cur, false, err
		}
		next.Rotated = rotate
	case rotate != "" && rotate != next.Rotated:
		next.Previous, next.PreviousExpires = next.Sidecar, now.Add(overlap).UTC().Truncate(time.Second)
		if next.Sidecar, err = gen(); err != nil {
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
