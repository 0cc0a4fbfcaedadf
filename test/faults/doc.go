// Package faults holds floodgate's fault tests to what a user is
// promised, on real redis-server clusters (test/redistest): the engine and
// the Redis store of several sidecars, in one process, through a killed
// master, a stopped one, a script cache flushed before a failover, a slot
// moved under load, a stalled shard and a Redis that comes back to 200
// clients at once. Each test asserts the bound the documentation gives
// and logs the figure it measured.
//
// A timing bound is the promise plus what the machine was measured to
// have delayed the event it bounds, over the same span, and nothing else
// (test/lateness: late timers, goroutines' and threads' waits for a CPU,
// and the Redis nodes' own where the bound waits on their answers), so
// that a machine busy with other work does not fail it while a stall of
// floodgate's own (several call budgets, seconds) does. The tests do not
// run in parallel with one another.
package faults
