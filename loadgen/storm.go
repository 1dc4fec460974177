package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/greendot/greendot/client"
)

// The storm scenario: N users in teams of TeamSize, one connection each.
// At once every TCP connection is cut under its client, as a load-balancer
// restart would; each client reconnects by itself after a uniform random
// delay within Window (its backoff). A user back within the grace must cause
// no change at all; one back later goes offline and online, legitimately.
// Samplers (extra connections) measure heartbeat round trips meanwhile.

type stormUser struct {
	m     *member
	back  atomic.Int64 // unix ns of the first reconnect after the cut; 0 before
	again atomic.Bool  // its client lost the connection again after coming back
	about atomic.Int64 // changes about this user delivered after the cut
}

type stormWorker struct {
	env    *workerEnv
	users  []*stormUser
	byUser map[string]*stormUser // read-only after construction
	ms     []*member

	cutAt                atomic.Int64 // unix ns; 0 before the storm
	delivered, snapDiffs atomic.Int64 // changes after the cut: in presence frames, found by snapshots
	lastChange           atomic.Int64 // unix ns
}

func newStormWorker(env *workerEnv) handler {
	o := env.o
	w := &stormWorker{env: env, byUser: map[string]*stormUser{}}
	for i := range o.N {
		k := o.teamOf(i)
		if !ownsTeam(k, env.index, env.count) {
			continue
		}
		m := &member{idx: i, user: o.user(i), device: "web", team: k, target: i % len(o.Targets), kill: &killSwitch{}}
		u := &stormUser{m: m}
		w.users = append(w.users, u)
		w.byUser[m.user] = u
		w.ms = append(w.ms, m)
	}
	return w
}

type stormReply struct {
	Users       int       `json:"users"`
	NotBack     int       `json:"not_back"`
	Within      int       `json:"within"` // back within the grace
	Again       int       `json:"again"`  // of those, dropped again after coming back
	Back        Histogram `json:"back"`   // cut → reconnected
	LastBack    int64     `json:"last_back"`
	AboutWithin int64     `json:"about_within"` // changes about users back within the grace
	AboutLate   int64     `json:"about_late"`
	AboutAgain  int64     `json:"about_again"` // changes about users back within the grace who dropped again
	Delivered   int64     `json:"delivered"`
	SnapDiffs   int64     `json:"snap_diffs"`
	LastChange  int64     `json:"last_change"`
	Pairs       int64     `json:"pairs"` // viewer × subject pairs
}

func (w *stormWorker) handle(ctx context.Context, op string, raw json.RawMessage) (any, error) {
	switch op {
	case "connect":
		return connectAll(ctx, w.env, w.ms, w.options), nil
	case "cut":
		now := time.Now()
		w.cutAt.Store(now.UnixNano())
		for _, m := range w.ms {
			m.kill.cut()
		}
		return struct{}{}, nil
	case "collect":
		return w.collect(), nil
	case "close":
		closeAll(w.ms)
		return struct{}{}, nil
	}
	return nil, unknownOp(op)
}

func (w *stormWorker) options(m *member) client.Options {
	co := w.env.dial.options(m)
	u := w.byUser[m.user]
	// Back within Window whatever the attempt: the whole storm is bounded.
	co.ReconnectBase, co.ReconnectMax = w.env.o.Window, w.env.o.Window
	counting := co.OnStateChange
	co.OnStateChange = func(sc client.StateChange) {
		counting(sc)
		if w.cutAt.Load() != 0 {
			switch {
			case sc.State == client.Connected:
				u.back.CompareAndSwap(0, time.Now().UnixNano())
			case u.back.Load() != 0:
				// Dropped again under the load (a write timing out on a
				// starved load process): its later offline and online are
				// real changes, not the storm's.
				u.again.Store(true)
			}
		}
	}
	co.OnChange = func(ch client.Change) {
		if !ch.FromSnapshot {
			w.env.ctr.changes.Add(1)
		}
		if w.cutAt.Load() == 0 {
			return
		}
		if ch.FromSnapshot {
			w.snapDiffs.Add(1)
		} else {
			w.delivered.Add(1)
		}
		w.lastChange.Store(ch.Received.UnixNano())
		if s := w.byUser[ch.UserID]; s != nil {
			s.about.Add(1)
		}
	}
	return co
}

func (w *stormWorker) collect() stormReply {
	o := w.env.o
	cut := w.cutAt.Load()
	r := stormReply{Users: len(w.users), Delivered: w.delivered.Load(), SnapDiffs: w.snapDiffs.Load(),
		LastChange: w.lastChange.Load()}
	teams := map[int]int64{}
	for _, u := range w.users {
		teams[u.m.team]++
		back := u.back.Load()
		if back == 0 {
			r.NotBack++
			r.AboutLate += u.about.Load()
			continue
		}
		gap := time.Duration(back - cut)
		r.Back.Record(gap)
		r.LastBack = max(r.LastBack, back)
		switch {
		case gap < o.Grace && u.again.Load():
			r.Within++
			r.Again++
			r.AboutAgain += u.about.Load()
		case gap < o.Grace:
			r.Within++
			r.AboutWithin += u.about.Load()
		default:
			r.AboutLate += u.about.Load()
		}
	}
	for _, k := range teams {
		r.Pairs += k * (k - 1)
	}
	return r
}

