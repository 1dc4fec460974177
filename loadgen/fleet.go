package loadgen

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/client"
)

// member is one connection of the run: a user's device on a node.
type member struct {
	idx    int // the user's index in the run
	user   string
	device string
	team   int // team index
	target int // index into Options.Targets

	c    *client.Client // owned by the scenario; nil while not dialled
	px   *pxSocket      // instead of c, for Protocol "pusher"
	lt   *lightSocket   // instead of c, for idle's members that are not sampled viewers
	up   atomic.Bool    // counted in counters.conns
	kill *killSwitch    // set when the scenario cuts its TCP connections
}

// dialer makes the run's clients.
type dialer struct {
	o   *Options
	ctr *counters
	hc  *http.Client // handshakes of clients without a kill switch
}

func newDialer(o *Options, ctr *counters) *dialer {
	return &dialer{o: o, ctr: ctr, hc: &http.Client{Transport: &http.Transport{
		DialContext:       (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		DisableKeepAlives: true, // every handshake becomes a WebSocket: nothing to reuse
	}}}
}

func (d *dialer) closeIdle() { d.hc.CloseIdleConnections() }

// options returns the client options for m: identity, counters, and what
// the load generator needs (no Changes queue worth the name, quick dials).
func (d *dialer) options(m *member) client.Options {
	co := client.Options{
		Device:         m.device,
		DisableChanges: true, // nobody reads Changes: OnChange sees everything
		DialTimeout:    15 * time.Second,
		HTTPClient:     d.hc,
		OnStateChange: func(sc client.StateChange) {
			if sc.State == client.Connected {
				if m.up.CompareAndSwap(false, true) {
					d.ctr.conns.Add(1)
				}
			} else if m.up.CompareAndSwap(true, false) {
				d.ctr.conns.Add(-1)
			}
		},
	}
	if m.kill != nil {
		co.HTTPClient = &http.Client{Transport: &http.Transport{DialContext: m.kill.dialContext, DisableKeepAlives: true}}
	}
	if d.o.JWTSecret != "" {
		user, secret, ttl := m.user, d.o.JWTSecret, d.o.MaxTime+time.Hour
		co.TokenFunc = func(context.Context) (string, error) { return signToken(secret, user, ttl) }
	} else {
		co.User = m.user
	}
	return co
}

// signToken is a token for user, signed with the servers' --jwt-secret,
// valid for ttl.
func signToken(secret, user string, ttl time.Duration) (string, error) {
	claims := jwt.RegisteredClaims{Subject: user, ExpiresAt: jwt.NewNumericDate(time.Now().Add(ttl))}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(secret))
}

// dial connects m with co, trying three times; it counts the outcome.
func (d *dialer) dial(ctx context.Context, m *member, co client.Options) (*client.Client, error) {
	url := d.o.Targets[m.target] + "/v1/connect"
	var err error
	for attempt := range 3 {
		var c *client.Client
		if c, err = client.Dial(ctx, url, co); err == nil {
			d.ctr.dials.Add(1)
			return c, nil
		}
		if errors.Is(err, client.ErrUnauthorized) || !sleepCtx(ctx, time.Duration(100<<attempt)*time.Millisecond) {
			break
		}
	}
	d.ctr.dialErrs.Add(1)
	return nil, err
}

// connectReply is what a worker's connect operation reports.
type connectReply struct {
	Dialed  int       `json:"dialed"`
	Failed  int       `json:"failed"`
	Err     string    `json:"err,omitempty"` // the first failure
	Latency Histogram `json:"latency"`       // of each successful Dial
	TTLMS   int64     `json:"ttl_ms"`        // as the server's welcome said
}

func (r *connectReply) merge(o connectReply) {
	r.Dialed += o.Dialed
	r.Failed += o.Failed
	if r.Err == "" {
		r.Err = o.Err
	}
	r.Latency.Merge(o.Latency)
	r.TTLMS = max(r.TTLMS, o.TTLMS)
}

// connectAll dials every member without a client, at most
// ConnectConcurrency at a time, with the options opts gives.
func connectAll(ctx context.Context, env *workerEnv, ms []*member, opts func(*member) client.Options) connectReply {
	return connectEach(ctx, env, ms, func(m *member) (int64, error) {
		c, err := env.dial.dial(ctx, m, opts(m))
		if err != nil {
			return 0, err
		}
		m.c = c
		return c.Welcome().TTLMS, nil
	})
}

// connectAllPusher subscribes every member without a socket to its team's
// presence channel, at most ConnectConcurrency at a time, with the events
// ev gives.
func connectAllPusher(ctx context.Context, env *workerEnv, ms []*member, ev func(*member) pxEvents) connectReply {
	return connectEach(ctx, env, ms, func(m *member) (int64, error) {
		s, err := env.dial.dialPusher(ctx, m, pxChannel(env.o.team(m.team)), ev(m))
		if err != nil {
			return 0, err
		}
		m.px = s
		return 0, nil
	})
}

// connectEach runs dial for every member not connected yet; dial sets the
// member's connection and returns the ttl its server announced, if any.
func connectEach(ctx context.Context, env *workerEnv, ms []*member, dial func(*member) (int64, error)) connectReply {
	var (
		mu    sync.Mutex
		reply connectReply
		lat   syncHist
		wg    sync.WaitGroup
	)
	sem := make(chan struct{}, env.o.ConnectConcurrency)
	for _, m := range ms {
		if m.c != nil || m.px != nil || m.lt != nil {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			start := time.Now()
			ttl, err := dial(m)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				reply.Failed++
				if reply.Err == "" {
					reply.Err = err.Error()
				}
				return
			}
			lat.Record(time.Since(start))
			reply.Dialed++
			reply.TTLMS = ttl
		})
	}
	wg.Wait()
	reply.Latency = lat.take()
	return reply
}

// closeAll closes every member's client, many at a time, and forgets it.
func closeAll(ms []*member) {
	sem := make(chan struct{}, 256)
	var wg sync.WaitGroup
	for _, m := range ms {
		if m.c == nil && m.px == nil && m.lt == nil {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if m.c != nil {
				_ = m.c.Close()
				m.c = nil
			}
			if m.px != nil {
				_ = m.px.Close()
				m.px = nil
			}
			if m.lt != nil {
				_ = m.lt.Close()
				m.lt = nil
			}
		})
	}
	wg.Wait()
}

// killSwitch remembers the TCP connection of a client's latest handshake,
// so that a storm can cut it as a load balancer restart would.
type killSwitch struct {
	mu   sync.Mutex
	conn net.Conn // guarded by mu
}

func (k *killSwitch) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
	if err == nil {
		k.mu.Lock()
		k.conn = c
		k.mu.Unlock()
	}
	return c, err
}

// cut closes the connection under the client's feet; the client sees a
// dropped connection and reconnects by itself.
func (k *killSwitch) cut() {
	k.mu.Lock()
	c := k.conn
	k.conn = nil
	k.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// sleepCtx sleeps d, or returns false if ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
