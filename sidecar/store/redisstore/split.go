package redisstore

import (
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

var _ limiter.Splitter = (*Store)(nil)

// SplitKey implements limiter.Splitter with the store's key space's Split.
func (s *Store) SplitKey(key string, i, k int) string { return s.keys.Split(key, i, k) }
