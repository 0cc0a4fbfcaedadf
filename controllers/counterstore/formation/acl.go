package formation

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"
)

// User is a Redis ACL user as a node should have it.
type User struct {
	// Name is the user's name.
	Name string
	// Passwords are the passwords the user is accepted with; during a
	// rotation, the new one and the old one.
	Passwords []string
	// Rules are the user's ACL rules other than "on" and its passwords
	// (key patterns, channels, commands), as ACL SETUSER takes them. They
	// are applied when the node lacks the user; a node that has it keeps
	// its rules, which its start script set.
	Rules []string
}

// passwordHashes returns the SHA-256 hex digests Redis keeps of the
// passwords, sorted.
func (u User) passwordHashes() []string {
	out := make([]string, 0, len(u.Passwords))
	for _, p := range u.Passwords {
		sum := sha256.Sum256([]byte(p))
		out = append(out, hex.EncodeToString(sum[:]))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// EnsureUser brings user u to every node of addrs: a node without the user
// gets it, with its rules; a node whose user accepts other passwords gets
// exactly u's (ACL SETUSER resetpass). Connections already authenticated
// as the user stay open: Redis checks a password only at AUTH. It returns
// the addresses of the nodes it changed, and joins an error per node it
// could not check or change.
func (s *Session) EnsureUser(ctx context.Context, addrs []string, u User) ([]string, error) {
	if u.Name == "" || len(u.Passwords) == 0 {
		return nil, errors.New("ensure user: a name and at least one password are required")
	}
	want := u.passwordHashes()
	var (
		mu      sync.Mutex
		changed []string
		errs    []error
		wg      sync.WaitGroup
	)
	sem := make(chan struct{}, observeParallelism)
	for _, addr := range addrs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			did, err := s.ensureUser(ctx, addr, u, want)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("ACL user %s on %s: %w", u.Name, addr, err))
			}
			if did {
				changed = append(changed, addr)
			}
		})
	}
	wg.Wait()
	slices.Sort(changed)
	return changed, errors.Join(errs...)
}

func (s *Session) ensureUser(ctx context.Context, addr string, u User, want []string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.d.timeout())
	defer cancel()
	c := s.client(addr)
	res, err := c.Do(ctx, "acl", "getuser", u.Name).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, err
	}
	args := []any{"acl", "setuser", u.Name}
	if res == nil || errors.Is(err, redis.Nil) {
		args = append(args, "reset", "on")
		for _, r := range u.Rules {
			args = append(args, r)
		}
	} else {
		have, err := aclPasswords(res)
		if err != nil {
			return false, err
		}
		if slices.Equal(have, want) {
			return false, nil
		}
		args = append(args, "resetpass")
	}
	for _, p := range u.Passwords {
		args = append(args, ">"+p)
	}
	if err := c.Do(ctx, args...).Err(); err != nil {
		return false, err
	}
	return true, nil
}

// aclPasswords reads the password hashes of an ACL GETUSER reply (a flat
// list of field names and values in RESP2), sorted.
func aclPasswords(res any) ([]string, error) {
	fields, ok := res.([]any)
	if !ok {
		return nil, fmt.Errorf("ACL GETUSER answered %T, want a list", res)
	}
	for i := 0; i+1 < len(fields); i += 2 {
		if name, _ := fields[i].(string); name != "passwords" {
			continue
		}
		list, ok := fields[i+1].([]any)
		if !ok {
			return nil, fmt.Errorf("ACL GETUSER passwords is %T, want a list", fields[i+1])
		}
		out := make([]string, 0, len(list))
		for _, p := range list {
			h, ok := p.(string)
			if !ok {
				return nil, fmt.Errorf("ACL GETUSER password hash is %T, want a string", p)
			}
			out = append(out, h)
		}
		slices.Sort(out)
		return out, nil
	}
	return nil, errors.New("ACL GETUSER reply has no passwords field")
}

// EnsureUsers is EnsureUser for each of users: it returns, per user name,
// the nodes it changed, and joins the errors.
func (s *Session) EnsureUsers(ctx context.Context, addrs []string, users []User) (map[string][]string, error) {
	changed := map[string][]string{}
	var errs []error
	for _, u := range users {
		c, err := s.EnsureUser(ctx, addrs, u)
		if len(c) > 0 {
			changed[u.Name] = c
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return changed, errors.Join(errs...)
}

// PruneUsers deletes, on every node of addrs, the users whose name stale
// reports true (ACL USERS, then ACL DELUSER). Redis closes their
// connections. It returns the names it deleted per node address, and
// joins an error per node it could not check or change.
func (s *Session) PruneUsers(ctx context.Context, addrs []string, stale func(name string) bool) (map[string][]string, error) {
	var (
		mu      sync.Mutex
		deleted = map[string][]string{}
		errs    []error
		wg      sync.WaitGroup
	)
	sem := make(chan struct{}, observeParallelism)
	for _, addr := range addrs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(ctx, s.d.timeout())
			defer cancel()
			c := s.client(addr)
			names, err := c.Do(ctx, "acl", "users").StringSlice()
			var gone []string
			if err == nil {
				for _, n := range names {
					if stale(n) {
						gone = append(gone, n)
					}
				}
				if len(gone) > 0 {
					args := make([]any, 0, 2+len(gone))
					args = append(args, "acl", "deluser")
					for _, n := range gone {
						args = append(args, n)
					}
					err = c.Do(ctx, args...).Err()
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("prune ACL users on %s: %w", addr, err))
				return
			}
			if len(gone) > 0 {
				deleted[addr] = gone
			}
		})
	}
	wg.Wait()
	return deleted, errors.Join(errs...)
}
