package server

import (
	"context"
	"sync"
	"time"
)

// worker runs jobs off the event path, one at a time and in order: the store
// queries that a membership event or a resync needs, which a store's event
// handler must not wait for. Its loop runs on a goroutine owned by the
// Server and stopped by Shutdown.
type worker struct {
	srv *Server

	mu   sync.Mutex
	jobs []func(ctx context.Context) // guarded by mu
	wake chan struct{}               // cap 1; never closed
}

func newWorker(s *Server) *worker {
	return &worker{srv: s, wake: make(chan struct{}, 1)}
}

// enqueue runs job on the worker goroutine, after the jobs queued before it.
func (w *worker) enqueue(job func(ctx context.Context)) {
	w.mu.Lock()
	w.jobs = append(w.jobs, job)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *worker) loop() {
	defer w.srv.wg.Done()
	for {
		select {
		case <-w.srv.stop:
			return
		case <-w.wake:
		}
		w.mu.Lock()
		jobs := w.jobs
		w.jobs = nil
		w.mu.Unlock()
		for _, job := range jobs {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			job(ctx)
			cancel()
		}
	}
}
