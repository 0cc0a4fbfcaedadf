// Package redistest runs real redis-server processes on loopback for tests:
// a Redis Cluster of any shape, or a single standalone server, plus the
// faults that floodgate's Redis store must survive.
//
// # Starting
//
// StartCluster starts and forms a cluster for one test and tears it down
// with t.Cleanup:
//
//	c := redistest.StartCluster(t, redistest.Options{Masters: 3, Replicas: 1})
//	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
//
// A package whose tests share one cluster starts it once from TestMain:
//
//	var cluster *redistest.Cluster
//
//	func TestMain(m *testing.M) {
//		redistest.Main(m, redistest.Options{Masters: 3, Replicas: 1},
//			func(c *redistest.Cluster) { cluster = c })
//	}
//
// NewCluster and NewServer are the same without a testing.TB; the caller
// calls Close. StartServer starts one standalone (non-cluster) server.
//
// The cluster is formed over the Redis protocol the way redis-cli --cluster
// create does it: each master gets a contiguous slot range, every pair of
// nodes MEETs, replica i follows master i mod Masters, and the start
// returns once WaitClusterOK holds. Nothing is persisted. Forming a 3x1
// cluster takes about two seconds, most of it Redis's own delay before a
// fresh master declares itself writable.
//
// # Faults
//
// Kill (SIGKILL), Pause (SIGSTOP) and Resume (SIGCONT) act on a node.
// Restart brings a killed node back on the same address with its node ID;
// RestartAt brings it back on another loopback address (127.0.0.2, ...),
// announced with --cluster-announce-ip, as a rescheduled pod would come
// back. WaitForFailover waits until a killed or paused master's slots are
// served by another master in every live node's view and returns it;
// WaitClusterOK waits until the whole cluster is healthy and agreed. Both
// take a timeout and never wait longer. Options.NodeTimeout sets how fast
// Redis fails a node over (default 2s; 1s suits failover tests), and
// Options.PartialCoverage keeps the other shards serving while one has no
// master.
//
// # Safety
//
// Several test binaries may run at once (go test runs packages in
// parallel). Each node claims its port with a flock on a file under
// $TMPDIR/floodgate-redistest-ports, checks that the port and its cluster
// bus port (port+10000) are both free, and on losing a bind race anyway
// starts again on another port. Node ports come from [12000, 22000) and bus
// ports from [22000, 32000), below the kernel's ephemeral range.
//
// Every redis-server is started with Pdeathsig set to SIGKILL, so when the
// test process dies in any way (a panic, a -timeout, Ctrl-C, SIGKILL) the
// kernel kills its servers: none is left behind.
//
// redis-server is looked up on PATH, then at /usr/bin/redis-server. When
// it is missing the helper fails the test, naming the command that
// installs it: hack/redis-cluster.sh install. It never skips.
package redistest
