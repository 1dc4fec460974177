package server

import (
	"runtime"
	"sync"
	"time"
)

// flusher writes the changes queued in outboxes, in rounds. It owns the list
// of connections with something pending; its loop runs on a goroutine owned
// by the Server and stopped by Shutdown.
type flusher struct {
	srv *Server

	mu    sync.Mutex
	dirty []*client     // guarded by mu
	wake  chan struct{} // cap 1; never closed
}

func newFlusher(s *Server) *flusher {
	return &flusher{srv: s, wake: make(chan struct{}, 1)}
}

// markDirty puts c on the list. Unless wake is false (the caller kicks the
// flusher itself once it has queued a whole fan-out), it wakes the flusher.
func (f *flusher) markDirty(c *client, wake bool) {
	f.mu.Lock()
	f.dirty = append(f.dirty, c)
	f.mu.Unlock()
	if wake {
		f.kick()
	}
}

func (f *flusher) kick() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// loop writes queued changes. Rounds start at most every FlushDelay, which
// batches a burst into one frame per connection; a large round is split
// over a few goroutines, since each write is a system call.
func (f *flusher) loop() {
	defer f.srv.wg.Done()
	var batch []*client
	var last time.Time
	for {
		select {
		case <-f.srv.stop:
			return
		case <-f.wake:
		}
		// A change after a quiet spell goes out at once; under churn,
		// rounds start at most every FlushDelay, so a round batches (and
		// coalesces) whatever arrived while the previous one was written.
		if wait := f.srv.cfg.FlushDelay - time.Since(last); wait > 0 {
			time.Sleep(wait)
		}
		last = time.Now()
		f.mu.Lock()
		batch, f.dirty = f.dirty, batch[:0]
		f.mu.Unlock()
		flushAll(batch)
		clear(batch)
	}
}

func flushAll(batch []*client) {
	const perWorker = 256
	workers := min(runtime.GOMAXPROCS(0), (len(batch)+perWorker-1)/perWorker)
	if workers <= 1 {
		var enc frameCache
		for _, c := range batch {
			c.flush(&enc)
		}
		return
	}
	var wg sync.WaitGroup
	chunk := (len(batch) + workers - 1) / workers
	for i := 0; i < len(batch); i += chunk {
		part := batch[i:min(i+chunk, len(batch))]
		wg.Add(1)
		go func() { // waited for below: owned by this round
			defer wg.Done()
			var enc frameCache
			for _, c := range part {
				c.flush(&enc)
			}
		}()
	}
	wg.Wait()
}
