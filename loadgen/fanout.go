package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/greendot/greendot/client"
	"github.com/greendot/greendot/protocol"
)

// The fanout scenario: N viewers in one team; a subject of that team
// connects, is seen online by every viewer, leaves, and is seen offline
// after the grace, Rounds times. The online latency runs from the start of
// the subject's connect to each viewer's receipt; the offline one from the
// start of its close plus the grace to the receipt.

type fanoutWorker struct {
	env     *workerEnv
	ms      []*member
	subject string

	mu       sync.Mutex
	pos      map[*member]int       // index in ms; read-only after construction
	last     []seen                // guarded by mu: per member, the latest subject change
	received int                   // guarded by mu: subject changes received
	noops    int                   // guarded by mu: subject changes that changed nothing
	errors   int                   // guarded by mu: pusher:error frames (Protocol "pusher")
	lat      map[string]*Histogram // guarded by mu: by state
	fromAt   Histogram             // guarded by mu: online, from the server's transition
}

type seen struct {
	state    string
	received time.Time
	at       time.Time // the server's time of the transition (ms)
}

func fanoutSubject(o *Options) string { return o.RunID + "-subject" }

func newFanoutWorker(env *workerEnv) handler {
	o := env.o
	w := &fanoutWorker{env: env, subject: fanoutSubject(o), lat: map[string]*Histogram{
		protocol.StateOnline: {}, protocol.StateOffline: {}}}
	for i := range o.N {
		if i%env.count == env.index {
			w.ms = append(w.ms, &member{idx: i, user: o.user(i), device: "web", target: i % len(o.Targets)})
		}
	}
	w.last = make([]seen, len(w.ms))
	w.pos = make(map[*member]int, len(w.ms))
	for j, m := range w.ms {
		w.pos[m] = j
	}
	return w
}

type awaitArgs struct {
	State     string `json:"state"`
	T0        int64  `json:"t0"` // unix nanoseconds: latencies are measured from it
	TimeoutMS int64  `json:"timeout_ms"`
}

type awaitReply struct {
	Got     int `json:"got"`
	Missing int `json:"missing"`
}

type fanoutReply struct {
	Online   Histogram `json:"online"`
	FromAt   Histogram `json:"from_at"`
	Offline  Histogram `json:"offline"`
	Received int       `json:"received"`
	Noops    int       `json:"noops"`
	Errors   int       `json:"errors"`
}

func (w *fanoutWorker) handle(ctx context.Context, op string, raw json.RawMessage) (any, error) {
	switch op {
	case "connect":
		if w.env.o.Protocol == protoPusher {
			return connectAllPusher(ctx, w.env, w.ms, w.pusherEvents), nil
		}
		return connectAll(ctx, w.env, w.ms, func(m *member) client.Options {
			co := w.env.dial.options(m)
			j := w.pos[m]
			co.OnChange = func(ch client.Change) {
				if ch.FromSnapshot {
					return
				}
				w.env.ctr.changes.Add(1)
				if ch.UserID != w.subject {
					return
				}
				w.mu.Lock()
				w.received++
				if ch.Previous == ch.State {
					w.noops++
				}
				w.last[j] = seen{ch.State, ch.Received, ch.At}
				w.mu.Unlock()
			}
			return co
		}), nil
	case "await":
		var a awaitArgs
		if err := decodeArgs(raw, &a); err != nil {
			return nil, err
		}
		return w.await(ctx, a), nil
	case "collect":
		w.mu.Lock()
		defer w.mu.Unlock()
		return fanoutReply{Online: *w.lat[protocol.StateOnline], FromAt: w.fromAt, Offline: *w.lat[protocol.StateOffline],
			Received: w.received, Noops: w.noops, Errors: w.errors}, nil
	case "close":
		closeAll(w.ms)
		return struct{}{}, nil
	}
	return nil, unknownOp(op)
}

