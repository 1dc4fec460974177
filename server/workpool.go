package server

import "sync"

// workPool runs nbio's frame handlers on long-lived goroutines. nbio's
// default starts a goroutine for nearly every frame, and growing each new
// goroutine's stack was a fifth of the server's CPU under heartbeat load.
// nbio keeps the frames of one connection in order itself; the pool only
// supplies goroutines. It never blocks the poller: when every worker is busy
// and the queue is full, a job gets a goroutine of its own, as before.
type workPool struct {
	jobs chan func() // never closed: nbio may still submit during shutdown
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

func newWorkPool(workers, queue int) *workPool {
	p := &workPool{jobs: make(chan func(), queue), stop: make(chan struct{})}
	p.wg.Add(workers)
	for i := 0; i < workers; i++ {
		go p.work()
	}
	return p
}

func (p *workPool) work() {
	defer p.wg.Done()
	for {
		select {
		case f := <-p.jobs:
			f()
		case <-p.stop:
			for { // run what is queued, then leave
				select {
				case f := <-p.jobs:
					f()
				default:
					return
				}
			}
		}
	}
}

// execute is nbio's ServerExecutor.
func (p *workPool) execute(f func()) {
	select {
	case <-p.stop:
		go f()
		return
	default:
	}
	select {
	case p.jobs <- f:
	default:
		go f()
	}
}

// close stops the workers after they ran what was queued, and waits.
func (p *workPool) close() {
	p.once.Do(func() { close(p.stop) })
	p.wg.Wait()
}
