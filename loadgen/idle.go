package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/greendot/greendot/client"
	"github.com/greendot/greendot/protocol"
)

// The idle and heartbeat scenarios: N users, one connection each, in teams
// of TeamSize, heartbeating with jitter at the advertised interval (idle)
// or at a forced one (heartbeat).

type idleWorker struct {
	env *workerEnv
	ms  []*member
}

func newIdleWorker(env *workerEnv) handler {
	o := env.o
	w := &idleWorker{env: env}
	for i := range o.N {
		if ownsTeam(o.teamOf(i), env.index, env.count) {
			w.ms = append(w.ms, &member{idx: i, user: o.user(i), device: "web", team: o.teamOf(i), target: i % len(o.Targets)})
		}
	}
	return w
}

type idleArgs struct {
	HeartbeatMS int64 `json:"heartbeat_ms,omitempty"` // 0: as the server advertises
}

func (w *idleWorker) handle(ctx context.Context, op string, raw json.RawMessage) (any, error) {
	switch op {
	case "connect":
		var a idleArgs
		if err := decodeArgs(raw, &a); err != nil {
			return nil, err
		}
		if w.env.o.Protocol == protoPusher {
			return connectAllPusher(ctx, w.env, w.ms, func(*member) pxEvents {
				return pxEvents{onMember: func(pxMemberEvent) { w.env.ctr.changes.Add(1) }}
			}), nil
		}
		if w.env.o.SampleEvery > 0 {
			return w.connectSampled(ctx), nil
		}
		return connectAll(ctx, w.env, w.ms, func(m *member) client.Options {
			co := w.env.dial.options(m)
			co.HeartbeatInterval = time.Duration(a.HeartbeatMS) * time.Millisecond
			co.OnChange = func(ch client.Change) {
				if !ch.FromSnapshot {
					w.env.ctr.changes.Add(1)
				}
			}
			return co
		}), nil
	case "check":
		return w.check(), nil
	case "close":
		closeAll(w.ms)
		return struct{}{}, nil
	}
	return nil, unknownOp(op)
}

// sampled reports whether m is a sampled viewer (SampleEvery > 0): the
// first user of every SampleEvery, so every team of at least that size has
// one.
func (w *idleWorker) sampled(m *member) bool { return m.idx%w.env.o.SampleEvery == 0 }

// connectSampled connects the sampled viewers with the Go client and the
// others as light sockets.
func (w *idleWorker) connectSampled(ctx context.Context) connectReply {
	return connectEach(ctx, w.env, w.ms, func(m *member) (int64, error) {
		if !w.sampled(m) {
			s, err := w.env.dial.dialLight(ctx, m)
			if err != nil {
				return 0, err
			}
			m.lt = s
			return s.ttl.Milliseconds(), nil
		}
		co := w.env.dial.options(m)
		co.OnChange = func(ch client.Change) {
			if !ch.FromSnapshot {
				w.env.ctr.changes.Add(1)
			}
		}
		c, err := w.env.dial.dial(ctx, m, co)
		if err != nil {
			return 0, err
		}
		m.c = c
		return c.Welcome().TTLMS, nil
	})
}

// checkReply is what the viewers' dots showed after the hold.
type checkReply struct {
	Checked int    `json:"checked"` // viewer-team-mate pairs whose dot is known
	Wrong   int    `json:"wrong"`
	First   string `json:"first,omitempty"` // the first wrong dot
}

// check compares each connected viewer's dot of each team-mate with the
// team-mate's connection: open means online; a light socket that ended
// longer ago than ttl + grace (and a margin) means offline. A team-mate in
// between, or a viewer's own full-client team-mate that is reconnecting,
// is not judged. Teams are whole in a worker, so every team-mate is here.
// A connection the server expired whose close the load has not read yet
// counts as wrong: the run's expirations tell those apart.
func (w *idleWorker) check() checkReply {
	var r checkReply
	byTeam := make(map[int][]*member)
	for _, m := range w.ms {
		byTeam[m.team] = append(byTeam[m.team], m)
	}
	o := w.env.o
	for _, v := range w.ms {
		if v.c == nil || !v.up.Load() {
			continue
		}
		for _, t := range byTeam[v.team] {
			if t == v {
				continue
			}
			var want string
			switch {
			case t.up.Load():
				want = protocol.StateOnline
			case t.lt != nil:
				_, at := t.lt.up()
				ttl := t.lt.ttl
				if time.Since(at) < ttl+o.Grace+5*time.Second {
					continue
				}
				want = protocol.StateOffline
			default:
				continue
			}
			got := protocol.StateOffline
			if st, ok := v.c.Get(t.user); ok {
				got = st.State
			}
			r.Checked++
			if got != want {
				r.Wrong++
				if r.First == "" {
					r.First = fmt.Sprintf("%s shows %s %s, want %s", v.user, t.user, got, want)
				}
			}
		}
	}
	return r
}

