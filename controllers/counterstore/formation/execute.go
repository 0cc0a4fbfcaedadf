package formation

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Outcome is what Execute did.
type Outcome struct {
	// Done counts the actions carried out in full.
	Done int
	// MovedSlots and MovedKeys count what migrations moved.
	MovedSlots, MovedKeys int
	// Incomplete reports that a migration stopped at the time budget,
	// with slots left for the next pass.
	Incomplete bool
}

// migrateBatch is how many slots one migration round opens at once.
const migrateBatch = 64

// keysPerMigrate is how many keys one MIGRATE moves.
const keysPerMigrate = 256

// Execute runs the actions of pass on the nodes of snap, in order. Actions
// are independent within a pass, so a failed one does not stop the others,
// except that a migration stops at its first error (its open slots are
// finished by the next pass's FixSlots step). Migrations stop starting new
// slot batches once budget has passed (0 means no budget), leaving the
// rest to the next pass. The returned error joins every failure.
func (s *Session) Execute(ctx context.Context, snap *Snapshot, pass *Pass, budget time.Duration) (Outcome, error) {
	var out Outcome
	var errs []error
	deadline := time.Time{}
	if budget > 0 {
		deadline = time.Now().Add(budget)
	}
	for _, a := range pass.Actions {
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a, err))
			break
		}
		var err error
		if a.Kind == ActMigrate {
			err = s.migrate(ctx, snap, a, deadline, &out)
		} else {
			err = s.run(ctx, a)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if out.Incomplete {
			break
		}
		out.Done++
	}
	return out, errors.Join(errs...)
}

// run carries out one single-command action.
func (s *Session) run(ctx context.Context, a Action) error {
	ctx, cancel := context.WithTimeout(ctx, s.d.timeout())
	defer cancel()
	c := s.client(a.Node)
	var err error
	switch a.Kind {
	case ActSetConfigEpoch:
		err = c.Do(ctx, "cluster", "set-config-epoch", a.Epoch).Err()
	case ActMeet:
		host, port, perr := splitAddr(a.Peer)
		if perr != nil {
			return fmt.Errorf("%s: %w", a, perr)
		}
		err = c.ClusterMeet(ctx, host, strconv.Itoa(port)).Err()
	case ActForget:
		err = c.ClusterForget(ctx, a.PeerID).Err()
		if err != nil && strings.Contains(err.Error(), "Unknown node") {
			err = nil // already forgotten
		}
	case ActReplicate:
		err = c.ClusterReplicate(ctx, a.PeerID).Err()
	case ActFailover:
		args := []any{"cluster", "failover"}
		if a.Mode != "" {
			args = append(args, a.Mode)
		}
		err = c.Do(ctx, args...).Err()
	case ActAddSlots:
		args := []any{"cluster", "addslotsrange"}
		for _, r := range a.Slots {
			args = append(args, r.Start, r.End)
		}
		err = c.Do(ctx, args...).Err()
	case ActStabilize:
		err = pipeEach(ctx, c, a.Slots, func(p redis.Pipeliner, slot int) {
			p.Do(ctx, "cluster", "setslot", slot, "stable")
		})
	default:
		return fmt.Errorf("unknown action kind %q", a.Kind)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", a, err)
	}
	return nil
}

// pipeEach sends one command per slot in one pipeline and returns the
// first error of any of them.
func pipeEach(ctx context.Context, c *redis.Client, ranges []SlotRange, add func(redis.Pipeliner, int)) error {
	pipe := c.Pipeline()
	for _, r := range ranges {
		for slot := r.Start; slot <= r.End; slot++ {
			add(pipe, slot)
		}
	}
	cmds, err := pipe.Exec(ctx)
	for _, cmd := range cmds {
		if cmd.Err() != nil {
			return cmd.Err()
		}
	}
	return err
}