// pusherEvents records a Pusher viewer's member events of the subject, as
// the native OnChange does its changes; Pusher frames carry no server time.
func (w *fanoutWorker) pusherEvents(m *member) pxEvents {
	j := w.pos[m]
	return pxEvents{
		onMember: func(e pxMemberEvent) {
			w.env.ctr.changes.Add(1)
			if e.UserID != w.subject {
				return
			}
			state := protocol.StateOffline
			if e.Added {
				state = protocol.StateOnline
			}
			w.mu.Lock()
			w.received++
			if w.last[j].state == state {
				w.noops++
			}
			w.last[j] = seen{state: state, received: e.Received}
			w.mu.Unlock()
		},
		onError: func(pxFrame) {
			w.mu.Lock()
			w.errors++
			w.mu.Unlock()
		},
	}
}

// await waits until every connected viewer holds the subject in a.State,
// then records each one's latency from a.T0.
func (w *fanoutWorker) await(ctx context.Context, a awaitArgs) awaitReply {
	deadline := time.Now().Add(time.Duration(a.TimeoutMS) * time.Millisecond)
	t0 := time.Unix(0, a.T0)
	for {
		w.mu.Lock()
		var r awaitReply
		for j, m := range w.ms {
			switch {
			case m.c == nil && m.px == nil:
			case w.last[j].state == a.State:
				r.Got++
			default:
				r.Missing++
			}
		}
		if r.Missing == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			h := w.lat[a.State]
			for j := range w.ms {
				if w.last[j].state == a.State {
					h.Record(w.last[j].received.Sub(t0))
					if a.State == protocol.StateOnline && !w.last[j].at.IsZero() {
						w.fromAt.Record(w.last[j].received.Sub(w.last[j].at))
					}
				}
			}
			w.mu.Unlock()
			return r
		}
		w.mu.Unlock()
		time.Sleep(2 * time.Millisecond)
	}
}

func (w *fanoutWorker) close() { closeAll(w.ms) }

// dialSubject connects the fanout's subject in the run's protocol: a
// Pusher subject subscribes the team's presence channel, which is what
// makes it a member online.
func dialSubject(ctx context.Context, dl *dialer, m *member) (io.Closer, error) {
	if dl.o.Protocol == protoPusher {
		return dl.dialPusher(ctx, m, pxChannel(dl.o.team(0)), pxEvents{})
	}
	return dl.dial(ctx, m, dl.options(m))
}