func (w *idleWorker) close() { closeAll(w.ms) }

func driveIdle(ctx context.Context, d *driver) error {
	o := d.o
	pre, err := d.scrape(ctx)
	if err != nil {
		return err
	}
	if err := d.setupTeams(ctx, teamPairs(o, o.N)); err != nil {
		return err
	}
	base, err := d.scrape(ctx)
	if err != nil {
		return err
	}
	r, err := d.connectAndWait(ctx, "users", idleArgs{})
	if err != nil {
		return err
	}
	defer closeWorkers(ctx, d)
	s1, err := d.settle(ctx, time.Minute)
	if err != nil {
		return err
	}
	t1 := time.Now()
	p1 := d.progress()
	if !d.sleepStatus(ctx, "holding", o.Duration) {
		return ctx.Err()
	}
	s2, err := d.scrape(ctx)
	if err != nil {
		return err
	}
	held := time.Since(t1)
	p2 := d.progress()
	var dots checkReply
	if o.SampleEvery > 0 {
		replies, err := callAll[checkReply](ctx, d, "check", nil)
		if err != nil {
			return err
		}
		for _, c := range replies {
			dots.Checked += c.Checked
			dots.Wrong += c.Wrong
			if dots.First == "" {
				dots.First = c.First
			}
		}
	}
	conns := float64(r.Dialed)
	res := d.res
	// A peer's samples hold only what /proc gave (if anything): the
	// figures of the series they lack are left out, not shown as 0.
	if s2.Has(mRSS) {
		res.add("rss_per_conn_kib", "server RSS per connection (after the hold)", (s2.Get(mRSS)-base.Get(mRSS))/conns/1024, "KiB")
		res.goal(4, false, "≤ 4 KiB")
		if o.N < 5000 {
			res.note("with %d connections the server's fixed memory (buffers, pools, runtime) weighs on the per-connection figure; the 4 KiB goal is for 15,000", o.N)
		}
		res.add("rss_per_conn_connected_kib", "server RSS per connection (after connecting)", (s1.Get(mRSS)-base.Get(mRSS))/conns/1024, "KiB")
		if !o.Peer {
			res.add("rss_per_conn_with_teams_kib", "server RSS per connection, team setup included", (s2.Get(mRSS)-pre.Get(mRSS))/conns/1024, "KiB")
		}
	}
	if s2.Has(mHeap) {
		res.add("heap_per_conn_kib", "server Go heap per connection", (s2.Get(mHeap)-base.Get(mHeap))/conns/1024, "KiB")
	}
	if s2.Has(mCPU) {
		// The connect phase's CPU, its fan-out drained (settle) included:
		// what a connect costs the servers, registration, snapshot and the
		// online change it publishes.
		res.add("cpu_us_per_connect", "server CPU per connect (with its fan-out)", (s1.Get(mCPU)-base.Get(mCPU))*1e6/conns, "µs")
		cpu := s2.Get(mCPU) - s1.Get(mCPU)
		res.add("cpu_us_per_conn_minute", "server CPU per connection-minute", cpu*1e6/(conns*held.Minutes()), "µs")
	}
	switch {
	case o.Peer:
	case o.Protocol == protoPusher:
		res.add("heartbeats_per_s", "heartbeats absorbed (pusher:ping)", (s2.Get(mPusherPings)-s1.Get(mPusherPings))/held.Seconds(), "/s")
	default:
		res.add("heartbeats_per_s", "heartbeats absorbed", (s2.Get(mHeartbeats)-s1.Get(mHeartbeats))/held.Seconds(), "/s")
	}
	if !o.Peer {
		res.add("server_goroutines", "server goroutines", s2.Get(mGoroutines), "")
		// Nobody comes or goes during the hold: every dot must stay as it is.
		res.add("hold_changes", "presence changes published during the hold", s2.Sum(mChanges)-s1.Sum(mChanges), "")
		res.goal(0, false, "0")
		res.add("hold_expirations", "connections expired during the hold", s2.Sum(mExpirations)-s1.Sum(mExpirations), "")
		res.goal(0, false, "0")
	}
	res.add("hold_changes_received", "presence changes the clients got during the hold", float64(p2.Changes-p1.Changes), "")
	if o.SampleEvery > 0 {
		res.add("dots_checked", "sampled viewers' dots checked after the hold", float64(dots.Checked), "")
		res.add("dots_wrong", "of them wrong", float64(dots.Wrong), "")
		res.goal(0, false, "0")
		if dots.Wrong > 0 {
			res.note("%d of the sampled viewers' dots were wrong after the hold; the first: %s", dots.Wrong, dots.First)
		}
		res.add("light_dropped", "light sockets closed under the load generator", float64(p2.Drops), "")
		res.goal(0, false, "0")
		if p2.Drops > 0 {
			res.note("%d light sockets ended before the run closed them; the first: %s", p2.Drops, p2.DropReason)
		}
	}
	if o.Protocol == protoPusher {
		d.reportDrops()
	}
	res.serverFigures(s1, s2)
	return nil
}

