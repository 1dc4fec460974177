package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// Source is where events wait until delivered. Take hands this node events
// to deliver; they stay in the Source, held by this node, until Done. A
// shared Source (Redis) gives the events of a node that stopped renewing
// its hold (Keep) to another node. A Source that drops events when full
// reports them in Event.Dropped (Redis) or through a TakeDropped() int
// method (MemQueue, whose drops may come with no event to carry them).
type Source interface {
	// Take returns up to n events to deliver; none is a fine answer.
	Take(ctx context.Context, n int) ([]*Event, error)
	// Ready is signalled when Take may have more; nil: poll.
	Ready() <-chan struct{}
	// Keep renews this node's hold on events it still retries, and returns
	// those it no longer holds (taken over by another node, or dropped).
	Keep(ctx context.Context, evs []*Event) (lost []*Event, err error)
	// Done removes events delivered or given up.
	Done(ctx context.Context, evs []*Event) error
	// Stats counts the events not delivered yet (taken or not) and tells
	// when the oldest of them was published (zero when none).
	Stats(ctx context.Context) (depth int, oldest time.Time, err error)
}

// Preparer is implemented by Sources that complete an event before its
// first attempt (the Redis store's Pusher queue sets Event.Occupied and
// Vacated). Prepare must give the same answer for the same event every
// time it is asked, from any node, so that every attempt sends the same
// body; an error fails the attempt, which is retried.
type Preparer interface {
	Prepare(ctx context.Context, ev *Event) error
}

// prepareError is an attempt that failed in Prepare, before any request.
type prepareError struct{ err error }

func (e prepareError) Error() string { return "preparing the event: " + e.err.Error() }
func (e prepareError) Unwrap() error { return e.err }

// Config configures a Sender.
type Config struct {
	URL    string // required: http or https
	Secret Secret // required, unless Format is set
	// Format writes and signs the requests; nil: Standard Webhooks,
	// signed with Secret.
	Format Format
	// Timeout bounds one attempt; a receiver that has not answered by
	// then failed it. 10s.
	Timeout time.Duration
	// RetryFor: an event still undelivered this long after its change is
	// dropped (counted, logged). 24h.
	RetryFor time.Duration
	// Concurrency bounds the requests in flight. 16.
	Concurrency int
	// Window bounds the events this node holds (taken, not done). 1024.
	Window int
	// MinBackoff and MaxBackoff: the n-th retry waits a random time in
	// [d/2, d] for d = MinBackoff·2^(n-1), at most MaxBackoff. 1s, 1m.
	MinBackoff, MaxBackoff time.Duration
	// Poll: how often a Source without Ready is asked for more. 200ms.
	Poll time.Duration
	// KeepEvery: how often held events are renewed (Source.Keep). 1s.
	KeepEvery time.Duration
	// StatsEvery: how often the queue gauges are read. 2s.
	StatsEvery time.Duration
	Client     *http.Client // its Timeout is left alone; Timeout above applies
	Logger     *slog.Logger
	Metrics    *Metrics // NewMetrics when nil
}

// Sender delivers a Source's events. Start it, then Stop it once.
type Sender struct {
	cfg  Config
	src  Source
	log  *slog.Logger
	m    *Metrics
	drop dropLog
	warn errLog

	cancel context.CancelFunc
	done   chan struct{}
}

// NewSender checks cfg and returns a Sender for src.
func NewSender(cfg Config, src Source) (*Sender, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("webhook url %q: want an absolute http or https URL", cfg.URL)
	}
	if cfg.Format == nil {
		if len(cfg.Secret) == 0 {
			return nil, errors.New("webhooks need a secret (whsec_<base64>)")
		}
		cfg.Format = standard{key: cfg.Secret}
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.Timeout, 10*time.Second)
	def(&cfg.RetryFor, 24*time.Hour)
	def(&cfg.MinBackoff, time.Second)
	def(&cfg.MaxBackoff, time.Minute)
	def(&cfg.Poll, 200*time.Millisecond)
	def(&cfg.KeepEvery, time.Second)
	def(&cfg.StatsEvery, 2*time.Second)
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	if cfg.Window <= 0 {
		cfg.Window = 1024
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse // a redirect is an answer, not a 2xx
		}}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	return &Sender{cfg: cfg, src: src, log: cfg.Logger, m: cfg.Metrics, drop: dropLog{log: cfg.Logger},
		warn: errLog{log: cfg.Logger}}, nil
}

// Metrics are the Sender's collectors.
func (s *Sender) Metrics() *Metrics { return s.m }

// Start runs the dispatcher and its workers until Stop.
func (s *Sender) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan struct{})
	go func() {
		defer close(s.done)
		s.run(ctx)
	}()
}