func driveFanout(ctx context.Context, d *driver) error {
	o := d.o
	subject := fanoutSubject(o)
	pairs := [][2]string{{o.team(0), subject}}
	for i := range o.N {
		pairs = append(pairs, [2]string{o.team(0), o.user(i)})
	}
	if err := d.setupTeams(ctx, pairs); err != nil {
		return err
	}
	r, err := d.connectAndWait(ctx, "viewers", nil)
	if err != nil {
		return err
	}
	defer closeWorkers(ctx, d)
	s1, err := d.settle(ctx, 2*time.Minute)
	if err != nil {
		return err
	}
	dl := newDialer(o, &counters{})
	defer dl.closeIdle()
	var bound time.Time
	if o.Duration > 0 {
		bound = time.Now().Add(o.Duration)
	}
	rounds, missing := 0, 0
	for round := range o.Rounds {
		if !bound.IsZero() && time.Now().After(bound) || ctx.Err() != nil {
			break
		}
		d.setStatusf(func(p Progress) string { return fmt.Sprintf("round %d/%d", round+1, o.Rounds) })
		m := &member{user: subject, device: "web", target: round % len(o.Targets)}
		t0 := time.Now()
		c, err := dialSubject(ctx, dl, m)
		if err != nil {
			return fmt.Errorf("loadgen: subject: %w", err)
		}
		on, err := callAll[awaitReply](ctx, d, "await", awaitArgs{State: protocol.StateOnline, T0: t0.UnixNano(), TimeoutMS: 10_000})
		t1 := time.Now()
		_ = c.Close()
		if err != nil {
			return err
		}
		if heard := countHeard(on); round == 0 && heard == 0 && r.Dialed > 0 {
			if o.Peer {
				return errors.New("loadgen: no viewer heard the subject come online (member_added)")
			}
			// Nobody: most likely the team is large at the server, whose
			// viewers get only the members they watch (DESIGN.md Part 1b).
			return fmt.Errorf("loadgen: no viewer heard the subject come online; is the team (%d members) over the server's --large-team (default 1000)? Start it with --large-team %d or more", r.Dialed+1, r.Dialed+1)
		}
		off, err := callAll[awaitReply](ctx, d, "await", awaitArgs{State: protocol.StateOffline,
			T0: t1.Add(o.Grace).UnixNano(), TimeoutMS: (o.Grace + 10*time.Second).Milliseconds()})
		if err != nil {
			return err
		}
		for _, x := range append(on, off...) {
			missing += x.Missing
		}
		rounds++
	}
	s2, err := d.scrape(ctx)
	if err != nil {
		return err
	}
	cols, err := callAll[fanoutReply](ctx, d, "collect", nil)
	if err != nil {
		return err
	}
	var col fanoutReply
	for _, c := range cols {
		col.Online.Merge(c.Online)
		col.FromAt.Merge(c.FromAt)
		col.Offline.Merge(c.Offline)
		col.Received += c.Received
		col.Noops += c.Noops
		col.Errors += c.Errors
	}
	expected := 2 * rounds * r.Dialed
	goal, goalText := 20.0, "≤ 20 ms"
	if len(o.Targets) > 1 {
		goal, goalText = 40, "≤ 40 ms"
	}
	res := d.res
	res.add("rounds", "rounds", float64(rounds), "")
	res.add("viewers", "viewers", float64(r.Dialed), "")
	res.addDur("online_p50", "online: connect → viewer p50", col.Online.Quantile(0.5))
	res.addDur("online_p99", "online: connect → viewer p99", col.Online.Quantile(0.99))
	res.goal(goal, false, goalText)
	res.addDur("online_max", "online: connect → viewer max", col.Online.Max())
	if o.Protocol == protoNative {
		res.addDur("online_from_transition_p50", "online: server transition → viewer p50 (±1 ms)", col.FromAt.Quantile(0.5))
		res.addDur("online_from_transition_p99", "online: server transition → viewer p99 (±1 ms)", col.FromAt.Quantile(0.99))
	} else {
		res.note("the subject is a Pusher socket too: online runs from the start of its dial to each viewer's member_added, offline to its member_removed")
	}
	res.addDur("offline_p50", "offline: past close + grace p50", col.Offline.Quantile(0.5))
	res.addDur("offline_p99", "offline: past close + grace p99", col.Offline.Quantile(0.99))
	res.addDur("offline_max", "offline: past close + grace max", col.Offline.Max())
	if !o.Peer {
		// How late the servers decided each offline past its grace end: what
		// is left of offline_p50 is its delivery, as for an online.
		res.add("server_grace_lag_p99_ms", "offline: servers' own decision past the grace end p99 (histogram)",
			s2.Sub(s1).HistQuantile(mGraceLag, 0.99)*1000, "ms")
		res.goal(10, false, "≤ 10 ms")
	}
	res.add("deliveries_expected", "subject changes expected", float64(expected), "")
	res.add("deliveries_received", "subject changes received", float64(col.Received), "")
	res.add("deliveries_missing", "viewers that missed a change", float64(missing), "")
	res.goal(0, false, "0")
	res.add("deliveries_spurious", "spurious subject changes", float64(max(col.Received-expected, 0)+col.Noops), "")
	res.goal(0, false, "0")
	if o.Protocol == protoPusher {
		res.add("pusher_errors", "pusher:error frames at viewers", float64(col.Errors), "")
		res.goal(0, false, "0")
		if !o.Peer {
			res.add("pusher_subscription_errors", "subscriptions the servers refused", s2.Sum(mPusherErrors)-s1.Sum(mPusherErrors), "")
			res.goal(0, false, "0")
		}
	}
	if o.Protocol == protoPusher {
		d.reportDrops()
	}
	res.serverFigures(s1, s2)
	return nil
}

// countHeard is the viewers that got the change awaited.
func countHeard(replies []awaitReply) int {
	n := 0
	for _, x := range replies {
		n += x.Got
	}
	return n
}
