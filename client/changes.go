package client

import "sync"

// changeQueue feeds Client.Changes without ever making the read loop wait.
//
// push parks changes in pending, keyed by user, newest winning (presence is
// state, not a log); run moves them, oldest user first, into out, a channel
// of fixed capacity. While the consumer keeps up, every change passes
// through; once out is full, further changes for a user already waiting
// replace the waiting one. Memory is thus bounded by out's capacity plus one
// change per distinct user, at most the users the viewer can see.
type changeQueue struct {
	mu      sync.Mutex
	pending map[string]Change // guarded by mu: the newest change per waiting user
	order   []string          // guarded by mu: waiting users, oldest first

	wake chan struct{} // capacity 1, never closed: "pending is not empty"
	out  chan Change   // closed by run when the client closes

	coalesced uint64 // guarded by mu: changes replaced before delivery
}

func newChangeQueue(capacity int) *changeQueue {
	return &changeQueue{
		pending: make(map[string]Change),
		wake:    make(chan struct{}, 1),
		out:     make(chan Change, capacity),
	}
}

// push queues changes; it never blocks.
func (q *changeQueue) push(changes []Change) {
	if len(changes) == 0 {
		return
	}
	q.mu.Lock()
	for _, ch := range changes {
		if _, waiting := q.pending[ch.UserID]; waiting {
			q.coalesced++
		} else {
			q.order = append(q.order, ch.UserID)
		}
		q.pending[ch.UserID] = ch
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// pop takes the oldest waiting change.
func (q *changeQueue) pop() (Change, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.order) == 0 {
		return Change{}, false
	}
	id := q.order[0]
	q.order[0] = ""
	q.order = q.order[1:]
	if len(q.order) == 0 {
		q.order = nil // let the backing array go
	}
	ch := q.pending[id]
	delete(q.pending, id)
	return ch, true
}

// run forwards changes to out until stop is closed, then closes out.
func (q *changeQueue) run(stop <-chan struct{}) {
	defer close(q.out)
	for {
		ch, ok := q.pop()
		if !ok {
			select {
			case <-q.wake:
				continue
			case <-stop:
				return
			}
		}
		select {
		case q.out <- ch:
		case <-stop:
			return
		}
	}
}

func (q *changeQueue) coalescedCount() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.coalesced
}
