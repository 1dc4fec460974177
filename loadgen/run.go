package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/greendot/greendot/client"
)

// driver runs a scenario's steps against its workers.
type driver struct {
	o       *Options
	name    string
	workers []workerConn
	hc      *http.Client // API and metrics
	res     *Result
	start   time.Time

	status atomic.Pointer[func() string] // what the progress line shows after the counters
}

var drivers = map[string]func(context.Context, *driver) error{
	"idle":      driveIdle,
	"heartbeat": driveHeartbeat,
	"fanout":    driveFanout,
	"churn":     driveChurn,
	"expiry":    driveExpiry,
	"storm":     driveStorm,
	"largeteam": driveLargeTeam,
}

// Run runs one scenario against the targets and returns its figures. On
// error the Result holds what was measured until then.
func Run(ctx context.Context, scenario string, o Options) (*Result, error) {
	o, err := o.withDefaults(scenario)
	if err != nil {
		return nil, err
	}
	if o.Procs > 1 && o.Spawn == nil && !o.pipeWorkers {
		return nil, errors.New("loadgen: more than one process needs Options.Spawn")
	}
	ctx, cancel := context.WithTimeout(ctx, o.MaxTime)
	defer cancel()
	d := &driver{
		o:     &o,
		name:  scenario,
		hc:    &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}},
		res:   newResult(scenario, &o),
		start: time.Now(),
	}
	defer d.hc.CloseIdleConnections()
	d.setStatus("starting")
	for _, t := range o.Targets {
		if o.Peer {
			break // a peer has no /healthz: the dials tell
		}
		if err := d.healthy(ctx, t); err != nil {
			return d.res, err
		}
	}
	if err := d.startWorkers(ctx); err != nil {
		return d.res, err
	}
	stopProgress := d.progressLoop()
	err = drivers[scenario](ctx, d)
	stopProgress()
	sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
	defer scancel()
	var wg sync.WaitGroup
	for _, w := range d.workers {
		wg.Go(func() { _ = w.shutdown(sctx) })
	}
	wg.Wait()
	d.res.Elapsed = time.Since(d.start)
	if err == nil && ctx.Err() != nil {
		err = fmt.Errorf("loadgen: the run hit its time bound (%v)", o.MaxTime)
	}
	return d.res, err
}

func (d *driver) healthy(ctx context.Context, target string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, httpBase(target)+"/healthz", nil)
	resp, err := d.hc.Do(req)
	if err != nil {
		return fmt.Errorf("loadgen: %s is not answering: %w", target, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("loadgen: %s/healthz: %s", httpBase(target), resp.Status)
	}
	return nil
}

func (d *driver) startWorkers(ctx context.Context) error {
	o := d.o
	if o.Procs == 1 {
		env := newEnv(o, 0, 1)
		d.workers = []workerConn{&localWorker{env: env, h: newHandlers[d.name](env)}}
		return nil
	}
	for i := range o.Procs {
		name := fmt.Sprintf("worker %d/%d", i, o.Procs)
		if o.pipeWorkers {
			inR, inW := io.Pipe()
			outR, outW := io.Pipe()
			done := make(chan error, 1)
			wctx, wcancel := context.WithCancel(context.Background())
			go func() {
				err := ServeWorker(wctx, d.name, *o, i, o.Procs, inR, outW)
				outW.Close()
				done <- err
			}()
			wait := func() error { err := <-done; wcancel(); return err }
			d.workers = append(d.workers, newRemoteWorker(name, inW, outR, wait, wcancel))
			continue
		}
		cmd := o.Spawn([]string{"--worker", fmt.Sprintf("%d/%d", i, o.Procs), "--run-id", o.RunID})
		in, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("loadgen: start %s: %w", name, err)
		}
		kill := func() { _ = cmd.Process.Kill() }
		d.workers = append(d.workers, newRemoteWorker(name, in, out, cmd.Wait, kill))
	}
	return ctx.Err()
}

