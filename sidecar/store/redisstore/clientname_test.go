package redisstore_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// namedClients returns, by node address, the CLIENT LIST entries of the
// nodes that are named name, as field maps.
func namedClients(t *testing.T, nodes []*redistest.Node, name string) map[string][]map[string]string {
	t.Helper()
	out := map[string][]map[string]string{}
	for _, n := range nodes {
		list, err := n.Client().ClientList(t.Context()).Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(strings.TrimSpace(list), "\n") {
			fields := map[string]string{}
			for f := range strings.FieldsSeq(line) {
				k, v, _ := strings.Cut(f, "=")
				fields[k] = v
			}
			if fields["name"] == name {
				out[n.Addr()] = append(out[n.Addr()], fields)
			}
		}
	}
	return out
}

// TestClientName: every connection of the store, the pipelined ones that
// carry the scripts and the go-redis ones that load the slot map, carries
// the store's name in CLIENT LIST.
func TestClientName(t *testing.T) {
	t.Parallel()
	name := fmt.Sprintf("floodgate-sidecar:test-%d", time.Now().UnixNano())
	s := newStore(t, cluster, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: suiteTimeout, ClientName: name})
	key := uniqueKey(t)
	if _, _, err := s.Take(t.Context(), limiter.Request{Key: key, Limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 5, Period: time.Minute}, Cost: 1}); err != nil {
		t.Fatal(err)
	}
	owner, err := cluster.MasterForKey(t.Context(), redislayout.CounterKey(key, limiter.TokenBucket))
	if err != nil {
		t.Fatal(err)
	}
	named := namedClients(t, cluster.Nodes(), name)
	scripts, slotMap := 0, 0
	for _, conns := range named {
		for _, c := range conns {
			switch cmd := c["cmd"]; {
			case strings.HasPrefix(cmd, "fcall"):
				scripts++
			case strings.HasPrefix(cmd, "cluster"):
				slotMap++
			}
		}
	}
	if len(named[owner.Addr()]) == 0 {
		t.Errorf("no connection named %q on %v, the master that ran the script; named: %v", name, owner, named)
	}
	if scripts == 0 || slotMap == 0 {
		t.Errorf("named connections: %d that ran scripts, %d that loaded the slot map; want both: %v", scripts, slotMap, named)
	}
}

// TestClientNameDefault: without Options.ClientName the connections are
// named floodgate-sidecar:<host name>.
func TestClientNameDefault(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	s, err := redisstore.New(redisstore.Options{Addrs: []string{srv.Addr()}, Single: true, Timeout: suiteTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	if _, _, err := s.Take(t.Context(), limiter.Request{Key: "k", Limit: limiter.Limit{Algorithm: limiter.GCRA, Requests: 5, Period: time.Minute}, Cost: 1}); err != nil {
		t.Fatal(err)
	}
	want := redisstore.DefaultClientName()
	if !strings.HasPrefix(want, "floodgate-sidecar") {
		t.Fatalf("DefaultClientName() = %q, want it to start with floodgate-sidecar", want)
	}
	list, err := srv.Client().ClientList(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(list, " name="+want+" ") {
		t.Errorf("no connection named %q:\n%s", want, list)
	}
}

// TestClientNameRefused: an ACL user that may not set its name still gets
// its decisions: the name is a courtesy, not a requirement.
func TestClientNameRefused(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	ctx := t.Context()
	if err := srv.Client().Do(ctx, "acl", "setuser", "limited", "on", ">secret", "~*", "+@all", "-client|setname").Err(); err != nil {
		t.Fatal(err)
	}
	s, err := redisstore.New(redisstore.Options{Addrs: []string{srv.Addr()}, Single: true, Timeout: suiteTimeout,
		Username: "limited", Password: "secret", ClientName: "floodgate-sidecar:refused"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	for j := range 3 {
		d, _, err := s.Take(ctx, limiter.Request{Key: "k", Limit: limiter.Limit{Algorithm: limiter.GCRA, Requests: 2, Period: time.Minute}, Cost: 1})
		if err != nil {
			t.Fatalf("take as a user that may not set its name: %v", err)
		}
		if got, want := d.Allowed, j < 2; got != want {
			t.Fatalf("request %d: Allowed = %v, want %v", j, got, want)
		}
	}
	list, err := srv.Client().ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(list, "name=floodgate-sidecar:refused") {
		t.Errorf("the name was set although the ACL refuses it:\n%s", list)
	}
	if !strings.Contains(list, "user=limited") {
		t.Errorf("no connection of user limited:\n%s", list)
	}
}