// Stop ends delivery: requests in flight are abandoned, and their events
// stay in the Source (on Redis, for another node or the next start).
func (s *Sender) Stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	<-s.done
}

// Drain waits until the Source has nothing left to deliver, or ctx ends.
func (s *Sender) Drain(ctx context.Context) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if depth, _, err := s.src.Stats(ctx); err == nil && depth == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// item is an event this node holds.
type item struct {
	ev       *Event
	body     []byte // once prepared: the same on every attempt
	attempts int
	due      time.Time
	inflight bool
}

type result struct {
	it      *item
	outcome string // an attempts_total result label
	status  int
	err     error
}

// run is the dispatcher: it holds at most Window events, keeps each user's
// in order (only the oldest one held is in flight or waiting to retry, so
// one node delivers a user's changes in version order), and hands due
// events to Concurrency workers.
func (s *Sender) run(ctx context.Context) {
	jobs := make(chan *item, s.cfg.Concurrency)
	results := make(chan result, s.cfg.Concurrency)
	var wg sync.WaitGroup
	for range s.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range jobs {
				results <- s.attempt(ctx, it)
			}
		}()
	}
	defer func() {
		close(jobs)
		wg.Wait()
	}()

	byUser := map[string][]*item{}
	held, inflight := 0, 0
	var done []*Event
	remove := func(it *item) {
		q := byUser[it.ev.UserID]
		for i, x := range q {
			if x == it {
				q = append(q[:i], q[i+1:]...)
				break
			}
		}
		if len(q) == 0 {
			delete(byUser, it.ev.UserID)
		} else {
			byUser[it.ev.UserID] = q
		}
		held--
	}
	nextKeep := time.Now().Add(s.cfg.KeepEvery)
	nextStats, nextTake := time.Now(), time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		now := time.Now()
		if held < s.cfg.Window && !now.Before(nextTake) {
			nextTake = now.Add(s.cfg.Poll)
			evs, err := s.src.Take(ctx, s.cfg.Window-held)
			if len(evs) > 0 {
				nextTake = now // there may be more: ask again at once
			}
			if err != nil && ctx.Err() == nil {
				s.warn.note("webhooks: cannot read the queue", err)
			}
			dropped := 0
			if d, ok := s.src.(interface{ TakeDropped() int }); ok {
				dropped = d.TakeDropped()
			}
			for _, ev := range evs {
				dropped += ev.Dropped
			}
			if dropped > 0 {
				s.m.deliveries.WithLabelValues("overflow").Add(float64(dropped))
				s.drop.note(dropped, "the queue was full (--webhook-queue)")
			}
			for _, ev := range evs {
				if s.cfg.Format.Body(ev) == nil {
					// Nothing to send in this format: done, and not counted
					// as delivered, since no request was made.
					done = append(done, ev)
					continue
				}
				byUser[ev.UserID] = append(byUser[ev.UserID], &item{ev: ev, due: now})
				held++
			}
		}
		if !now.Before(nextKeep) {
			nextKeep = now.Add(s.cfg.KeepEvery)
			var evs []*Event
			refs := map[*Event]*item{}
			for _, q := range byUser {
				for _, it := range q {
					evs = append(evs, it.ev)
					refs[it.ev] = it
				}
			}
			if len(evs) > 0 {
				lost, err := s.src.Keep(ctx, evs)
				if err != nil && ctx.Err() == nil {
					s.warn.note("webhooks: cannot renew held events", err)
				}
				for _, ev := range lost {
					// Another node has it now; one in flight finishes, and
					// may be delivered twice (at least once).
					if it := refs[ev]; it != nil && !it.inflight {
						remove(it)
					}
				}
			}
		}
		if !now.Before(nextStats) {
			nextStats = now.Add(s.cfg.StatsEvery)
			if depth, oldest, err := s.src.Stats(ctx); err == nil {
				s.m.depth.Set(float64(depth))
				age := 0.0
				if !oldest.IsZero() {
					age = max(0, now.Sub(oldest).Seconds())
				}
				s.m.oldest.Set(age)
			}
		}
		wake := now.Add(s.cfg.Poll)
		if held < s.cfg.Window {
			wake = earliest(wake, nextTake)
		}
		for _, q := range byUser {
			it := q[0]
			if it.inflight {
				continue
			}
			if it.due.After(now) {
				if it.due.Before(wake) {
					wake = it.due
				}
				continue
			}
			if inflight < s.cfg.Concurrency {
				it.inflight = true
				inflight++
				jobs <- it // never blocks: at most Concurrency in flight
			}
		}
		wake = earliest(wake, nextKeep, nextStats)
		timer.Reset(max(0, time.Until(wake)))
		select {
		case <-ctx.Done():
			return
		case r := <-results:
			inflight--
			done = s.settle(r, time.Now(), done, remove)
		drain:
			for {
				select {
				case r := <-results:
					inflight--
					done = s.settle(r, time.Now(), done, remove)
				default:
					break drain
				}
			}
		case <-s.src.Ready():
			nextTake = time.Now()
		case <-timer.C:
		}
		if len(done) > 0 {
			if err := s.src.Done(ctx, done); err != nil && ctx.Err() == nil {
				s.warn.note("webhooks: cannot remove delivered events from the queue", err)
			}
			done = done[:0]
		}
	}
}

