// Package faults holds floodgate's fault tests to what a user is
// promised, on real redis-server clusters (test/redistest): the engine and
// the Redis store of several sidecars, in one process, through a killed
// master, a stopped one, a script cache flushed before a failover, a slot
// moved under load, a stalled shard and a Redis that comes back to 200
// clients at once. Each test asserts the bound the documentation gives
// and logs the figure it measured.
//
// Timing bounds are the promise plus the worst lateness of a goroutine
// measured on the same machine over the same run (a goroutine that sleeps
// 1ms at a time), so that a machine busy with other work does not fail
// them while a stall of floodgate's own (several call budgets, seconds)
// does. The tests do not run in parallel with one another.
package faults
