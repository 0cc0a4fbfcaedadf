package redislayout

import "strconv"

// numSlots is the number of Redis Cluster hash slots.
const numSlots = 16384

// SplitKey returns the Request.Key of sub-counter i (0 <= i < k) of the
// counter key when it is split over k sub-counters: key, "~", i, "." and
// the first salt from 0 up whose slot lies in the middle half of the i-th
// k-th of the slot space. A cluster whose masters hold equal contiguous
// slot ranges, as floodgate's managed CounterStore and redis-cli --cluster
// create assign them, has each of those middle halves on one master, so
// the sub-counters of a split into as many parts as masters land on
// different masters, and a split into a multiple of them spreads evenly.
// The answer depends on key, i and k alone, never on the slot map, so
// every sidecar names the same sub-counters. It is about 2k CRC16s of the
// key on average.
func SplitKey(key string, i, k int) string { return Keys{}.Split(key, i, k) }

// Split is SplitKey in the key space k: the sub-counters' slots are those
// of their keys in the space.
func (ks Keys) Split(key string, i, k int) string {
	if k <= 1 {
		return key
	}
	width := numSlots / k
	lo := i*numSlots/k + width/4
	hi := lo + max(1, width/2)
	prefix := key + "~" + strconv.Itoa(i) + "."
	buf := make([]byte, 0, len(prefix)+8)
	for salt := 0; ; salt++ {
		buf = strconv.AppendInt(append(buf[:0], prefix...), int64(salt), 10)
		if slot := ks.Slot(string(buf)); slot >= lo && slot < hi {
			return string(buf)
		}
	}
}
