package loadgen

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Progress is a worker's running counters, shown on the progress line.
type Progress struct {
	Conns    int64 `json:"conns"`     // connections up now
	Dials    int64 `json:"dials"`     // successful dials
	DialErrs int64 `json:"dial_errs"` // dials that failed after retries
	Changes  int64 `json:"changes"`   // presence changes received (snapshots excluded)
	Pings    int64 `json:"pings"`     // heartbeat round trips measured
	// Pusher sockets the load generator did not close that ended, and why
	// the first did.
	Drops      int64  `json:"drops,omitempty"`
	DropReason string `json:"drop_reason,omitempty"`
}

func (p *Progress) add(o Progress) {
	p.Conns += o.Conns
	p.Dials += o.Dials
	p.DialErrs += o.DialErrs
	p.Changes += o.Changes
	p.Pings += o.Pings
	p.Drops += o.Drops
	if p.DropReason == "" {
		p.DropReason = o.DropReason
	}
}

type counters struct {
	conns, dials, dialErrs, changes, pings, drops atomic.Int64
	dropReason                                    atomic.Pointer[string] // the first drop's
}

func (c *counters) progress() Progress {
	p := Progress{Conns: c.conns.Load(), Dials: c.dials.Load(), DialErrs: c.dialErrs.Load(),
		Changes: c.changes.Load(), Pings: c.pings.Load(), Drops: c.drops.Load()}
	if r := c.dropReason.Load(); r != nil {
		p.DropReason = *r
	}
	return p
}

// drop counts a connection that ended under the load generator's feet.
func (c *counters) drop(reason string) {
	c.drops.Add(1)
	c.dropReason.CompareAndSwap(nil, &reason)
}

// handler is a scenario's worker side: it holds the worker's connections
// and answers the driver's operations, one at a time.
type handler interface {
	handle(ctx context.Context, op string, args json.RawMessage) (any, error)
	close() // closes every connection; called once, last
}

// workerEnv is what a handler is made from.
type workerEnv struct {
	o            *Options
	index, count int
	ctr          *counters
	dial         *dialer
}

var newHandlers = map[string]func(*workerEnv) handler{
	"idle":      newIdleWorker,
	"heartbeat": newIdleWorker, // the same connections; the rate differs
	"fanout":    newFanoutWorker,
	"churn":     newChurnWorker,
	"expiry":    newExpiryWorker,
	"storm":     newStormWorker,
	"largeteam": newFanoutWorker, // the members: one team, nothing measured on them
}

func newEnv(o *Options, index, count int) *workerEnv {
	ctr := &counters{}
	return &workerEnv{o: o, index: index, count: count, ctr: ctr, dial: newDialer(o, ctr)}
}

// workerConn is the driver's end of a worker.
type workerConn interface {
	call(ctx context.Context, op string, args any) (json.RawMessage, error)
	progress() Progress
	shutdown(ctx context.Context) error
}

// localWorker runs a handler in the driver's process. Arguments and
// results go through JSON as they would to a child, so both paths agree.
type localWorker struct {
	env *workerEnv
	h   handler
}

func (l *localWorker) call(ctx context.Context, op string, args any) (json.RawMessage, error) {
	raw, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	res, err := l.h.handle(ctx, op, raw)
	if err != nil {
		return nil, err
	}
	return json.Marshal(res)
}

func (l *localWorker) progress() Progress { return l.env.ctr.progress() }

func (l *localWorker) shutdown(context.Context) error {
	l.h.close()
	l.env.dial.closeIdle()
	return nil
}

// The wire between driver and a worker process: one JSON object per line,
// requests on the worker's stdin, responses and progress on its stdout.
type request struct {
	ID   int             `json:"id"`
	Op   string          `json:"op"`
	Args json.RawMessage `json:"args,omitempty"`
}

