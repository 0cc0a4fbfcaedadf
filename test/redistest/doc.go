// Package redistest runs real redis-server processes on loopback for tests:
// a Redis Cluster of any shape, formed or left for the code under test to
// form, or a single standalone server, plus the faults that floodgate's
// Redis store and its CounterStore controller must survive.
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
// calls Close. StartServer starts one standalone (non-cluster) server, or,
// with ServerOptions.Command, a command that runs one, such as a
// container's start script. The helpers take a TB, which *testing.T and
// ginkgo.GinkgoT() both satisfy.
//
// # One loopback IP per node
//
// By default every node listens on 127.0.0.1, on a port of its own. With
// Options.IPPerNode every node gets a loopback IP of its own from
// 127.1.0.0/16, all on one port (6379 by default), announced to the
// cluster with --cluster-announce-ip: the shape of a CounterStore, whose
// Pods each have an IP and listen on 6379, and what a test needs whose
// code tells nodes apart by host. ClaimHost claims such an IP alone, for a
// Server started there.
//
// Options.Unformed starts the nodes cluster-enabled but alone, for code
// that forms the cluster itself; AddNodes starts more, as a StatefulSet
// scaled up would.
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
// back. Reschedule brings it back as Kubernetes brings a Pod back: on a
// newly claimed IP or its own, with its node ID or as a new, empty node.
// WaitReplicated waits until replicas have caught up with their masters.
// WaitForFailover waits until a killed or paused master's slots are
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
// parallel). Each node claims its address (its port on 127.0.0.1, or its
// IP with IPPerNode) with a flock on a file under
// $TMPDIR/floodgate-redistest-ports, checks that the port and its cluster
// bus port (port+10000) are both free, and on losing a bind race anyway
// starts again on another address. Node ports on 127.0.0.1 come from
// [12000, 22000) and bus ports from [22000, 32000), below the kernel's
// ephemeral range. A node moved to a new IP keeps its old one claimed until
// the cluster closes, so that no other test's node answers where its peers
// may still look for it.
//
// Every redis-server (or command) is started with Pdeathsig set to
// SIGKILL, so when the test process dies in any way (a panic, a -timeout,
// Ctrl-C, SIGKILL) the kernel kills its servers: none is left behind. Each
// leads a process group, and Kill kills the whole group.
//
// redis-server is looked up on PATH, then at /usr/bin/redis-server. When
// it is missing the helper fails the test, naming the command that
// installs it: hack/redis-cluster.sh install. It never skips.
package redistest