// callAll runs op on every worker at once and decodes each reply.
func callAll[T any](ctx context.Context, d *driver, op string, args any) ([]T, error) {
	out := make([]T, len(d.workers))
	errs := make([]error, len(d.workers))
	var wg sync.WaitGroup
	for i, w := range d.workers {
		wg.Go(func() {
			raw, err := w.call(ctx, op, args)
			if err == nil {
				err = json.Unmarshal(raw, &out[i])
			}
			errs[i] = err
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// connect asks every worker to dial its members and reports the figures
// every scenario shares.
func (d *driver) connect(ctx context.Context, what string, args any) (connectReply, error) {
	total := d.o.N
	d.setStatusf(func(p Progress) string { return fmt.Sprintf("connecting %s %d/%d", what, p.Dials, total) })
	start := time.Now()
	replies, err := callAll[connectReply](ctx, d, "connect", args)
	elapsed := time.Since(start)
	var r connectReply
	for _, x := range replies {
		r.merge(x)
	}
	if err != nil {
		return r, err
	}
	d.res.add("connected", "connections made", float64(r.Dialed), "")
	d.res.add("connect_failed", "connections failed", float64(r.Failed), "")
	d.res.add("connect_rate", "connect rate", float64(r.Dialed)/elapsed.Seconds(), "/s")
	d.res.addDur("connect_p50", "connect time p50", r.Latency.Quantile(0.5))
	d.res.addDur("connect_p99", "connect time p99", r.Latency.Quantile(0.99))
	if r.Failed > 0 {
		d.res.note("%d connections failed; the first: %s", r.Failed, r.Err)
	}
	if r.Dialed == 0 {
		return r, fmt.Errorf("loadgen: no connection could be made: %s", r.Err)
	}
	return r, nil
}

// scrape reads and adds up /metrics of every target, with the CPU and RSS
// of Options.ServerPIDs in place of theirs. A peer's Sample holds only
// what /proc gave: the figures of the series it lacks are left out.
func (d *driver) scrape(ctx context.Context) (Sample, error) {
	s := Sample{}
	if !d.o.Peer {
		var err error
		if s, err = scrape(ctx, d.hc, d.o.Targets); err != nil {
			return nil, err
		}
	}
	if len(d.o.ServerPIDs) > 0 {
		p, err := procSample(d.o.ServerPIDs)
		if err != nil {
			return nil, err
		}
		maps.Copy(s, p)
	}
	return s, nil
}

// waitConns waits until the servers count at least want connections (the
// gauge is refreshed at each sweep), for at most limit.
// connectAndWait has the workers connect their clients and waits until the
// servers count them all. On success the caller defers closeWorkers.
func (d *driver) connectAndWait(ctx context.Context, what string, args any) (connectReply, error) {
	r, err := d.connect(ctx, what, args)
	if err != nil {
		return r, err
	}
	if err := d.waitConns(ctx, r.Dialed, time.Minute); err != nil {
		closeWorkers(ctx, d)
		return r, err
	}
	return r, nil
}

// settle waits for the connect fan-out to drain and scrapes the servers: the
// starting point of a measurement.
func (d *driver) settle(ctx context.Context, limit time.Duration) (Sample, error) {
	d.setStatus("waiting for the connect fan-out to drain")
	d.waitQuiet(ctx, limit)
	return d.scrape(ctx)
}

func (d *driver) waitConns(ctx context.Context, want int, limit time.Duration) error {
	d.setStatus(fmt.Sprintf("waiting for the servers to count %d connections", want))
	deadline := time.Now().Add(limit)
	for {
		s, err := d.scrape(ctx)
		if err != nil {
			return err
		}
		if d.o.Peer {
			// A Pusher socket is dialed once subscribed: the live ones are
			// what the peer holds.
			s[mConns] = float64(d.progress().Conns)
		}
		// A light or Pusher socket the server closed does not come back
		// (a client reconnects): it is reported, not waited for.
		if int(s.Get(mConns)) >= want-int(d.progress().Drops) {
			return nil
		}
		if time.Now().After(deadline) {
			err := fmt.Errorf("loadgen: the servers count %d connections after %v, want %d", int(s.Get(mConns)), limit, want)
			if p := d.progress(); p.Drops > 0 {
				err = fmt.Errorf("%w; %d connections were closed under the load generator, the first: %s", err, p.Drops, p.DropReason)
			}
			return err
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// waitQuiet waits until the servers' deliveries counter, and their Pusher
// member events, stop moving for a second, for at most limit: the connect
// phase's fan-out has drained.
func (d *driver) waitQuiet(ctx context.Context, limit time.Duration) {
	deadline := time.Now().Add(limit)
	last, still := -1.0, 0
	for time.Now().Before(deadline) && still < 5 {
		s, err := d.scrape(ctx)
		if err != nil {
			return
		}
		v := s.Get(mDeliveries) + s.Sum(mPusherEvents)
		if d.o.Peer {
			v = float64(d.progress().Changes) // the member events the sockets got
		}
		if v == last {
			still++
		} else {
			last, still = v, 0
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return
		}
	}
}

// setupTeams puts each user in a team through the HTTP API of the first
// target, 16 requests at a time; nothing on a peer.
func (d *driver) setupTeams(ctx context.Context, pairs [][2]string) error {
	if d.o.Peer {
		return nil // on a peer, subscribing to presence-{team} is membership
	}
	var done atomic.Int64
	total := len(pairs)
	d.setStatus(func() string { return fmt.Sprintf("teams %d/%d", done.Load(), total) })
	base := httpBase(d.o.Targets[0])
	jobs := make(chan [2]string)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for p := range jobs {
				if err := d.putMember(ctx, base, p[0], p[1]); err != nil {
					errs <- err
					return
				}
				done.Add(1)
			}
		})
	}
	var err error
feed:
	for _, p := range pairs {
		select {
		case jobs <- p:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(jobs)
	go func() { wg.Wait(); close(errs) }()
	for e := range errs {
		err = errors.Join(err, e)
	}
	return err
}

func (d *driver) putMember(ctx context.Context, base, team, user string) error {
	u := base + "/v1/teams/" + url.PathEscape(team) + "/members/" + url.PathEscape(user)
	var last error
	for attempt := range 3 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, u, nil)
		if d.o.APIKey != "" {
			req.Header.Set("Authorization", "Bearer "+d.o.APIKey)
		}
		resp, err := d.hc.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusNoContent:
				return nil
			case resp.StatusCode == http.StatusUnauthorized:
				return errors.New("loadgen: the HTTP API refused the API key (set --api-key)")
			}
			err = fmt.Errorf("PUT %s: %s", u, resp.Status)
		}
		last = err
		if !sleepCtx(ctx, time.Duration(100<<attempt)*time.Millisecond) {
			break
		}
	}
	return fmt.Errorf("loadgen: team setup: %w", last)
}

// samplers are a few extra connections that measure heartbeat round trips
// while the rest of the load runs. They send no automatic heartbeats: their
// pings (every 100ms, under the server's rate limit) keep them alive.
type samplers struct {
	cs       []*client.Client
	rtt      syncHist
	timeouts atomic.Int64
	stop     chan struct{}
	wg       sync.WaitGroup
}

func (d *driver) startSamplers(ctx context.Context) (*samplers, error) {
	s := &samplers{stop: make(chan struct{})}
	ctr := &counters{}
	dl := newDialer(d.o, ctr)
	defer dl.closeIdle()
	for i := range d.o.Samplers {
		m := &member{user: fmt.Sprintf("%s-s%d", d.o.RunID, i), device: "web", target: i % len(d.o.Targets)}
		// Automatic heartbeats stay on: a sampler waits silent between its
		// dial and the measured window, longer than a short ttl.
		co := dl.options(m)
		c, err := dl.dial(ctx, m, co)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("loadgen: sampler: %w", err)
		}
		s.cs = append(s.cs, c)
	}
	return s, nil
}

// run pings from every sampler every 100ms until pause or close.
func (s *samplers) run(ctx context.Context) {
	for _, c := range s.cs {
		s.wg.Go(func() {
			for {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				rtt, err := c.Ping(pctx)
				cancel()
				if err != nil {
					rtt = 2 * time.Second
					s.timeouts.Add(1)
				}
				s.rtt.Record(rtt)
				select {
				case <-s.stop:
					return
				case <-ctx.Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		})
	}
}

func (s *samplers) close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.wg.Wait()
	for _, c := range s.cs {
		_ = c.Close()
	}
}

func (d *driver) setStatus(f any) {
	var fn func() string
	switch f := f.(type) {
	case string:
		fn = func() string { return f }
	case func() string:
		fn = f
	}
	d.status.Store(&fn)
}

// setStatusf shows a status computed from the workers' counters.
func (d *driver) setStatusf(f func(Progress) string) {
	d.setStatus(func() string { return f(d.progress()) })
}

func (d *driver) progress() Progress {
	var p Progress
	for _, w := range d.workers {
		p.add(w.progress())
	}
	return p
}

// progressLoop writes the progress line: redrawn in place twice a second
// on a terminal, else one line every 5s. The returned func stops it.
func (d *driver) progressLoop() func() {
	w := d.o.Progress
	if w == nil {
		return func() {}
	}
	tty := false
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	every := 5 * time.Second
	if tty {
		every = 500 * time.Millisecond
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				if tty {
					fmt.Fprint(w, "\r\x1b[K")
				}
				return
			case <-t.C:
			}
			p := d.progress()
			line := fmt.Sprintf("%s %5.0fs · %s · conns %d · changes %d", d.name, time.Since(d.start).Seconds(),
				(*d.status.Load())(), p.Conns, p.Changes)
			if p.DialErrs > 0 {
				line += fmt.Sprintf(" · dial errors %d", p.DialErrs)
			}
			if tty {
				fmt.Fprint(w, "\r\x1b[K"+line)
			} else {
				fmt.Fprintln(w, line)
			}
		}
	}()
	return func() { close(stop); <-done }
}

// sleepStatus sleeps d (bounded by ctx) showing a countdown.
func (d *driver) sleepStatus(ctx context.Context, what string, dur time.Duration) bool {
	end := time.Now().Add(dur)
	d.setStatus(func() string {
		return fmt.Sprintf("%s %.0fs left", what, max(time.Until(end), 0).Seconds())
	})
	return sleepCtx(ctx, dur)
}

func joinTargets(ts []string) string { return strings.Join(ts, ",") }