// settle applies an attempt's result; it returns done with the event added
// when the event is finished (delivered or dropped).
func (s *Sender) settle(r result, now time.Time, done []*Event, remove func(*item)) []*Event {
	it := r.it
	it.inflight = false
	s.m.attempts.WithLabelValues(r.outcome).Inc()
	if pe, ok := r.err.(prepareError); ok {
		// Not the receiver's doing: the store could not complete the event.
		s.warn.note("webhooks: cannot prepare an event (retried)", pe.err)
	}
	if r.outcome == "success" {
		s.m.deliveries.WithLabelValues("delivered").Inc()
		remove(it)
		return append(done, it.ev)
	}
	it.attempts++
	wait := s.backoff(it.attempts)
	if now.Add(wait).Sub(it.ev.At) > s.cfg.RetryFor {
		s.m.deliveries.WithLabelValues("expired").Inc()
		s.drop.note(1, "undelivered for --webhook-retry-for", "id", it.ev.ID(), "user_id", it.ev.UserID,
			"version", it.ev.Version, "attempts", it.attempts, "last_status", r.status, "last_err", errString(r.err))
		remove(it)
		return append(done, it.ev)
	}
	s.m.retries.Inc()
	s.log.Debug("webhook attempt failed", "id", it.ev.ID(), "status", r.status, "err", r.err, "retry_in", wait)
	it.due = now.Add(wait)
	return done
}

// backoff is the wait before retry n (from 1): exponential, capped, with
// jitter so that many events failed at once do not retry in step.
func (s *Sender) backoff(n int) time.Duration {
	d := s.cfg.MaxBackoff
	if n < 32 {
		d = min(d, s.cfg.MinBackoff<<(n-1))
	}
	if d <= 0 {
		d = s.cfg.MaxBackoff
	}
	return d/2 + rand.N(d/2+1)
}

// attempt makes one request.
func (s *Sender) attempt(ctx context.Context, it *item) result {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	if it.body == nil {
		if p, ok := s.src.(Preparer); ok {
			if err := p.Prepare(ctx, it.ev); err != nil {
				return result{it: it, outcome: "error", err: prepareError{err}}
			}
		}
		it.body = s.cfg.Format.Body(it.ev)
	}
	body := it.body
	now := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return result{it: it, outcome: "error", err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "greendot-webhooks")
	s.cfg.Format.Sign(req.Header, it.ev, body, now)
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return result{it: it, outcome: "timeout", err: err}
		}
		return result{it: it, outcome: "error", err: err}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return result{it: it, outcome: "success", status: resp.StatusCode}
	}
	return result{it: it, outcome: "non_2xx", status: resp.StatusCode}
}

func earliest(t time.Time, more ...time.Time) time.Time {
	for _, u := range more {
		if u.Before(t) {
			t = u
		}
	}
	return t
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// dropLog logs dropped events: the first of each second in full, the rest
// summed into the next line, so an outage does not flood the log.
type dropLog struct {
	log   *slog.Logger
	mu    sync.Mutex
	last  time.Time
	quiet int
}

func (d *dropLog) note(n int, why string, attrs ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	if now.Sub(d.last) < time.Second {
		d.quiet += n
		return
	}
	d.last = now
	attrs = append([]any{"events", n + d.quiet, "reason", why}, attrs...)
	d.quiet = 0
	d.log.Warn("webhooks dropped", attrs...)
}

// errLog logs the queue's errors (Redis away) at most every 30 s each, so
// an outage of the queue says so without a line per poll.
type errLog struct {
	log  *slog.Logger
	last map[string]time.Time
}

func (e *errLog) note(msg string, err error) {
	if e.last == nil {
		e.last = map[string]time.Time{}
	}
	if now := time.Now(); now.Sub(e.last[msg]) >= 30*time.Second {
		e.last[msg] = now
		e.log.Warn(msg, "err", err)
	}
}