// migrate moves a.Slots from a.Node to a.Peer, keys included, batch by
// batch, following the protocol of redis-cli --cluster reshard: the
// destination imports, the source migrates, keys move with MIGRATE ...
// KEYS until the slot is empty, then the destination, the source and every
// other master learn the new owner. A slot never changes owner while its
// source still holds keys for it (Redis refuses SETSLOT NODE then), so no
// key is lost.
func (s *Session) migrate(ctx context.Context, snap *Snapshot, a Action, deadline time.Time, out *Outcome) error {
	host, port, err := splitAddr(a.Peer)
	if err != nil {
		return fmt.Errorf("%s: %w", a, err)
	}
	src, dst := s.client(a.Node), s.client(a.Peer)
	var others []*redis.Client
	for _, n := range snap.reachable() {
		if n.Self.IsMaster() && n.Addr != a.Node && n.Addr != a.Peer {
			others = append(others, s.client(n.Addr))
		}
	}
	set := SlotSetOf(a.Slots...)
	slots := set.Slots()
	for len(slots) > 0 {
		if !deadline.IsZero() && time.Now().After(deadline) {
			out.Incomplete = true
			return nil
		}
		batch := toRanges(slots[:min(migrateBatch, len(slots))])
		slots = slots[min(migrateBatch, len(slots)):]
		if err := s.migrateBatch(ctx, src, dst, others, host, port, a, batch, out); err != nil {
			return fmt.Errorf("%s: slots %s: %w", a, FormatRanges(batch), err)
		}
	}
	return nil
}

func (s *Session) migrateBatch(ctx context.Context, src, dst *redis.Client, others []*redis.Client, host string, port int, a Action, batch []SlotRange, out *Outcome) error {
	step := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, s.d.timeout()) }

	c, cancel := step()
	err := pipeEach(c, dst, batch, func(p redis.Pipeliner, slot int) {
		p.Do(c, "cluster", "setslot", slot, "importing", a.NodeID)
	})
	cancel()
	if err != nil {
		return fmt.Errorf("setslot importing on the destination: %w", err)
	}
	c, cancel = step()
	err = pipeEach(c, src, batch, func(p redis.Pipeliner, slot int) {
		p.Do(c, "cluster", "setslot", slot, "migrating", a.PeerID)
	})
	cancel()
	if err != nil {
		return fmt.Errorf("setslot migrating on the source: %w", err)
	}

	pending := batch
	for len(pending) > 0 {
		c, cancel := step()
		pipe := src.Pipeline()
		var cmds []*redis.StringSliceCmd
		var order []int
		for _, r := range pending {
			for slot := r.Start; slot <= r.End; slot++ {
				cmds = append(cmds, pipe.ClusterGetKeysInSlot(c, slot, keysPerMigrate))
				order = append(order, slot)
			}
		}
		_, err := pipe.Exec(c)
		cancel()
		if err != nil {
			return fmt.Errorf("getkeysinslot: %w", err)
		}
		var again []int
		for i, cmd := range cmds {
			keys := cmd.Val()
			if len(keys) == 0 {
				continue
			}
			if err := s.migrateKeys(ctx, src, host, port, keys); err != nil {
				return fmt.Errorf("slot %d: %w", order[i], err)
			}
			out.MovedKeys += len(keys)
			again = append(again, order[i])
		}
		pending = toRanges(again)
	}

	// The destination first, so that it answers for the slot before the
	// source starts redirecting to it; then the source; then the rest.
	for i, cl := range append([]*redis.Client{dst, src}, others...) {
		c, cancel := step()
		err := pipeEach(c, cl, batch, func(p redis.Pipeliner, slot int) {
			p.Do(c, "cluster", "setslot", slot, "node", a.PeerID)
		})
		cancel()
		if err != nil && i < 2 {
			return fmt.Errorf("setslot node on %s: %w", cl.Options().Addr, err)
		}
		// Other masters learn the owner through gossip too: the
		// destination bumped its epoch when it took the slot.
	}
	out.MovedSlots += countSlots(batch)
	return nil
}

// migrateKeys moves keys from src to host:port with one MIGRATE. REPLACE
// makes a retry after an interrupted MIGRATE safe: the source's copy is
// the live one while the slot is migrating.
func (s *Session) migrateKeys(ctx context.Context, src *redis.Client, host string, port int, keys []string) error {
	timeout := s.d.migrateTimeout()
	args := []any{"migrate", host, port, "", 0, timeout.Milliseconds(), "replace"}
	if s.d.Password != "" {
		args = append(args, "auth", s.d.Password)
	}
	args = append(args, "keys")
	for _, k := range keys {
		args = append(args, k)
	}
	c, cancel := context.WithTimeout(ctx, timeout+s.d.timeout())
	defer cancel()
	if err := src.Do(c, args...).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("migrate %d keys to %s:%d: %w", len(keys), host, port, err)
	}
	return nil
}
