package webhook

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	"github.com/greendot/greendot/store"
)

// MemQueue is the Source of the memory store: a bounded queue in this
// process. A full queue drops its oldest event for the new one (counted as
// overflow). What it holds is lost with the process (docs/webhooks.md).
type MemQueue struct {
	epoch string // the memory store's versions restart with the process
	max   int
	ready chan struct{}

	mu      sync.Mutex
	q       []*Event // FIFO, q[head:] are waiting
	head    int
	taken   map[*Event]struct{}
	dropped int // since the last TakeDropped
}

// NewMemQueue returns a queue of at most max events (waiting and taken).
func NewMemQueue(max int) *MemQueue {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return &MemQueue{epoch: hex.EncodeToString(b), max: max, ready: make(chan struct{}, 1),
		taken: map[*Event]struct{}{}}
}

// Add queues the event of a published change; it never blocks, so a store
// may call it while it orders its events (memstore.Config.OnChange).
func (m *MemQueue) Add(ev store.PresenceEvent) {
	e := FromChange(ev.Change, ev.Teams, m.epoch)
	e.Occupied, e.Vacated = ev.Occupied, ev.Vacated
	m.mu.Lock()
	if len(m.q)-m.head+len(m.taken) >= m.max {
		if m.head < len(m.q) {
			m.q[m.head] = nil
			m.head++
			m.dropped++
		} else {
			// Everything is taken (in delivery): the new one goes.
			m.dropped++
			m.mu.Unlock()
			return
		}
	}
	if m.head > 0 && m.head >= len(m.q)/2 {
		m.q = append(m.q[:0], m.q[m.head:]...)
		m.head = 0
	}
	m.q = append(m.q, e)
	m.mu.Unlock()
	select {
	case m.ready <- struct{}{}:
	default:
	}
}

// Take implements Source.
func (m *MemQueue) Take(_ context.Context, n int) ([]*Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := min(n, len(m.q)-m.head)
	if k <= 0 {
		return nil, nil
	}
	out := make([]*Event, k)
	copy(out, m.q[m.head:m.head+k])
	for i := m.head; i < m.head+k; i++ {
		m.q[i] = nil
	}
	m.head += k
	for _, e := range out {
		m.taken[e] = struct{}{}
	}
	return out, nil
}

// TakeDropped returns how many events were dropped since the last call
// (the Sender counts and logs them).
func (m *MemQueue) TakeDropped() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.dropped
	m.dropped = 0
	return n
}

// Ready implements Source.
func (m *MemQueue) Ready() <-chan struct{} { return m.ready }

// Keep implements Source: nobody else can take an event here.
func (m *MemQueue) Keep(context.Context, []*Event) ([]*Event, error) { return nil, nil }

// Done implements Source.
func (m *MemQueue) Done(_ context.Context, evs []*Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range evs {
		delete(m.taken, e)
	}
	return nil
}

// Stats implements Source.
func (m *MemQueue) Stats(context.Context) (int, time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var oldest time.Time
	if m.head < len(m.q) {
		oldest = m.q[m.head].At
	}
	for e := range m.taken {
		if oldest.IsZero() || e.At.Before(oldest) {
			oldest = e.At
		}
	}
	return len(m.q) - m.head + len(m.taken), oldest, nil
}