// jitterMean is the mean heartbeat gap of the client as a share of its
// interval: each gap is uniform in [0.7, 1.0]·interval.
const jitterMean = 0.85

func driveHeartbeat(ctx context.Context, d *driver) error {
	o := d.o
	if err := d.setupTeams(ctx, teamPairs(o, o.N)); err != nil {
		return err
	}
	interval := time.Duration(float64(o.N) / (jitterMean * o.Rate) * float64(time.Second))
	_, err := d.connectAndWait(ctx, "users", idleArgs{HeartbeatMS: max(interval.Milliseconds(), 1)})
	if err != nil {
		return err
	}
	defer closeWorkers(ctx, d)
	smp, err := d.startSamplers(ctx)
	if err != nil {
		return err
	}
	defer smp.close()
	// Let the heartbeats spread out and the connect fan-out drain.
	d.setStatus("warming up")
	d.waitQuiet(ctx, time.Minute)
	if !sleepCtx(ctx, max(2*interval, 2*time.Second)) {
		return ctx.Err()
	}
	s1, err := d.scrape(ctx)
	if err != nil {
		return err
	}
	var redis1, redis2 float64
	if o.RedisAddr != "" {
		if redis1, err = redisCPU(ctx, o.RedisAddr); err != nil {
			return err
		}
	}
	t1 := time.Now()
	smp.run(ctx)
	if !d.sleepStatus(ctx, "measuring", o.Duration) {
		return ctx.Err()
	}
	s2, err := d.scrape(ctx)
	if err != nil {
		return err
	}
	if o.RedisAddr != "" {
		if redis2, err = redisCPU(ctx, o.RedisAddr); err != nil {
			return err
		}
	}
	elapsed := time.Since(t1)
	smp.close()
	rtt := smp.rtt.take()
	hb := s2.Get(mHeartbeats) - s1.Get(mHeartbeats)
	cpu := s2.Get(mCPU) - s1.Get(mCPU)
	res := d.res
	res.add("heartbeat_interval_ms", "forced heartbeat interval", float64(interval.Milliseconds()), "ms")
	res.add("heartbeats_per_s", "heartbeats absorbed", hb/elapsed.Seconds(), "/s")
	res.add("cpu_us_per_heartbeat", "server CPU per heartbeat", cpu*1e6/hb, "µs")
	res.goal(20, false, "≤ 20 µs")
	res.add("server_cpu_share", "server CPU use", cpu/elapsed.Seconds()*100, "%")
	if o.RedisAddr != "" {
		res.add("redis_cpu_us_per_heartbeat", "Redis CPU per heartbeat", (redis2-redis1)*1e6/hb, "µs")
		res.goal(3, false, "≤ 3 µs")
	}
	res.addDur("ack_p50", "heartbeat ack p50", rtt.Quantile(0.5))
	res.addDur("ack_p99", "heartbeat ack p99", rtt.Quantile(0.99))
	res.addDur("ack_max", "heartbeat ack max", rtt.Max())
	res.add("ack_timeouts", "heartbeat acks missing after 2s", float64(smp.timeouts.Load()), "")
	res.serverFigures(s1, s2)
	return nil
}

// teamPairs puts users 0…n-1 in teams of TeamSize.
func teamPairs(o *Options, n int) [][2]string {
	pairs := make([][2]string, n)
	for i := range n {
		pairs[i] = [2]string{o.team(o.teamOf(i)), o.user(i)}
	}
	return pairs
}

// closeWorkers asks every worker to close its connections (bounded).
func closeWorkers(ctx context.Context, d *driver) {
	d.setStatus("closing")
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	_, _ = callAll[struct{}](ctx, d, "close", nil)
}

func decodeArgs(raw json.RawMessage, v any) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("loadgen: bad arguments: %w", err)
	}
	return nil
}

func unknownOp(op string) error { return fmt.Errorf("loadgen: unknown operation %q", op) }
