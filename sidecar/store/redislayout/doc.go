// Package redislayout is the contract between floodgate's manager and the
// sidecars' Redis store: how counters are named in Redis (Keys: the key
// space of a namespace first in every key's hash tag, and the ACL key
// pattern that covers it), and the Lua that decides on them, as one Redis
// Functions library (Library) whose functions a store user may call and
// nothing else. The manager loads the library and sets each namespace's
// ACL user from it; package redisstore calls the functions. It does no
// I/O.
package redislayout
