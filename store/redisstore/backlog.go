package redisstore

import (
	"sync"
	"time"
)

// backlog is work that many goroutines add to and one loop takes whole: the
// ends and the publishes to try again, the statuses to send again. Each is
// its own type with its own lock, apart from the Store's. (Heartbeats wait
// per shard instead: beatBatches.)
type backlog[T any] struct {
	mu    sync.Mutex
	items []T // guarded by mu
}

// add appends item unless the backlog holds limit items already; it
// reports whether item was added.
func (b *backlog[T]) add(limit int, item T) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.items) >= limit {
		return false
	}
	b.items = append(b.items, item)
	return true
}

// addDroppingOldest appends items and drops the oldest past limit; it
// returns how many it dropped.
func (b *backlog[T]) addDroppingOldest(limit int, items ...T) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.items = append(b.items, items...)
	over := len(b.items) - limit
	if over <= 0 {
		return 0
	}
	b.items = b.items[over:]
	return over
}

// take empties the backlog and returns what it held.
func (b *backlog[T]) take() []T {
	b.mu.Lock()
	defer b.mu.Unlock()
	items := b.items
	b.items = nil
	return items
}

// beatBatches are the heartbeats heard and not written yet, per shard.
type beatBatches struct {
	mu    sync.Mutex
	ids   [numShards][]string  // guarded by mu
	first [numShards]time.Time // when each shard's oldest waiting id was added (monotonic); guarded by mu
	// last is the size of each shard's last batch taken, which the next one
	// starts at, so that a batch of ~100 is one allocation, not eight
	// doublings; guarded by mu.
	last [numShards]int32
}

// maxBatchStart bounds the capacity a batch starts at: a burst (a whole
// node re-asserted) sizes the next batch at most this large.
const maxBatchStart = 1024

// add queues a heartbeat of connection id, in shard sh.
func (b *beatBatches) add(sh int, id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.ids[sh]) == 0 {
		b.first[sh] = time.Now()
		if b.ids[sh] == nil {
			// Always a new array: a batch taken may still be on its way
			// to Redis, its script's arguments pointing into it.
			b.ids[sh] = make([]string, 0, max(4, b.last[sh]))
		}
	}
	b.ids[sh] = append(b.ids[sh], id)
}

// took notes the size of a batch taken from shard sh; none taken (an
// expiry's takeShard of an empty shard) says nothing of the next.
func (b *beatBatches) took(sh int, n int) {
	if n > 0 {
		b.last[sh] = int32(min(n, maxBatchStart))
	}
}

// take removes and returns the batches that are due at now: those of at
// least full ids and those whose oldest id waited hold; every batch when
// full is 0.
func (b *beatBatches) take(now time.Time, full int, hold time.Duration) (due [numShards][]string, some bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for sh, ids := range b.ids {
		if len(ids) > 0 && (len(ids) >= full || now.Sub(b.first[sh]) >= hold) {
			due[sh], b.ids[sh], some = ids, nil, true
			b.took(sh, len(ids))
		}
	}
	return due, some
}

// takeShard removes and returns shard sh's batch.
func (b *beatBatches) takeShard(sh int) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	ids := b.ids[sh]
	b.ids[sh] = nil
	b.took(sh, len(ids))
	return ids
}
