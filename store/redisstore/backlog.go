package redisstore

import "sync"

// backlog is work that many goroutines add to and one loop takes whole: the
// heartbeats heard since the last batch, the ends and the publishes to try
// again. Each is its own type with its own lock, apart from the Store's.
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