type response struct {
	ID       int             `json:"id,omitempty"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    string          `json:"error,omitempty"`
	Progress *Progress       `json:"progress,omitempty"`
}

// remoteWorker is a worker in another process (or, in tests, goroutine).
type remoteWorker struct {
	name string
	in   io.WriteCloser // the worker's stdin

	mu      sync.Mutex
	nextID  int
	pending map[int]chan response // guarded by mu

	prog    atomic.Pointer[Progress]
	done    chan struct{} // closed when the worker's output ends
	readErr error         // set before done is closed
	wait    func() error  // waits for the worker to exit
	kill    func()        // ends it at once
}

func newRemoteWorker(name string, in io.WriteCloser, out io.Reader, wait func() error, kill func()) *remoteWorker {
	w := &remoteWorker{name: name, in: in, pending: map[int]chan response{}, done: make(chan struct{}), wait: wait, kill: kill}
	w.prog.Store(&Progress{})
	go w.read(out)
	return w
}

func (w *remoteWorker) read(out io.Reader) {
	defer close(w.done)
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 256<<20)
	for sc.Scan() {
		var r response
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			w.readErr = fmt.Errorf("loadgen: %s sent %q: %w", w.name, truncate(sc.Text(), 80), err)
			return
		}
		if r.Progress != nil {
			w.prog.Store(r.Progress)
			continue
		}
		w.mu.Lock()
		ch := w.pending[r.ID]
		delete(w.pending, r.ID)
		w.mu.Unlock()
		if ch != nil {
			ch <- r // capacity 1
		}
	}
	w.readErr = sc.Err()
	if w.readErr == nil {
		w.readErr = fmt.Errorf("loadgen: %s exited", w.name)
	}
}

func (w *remoteWorker) call(ctx context.Context, op string, args any) (json.RawMessage, error) {
	raw, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	ch := make(chan response, 1)
	w.mu.Lock()
	w.nextID++
	id := w.nextID
	w.pending[id] = ch
	line, _ := json.Marshal(request{ID: id, Op: op, Args: raw})
	_, err = w.in.Write(append(line, '\n'))
	w.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("loadgen: %s: %w", w.name, err)
	}
	select {
	case r := <-ch:
		if r.Error != "" {
			return nil, fmt.Errorf("%s: %s", w.name, r.Error)
		}
		return r.Result, nil
	case <-w.done:
		return nil, w.readErr
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (w *remoteWorker) progress() Progress { return *w.prog.Load() }

// shutdown closes the worker's stdin, which makes it close its
// connections and exit, and waits for that; past ctx it is killed.
func (w *remoteWorker) shutdown(ctx context.Context) error {
	_ = w.in.Close()
	exited := make(chan error, 1)
	go func() { exited <- w.wait() }()
	select {
	case err := <-exited:
		return err
	case <-ctx.Done():
		w.kill()
		return errors.Join(ctx.Err(), <-exited)
	}
}

// ServeWorker runs worker index (of count) of a run in this process,
// reading the driver's requests from in and answering on out, until in
// ends. o must be the driver's Options, RunID included.
func ServeWorker(ctx context.Context, scenario string, o Options, index, count int, in io.Reader, out io.Writer) error {
	o, err := o.withDefaults(scenario)
	if err != nil {
		return err
	}
	if count < 1 || index < 0 || index >= count {
		return fmt.Errorf("loadgen: worker %d/%d", index, count)
	}
	return serveWith(ctx, &o, scenario, index, count, in, out)
}

// serveWith serves the handler of scenario until in ends.
func serveWith(ctx context.Context, o *Options, scenario string, index, count int, in io.Reader, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	env := newEnv(o, index, count)
	h := newHandlers[scenario](env)
	defer env.dial.closeIdle()
	defer h.close()

	var outMu sync.Mutex
	send := func(r response) {
		line, _ := json.Marshal(r)
		outMu.Lock()
		_, _ = out.Write(append(line, '\n'))
		outMu.Unlock()
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { // progress, four times a second
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				p := env.ctr.progress()
				send(response{Progress: &p})
			}
		}
	})
	reqs := make(chan request) // closed when in ends
	wg.Go(func() {
		defer close(reqs)
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			var r request
			if json.Unmarshal(sc.Bytes(), &r) != nil {
				continue
			}
			select {
			case reqs <- r:
			case <-ctx.Done():
				return
			}
		}
		cancel() // the driver is gone: stop whatever runs
	})
	for r := range reqs {
		res, err := h.handle(ctx, r.Op, r.Args)
		resp := response{ID: r.ID}
		if err != nil {
			resp.Error = err.Error()
		} else if resp.Result, err = json.Marshal(res); err != nil {
			resp.Error = err.Error()
		}
		send(resp)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
