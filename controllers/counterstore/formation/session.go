package formation

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Dialer says how to reach the nodes.
type Dialer struct {
	// Password is sent with AUTH, and with MIGRATE to the destination
	// node. Empty sends none.
	Password string
	// TLS, when set, wraps every connection.
	TLS *tls.Config
	// Timeout bounds dialing and each command, except MIGRATE. 0 means 2s.
	Timeout time.Duration
	// MigrateTimeout is the timeout MIGRATE passes to the source node for
	// its transfer to the destination. 0 means 5s.
	MigrateTimeout time.Duration
}

func (d Dialer) timeout() time.Duration {
	if d.Timeout > 0 {
		return d.Timeout
	}
	return 2 * time.Second
}

func (d Dialer) migrateTimeout() time.Duration {
	if d.MigrateTimeout > 0 {
		return d.MigrateTimeout
	}
	return 5 * time.Second
}

// Session holds one connection pool per node for one pass of observing and
// acting. It is safe for concurrent use; Close releases every connection.
type Session struct {
	d Dialer

	mu      sync.Mutex
	clients map[string]*redis.Client
}

// NewSession returns a session that dials with d.
func NewSession(d Dialer) *Session {
	return &Session{d: d, clients: map[string]*redis.Client{}}
}

// Close closes every connection of the session.
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for addr, c := range s.clients {
		if err := c.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close connection to %s: %w", addr, err))
		}
		delete(s.clients, addr)
	}
	return errors.Join(errs...)
}

// client returns the pool of addr, creating it on first use.
func (s *Session) client(addr string) *redis.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.clients[addr]; ok {
		return c
	}
	c := redis.NewClient(&redis.Options{
		Addr:                  addr,
		Password:              s.d.Password,
		TLSConfig:             s.d.TLS,
		Protocol:              2,
		DialTimeout:           s.d.timeout(),
		ReadTimeout:           s.d.timeout(),
		WriteTimeout:          s.d.timeout(),
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		PoolSize:              2,
		PipelinePoolSize:      -1,
		DisableIdentity:       true,
		DialerRetries:         1,
	})
	s.clients[addr] = c
	return c
}

// observeParallelism bounds the nodes observed at once.
const observeParallelism = 16

// Observe asks every member with an address who it is and how it sees the
// cluster: CLUSTER MYID, CLUSTER NODES, CLUSTER INFO and DBSIZE, in one
// round trip per node, all nodes at once. A node that does not answer
// within the dialer's timeout is unreachable; Observe itself fails only
// when ctx ends.
func (s *Session) Observe(ctx context.Context, members []Member) (*Snapshot, error) {
	snap := &Snapshot{Nodes: make([]NodeState, len(members))}
	sem := make(chan struct{}, observeParallelism)
	var wg sync.WaitGroup
	for i, m := range members {
		snap.Nodes[i].Member = m
		if m.Addr == "" {
			snap.Nodes[i].Err = errors.New("no address yet")
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			s.observeNode(ctx, &snap.Nodes[i])
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("observe the cluster: %w", err)
	}
	return snap, nil
}

func (s *Session) observeNode(ctx context.Context, n *NodeState) {
	ctx, cancel := context.WithTimeout(ctx, s.d.timeout())
	defer cancel()
	pipe := s.client(n.Addr).Pipeline()
	myID := pipe.ClusterMyID(ctx)
	nodes := pipe.ClusterNodes(ctx)
	info := pipe.ClusterInfo(ctx)
	size := pipe.DBSize(ctx)
	repl := pipe.Info(ctx, "replication")
	if _, err := pipe.Exec(ctx); err != nil {
		n.Err = fmt.Errorf("%s (%s): %w", n.Name, n.Addr, err)
		return
	}
	view, err := ParseClusterNodes(nodes.Val())
	if err != nil {
		n.Err = fmt.Errorf("%s (%s): %w", n.Name, n.Addr, err)
		return
	}
	self, ok := view.Self()
	if !ok || self.ID != myID.Val() {
		n.Err = fmt.Errorf("%s (%s): CLUSTER NODES has no line for myself %s", n.Name, n.Addr, myID.Val())
		return
	}
	n.Reachable = true
	n.ID = myID.Val()
	n.View = view
	n.Self = self
	n.StateOK = strings.Contains(info.Val(), "cluster_state:ok")
	n.Keys = size.Val()
	n.ReplicaInSync = ReplicaInSync(repl.Val())
}

// ReplicaInSync reads INFO replication: true for a replica whose link to
// its master is up and whose sync is done. A replica still loading its
// master's data would, if promoted, lose the keys it has not received.
func ReplicaInSync(info string) bool {
	fields := map[string]string{}
	for line := range strings.SplitSeq(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	return fields["role"] == "slave" && fields["master_link_status"] == "up" && fields["master_sync_in_progress"] == "0"
}