func (w *stormWorker) close() { closeAll(w.ms) }

func driveStorm(ctx context.Context, d *driver) error {
	o := d.o
	if err := d.setupTeams(ctx, teamPairs(o, o.N)); err != nil {
		return err
	}
	r, err := d.connectAndWait(ctx, "users", nil)
	if err != nil {
		return err
	}
	defer closeWorkers(ctx, d)
	smp, err := d.startSamplers(ctx)
	if err != nil {
		return err
	}
	defer smp.close()
	s1, err := d.settle(ctx, time.Minute)
	if err != nil {
		return err
	}
	smp.run(ctx)
	t0 := time.Now()
	if _, err := callAll[struct{}](ctx, d, "cut", nil); err != nil {
		return err
	}
	want := int64(r.Dialed)
	d.setStatusf(func(p Progress) string { return fmt.Sprintf("storm: %d/%d back", p.Conns, want) })
	// All back (bounded), then past the grace, then a second without changes.
	limit := t0.Add(o.Window + time.Minute)
	for d.progress().Conns < want && time.Now().Before(limit) && sleepCtx(ctx, 50*time.Millisecond) {
	}
	quietFrom, last := time.Now(), d.progress().Changes
	limit = time.Now().Add(30 * time.Second)
	for time.Now().Before(limit) && sleepCtx(ctx, 100*time.Millisecond) {
		if c := d.progress().Changes; c != last {
			quietFrom, last = time.Now(), c
		}
		if time.Since(t0) > o.Grace+time.Second && time.Since(quietFrom) >= time.Second {
			break
		}
	}
	s2, err := d.scrape(ctx)
	if err != nil {
		return err
	}
	smp.close()
	rtt := smp.rtt.take()
	replies, err := callAll[stormReply](ctx, d, "collect", nil)
	if err != nil {
		return err
	}
	var t stormReply
	for _, x := range replies {
		t.Users += x.Users
		t.NotBack += x.NotBack
		t.Within += x.Within
		t.Again += x.Again
		t.AboutAgain += x.AboutAgain
		t.Back.Merge(x.Back)
		t.LastBack = max(t.LastBack, x.LastBack)
		t.AboutWithin += x.AboutWithin
		t.AboutLate += x.AboutLate
		t.Delivered += x.Delivered
		t.SnapDiffs += x.SnapDiffs
		t.LastChange = max(t.LastChange, x.LastChange)
		t.Pairs += x.Pairs
	}
	settled := time.Duration(max(t.LastBack, t.LastChange) - t0.UnixNano())
	delta := s2.Sub(s1)
	res := d.res
	res.add("reconnected", "users back", float64(t.Users-t.NotBack), "")
	res.add("not_back", "users not back", float64(t.NotBack), "")
	res.goal(0, false, "0")
	res.add("back_within_grace", "users back within the grace", float64(t.Within), "")
	res.addDur("back_p50", "cut → back p50", t.Back.Quantile(0.5))
	res.addDur("back_max", "cut → back max (all back)", t.Back.Max())
	res.addDur("settle", "time to settle (last reconnect or change)", settled)
	res.add("changes_within_grace", "changes about users back within the grace", float64(t.AboutWithin), "")
	res.goal(0, false, "0")
	res.add("dropped_again", "users back within the grace whose client dropped again", float64(t.Again), "")
	res.add("changes_dropped_again", "changes about those (their later offline and online)", float64(t.AboutAgain), "")
	res.add("changes_per_viewer_subject", "changes per viewer per subject", float64(t.Delivered+t.SnapDiffs)/float64(max(t.Pairs, 1)), "")
	res.add("changes_late", "changes about users back after the grace", float64(t.AboutLate), "")
	res.add("snapshot_diffs", "changes found by reconnect snapshots", float64(t.SnapDiffs), "")
	res.add("grace_cancellations", "graces cancelled (server)", delta.Get(mGraceCancel), "")
	res.add("published_transitions", "transitions published (server)", delta.Sum(mChanges), "")
	res.addDur("ack_p50", "heartbeat ack p50 during the storm", rtt.Quantile(0.5))
	res.addDur("ack_p99", "heartbeat ack p99 during the storm", rtt.Quantile(0.99))
	res.goal(100, false, "≤ 100 ms")
	res.addDur("ack_max", "heartbeat ack max during the storm", rtt.Max())
	res.add("ack_timeouts", "heartbeat acks missing after 2s", float64(smp.timeouts.Load()), "")
	res.serverFigures(s1, s2)
	return nil
}
