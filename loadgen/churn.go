package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/greendot/greendot/client"
	"github.com/greendot/greendot/protocol"
)

// The churn scenario: N/2 users with two devices each, in teams of
// TeamSize; for Duration, Rate actions per second pick an idle user:
//
//   - flap (40%): one device reconnects; the other stays. Nothing may be
//     published.
//   - bounce (30%): both devices drop and reconnect at once, within the
//     grace. Nothing may be published.
//   - leave (30%): both devices drop, stay away for grace + 1-2s, and come
//     back: one offline and one online, the real transitions.
//
// Every device is a viewer of its team. A delivery is spurious when it
// changes nothing (online after online), is about someone outside the
// viewer's team, or is an offline whose server time falls outside every
// window in which its subject had no connection (and the online after such
// an offline). Those windows come from each device's state: down from the
// start of a close or when its client sees the connection end, up once its
// snapshot arrived. After the run each user's version is read through the
// HTTP API and checked: one per leave, and at most one pair per window of
// no connection that lasted a grace or more (a slow close or redial under
// load is one).

const (
	// clockVersionFloor: a version at least this large is a clock in
	// microseconds (after 2001), as on the Redis store, where a version is
	// the larger of the previous one plus one and Redis's clock.
	clockVersionFloor = 1_000_000_000_000_000

	flapShare   = 0.4
	bounceShare = 0.3
	// windowSlack covers the millisecond rounding of a change's "at".
	windowSlack = 3 * time.Millisecond
)

type churnUser struct {
	idx  int
	user string
	team int
	devs [2]*member
	busy atomic.Bool

	mu       sync.Mutex
	up       int       // guarded by mu: devices connected, as far as the generator knows
	gone     [4]window // guarded by mu: recent windows without a connection
	ngone    int       // guarded by mu
	leaves   int       // guarded by mu: completed: each must publish offline and online
	longGaps int       // guarded by mu: windows as long as the grace: each may publish both
	failed   bool      // guarded by mu: a redial failed: its transitions cannot be counted
}

// window is a span in which a user had, or may have had, no connection; to
// is zero while it lasts.
type window struct{ from, to time.Time }

// deviceDown records that one of the user's devices went down (the
// generator began to close it, or its client saw the connection end): the
// last one down opens a window.
func (u *churnUser) deviceDown(now time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.up--; u.up == 0 {
		u.gone[u.ngone%len(u.gone)] = window{from: now}
		u.ngone++
	}
}

// deviceUp records a device connected (after its snapshot): the first one
// up closes the window.
func (u *churnUser) deviceUp(now time.Time, grace time.Duration) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.up++; u.up == 1 && u.ngone > 0 {
		w := &u.gone[(u.ngone-1)%len(u.gone)]
		if w.to.IsZero() {
			w.to = now
			if w.to.Sub(w.from) >= grace {
				u.longGaps++
			}
		}
	}
}

// goneAt says whether at falls in one of the user's windows.
func (u *churnUser) goneAt(at time.Time) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	for i := range min(u.ngone, len(u.gone)) {
		w := u.gone[i]
		if !at.Before(w.from.Add(-windowSlack)) && (w.to.IsZero() || !at.After(w.to.Add(windowSlack))) {
			return true
		}
	}
	return false
}

type churnWorker struct {
	env    *workerEnv
	users  []*churnUser
	byUser map[string]*churnUser // read-only after construction
	ms     []*member
	api    *http.Client

	stop    chan struct{} // closed by the stop operation
	running sync.WaitGroup

	// Counters of deliveries (changes received outside snapshots).
	delivered, spurious, noops, foreign, flickers, snapshotChanges, coalesced atomic.Int64
	closeTime, dialTime                                                       syncHist // of each device's close and redial
	deliveredAtStart, deliveredAtStop                                         int64
	flaps, bounces, leaves, skipped                                           atomic.Int64
}

func newChurnWorker(env *workerEnv) handler {
	o := env.o
	w := &churnWorker{env: env, byUser: map[string]*churnUser{}, api: &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{}}}
	nt := len(o.Targets)
	for i := range o.N / 2 {
		u := &churnUser{idx: i, user: o.user(i), team: o.teamOf(i)}
		w.byUser[u.user] = u // every user: deliveries about other workers' users are foreign
		if !ownsTeam(u.team, env.index, env.count) {
			continue
		}
		for dev, name := range []string{"web", "ios"} {
			m := &member{idx: i, user: u.user, device: name, team: u.team, target: (i + dev) % nt}
			u.devs[dev] = m
			w.ms = append(w.ms, m)
		}
		w.users = append(w.users, u)
	}
	return w
}

// options makes a device's client options with the viewer's classifier.
func (w *churnWorker) options(m *member) client.Options {
	co := w.env.dial.options(m)
	u, grace := w.byUser[m.user], w.env.o.Grace
	co.OnStateChange = func(sc client.StateChange) {
		now := time.Now()
		if sc.State == client.Connected {
			if m.up.CompareAndSwap(false, true) {
				w.env.ctr.conns.Add(1)
				u.deviceUp(now, grace)
			}
		} else if m.up.CompareAndSwap(true, false) {
			w.env.ctr.conns.Add(-1)
			u.deviceDown(now)
		}
	}
	// Only the client's reader touches these.
	spuriousOffline := map[string]bool{}
	versions := map[string]uint64{}
	co.OnChange = func(ch client.Change) {
		prev := versions[ch.UserID]
		versions[ch.UserID] = ch.Version
		if ch.FromSnapshot {
			w.snapshotChanges.Add(1)
			return
		}
		w.env.ctr.changes.Add(1)
		w.delivered.Add(1)
		su := w.byUser[ch.UserID]
		switch {
		case su == nil || su.team != m.team:
			w.foreign.Add(1)
			w.spurious.Add(1)
		case ch.State == ch.Previous && ch.Version > prev+1:
			// The outbox replaced a queued change by a newer one (offline
			// then online within one flush): by design, not spurious.
			w.coalesced.Add(1)
		case ch.State == ch.Previous:
			w.noops.Add(1)
			w.spurious.Add(1)
		case ch.State == protocol.StateOffline:
			if su.goneAt(ch.At) {
				delete(spuriousOffline, ch.UserID)
			} else {
				spuriousOffline[ch.UserID] = true
				w.flickers.Add(1)
				w.spurious.Add(1)
			}
		case ch.State == protocol.StateOnline:
			if spuriousOffline[ch.UserID] {
				delete(spuriousOffline, ch.UserID)
				w.spurious.Add(1)
			}
		default: // nobody goes away in this scenario
			w.spurious.Add(1)
		}
	}
	return co
}

type churnArgs struct {
	Rate float64 `json:"rate"` // actions per second, all workers together
}

type churnReply struct {
	Flaps           int64     `json:"flaps"`
	Bounces         int64     `json:"bounces"`
	Leaves          int64     `json:"leaves"`
	Skipped         int64     `json:"skipped"`
	LongGaps        int       `json:"long_gaps"` // windows as long as the grace, leaves aside
	InWindow        int64     `json:"in_window"` // deliveries between start and stop
	Delivered       int64     `json:"delivered"` // deliveries from start to the end of the tail
	Spurious        int64     `json:"spurious"`
	Noops           int64     `json:"noops"`
	Foreign         int64     `json:"foreign"`
	Flickers        int64     `json:"flickers"`
	SnapshotChanges int64     `json:"snapshot_changes"`
	Coalesced       int64     `json:"coalesced"` // same state, versions skipped: the outbox kept the latest
	CloseTime       Histogram `json:"close_time"`
	DialTime        Histogram `json:"dial_time"`
	Checked         int       `json:"checked"`          // users whose version was read
	Unchecked       int       `json:"unchecked"`        // users left out: one of their redials failed
	ClockVersioned  int       `json:"clock_versioned"`  // users left out: their version follows a clock, not a count
	ExtraVersions   int       `json:"extra_versions"`   // transitions published beyond those caused
	MissingVersions int       `json:"missing_versions"` // transitions caused but not published
	CheckErr        string    `json:"check_err,omitempty"`
}

func (w *churnWorker) handle(ctx context.Context, op string, raw json.RawMessage) (any, error) {
	switch op {
	case "connect":
		return connectAll(ctx, w.env, w.ms, w.options), nil
	case "start":
		var a churnArgs
		if err := decodeArgs(raw, &a); err != nil {
			return nil, err
		}
		if w.stop != nil {
			return nil, fmt.Errorf("loadgen: churn already started")
		}
		share := float64(len(w.users)) / float64(w.env.o.N/2)
		w.stop = make(chan struct{})
		w.deliveredAtStart = w.delivered.Load()
		w.running.Go(func() { w.dispatch(ctx, a.Rate*share) })
		return struct{}{}, nil
	case "stop":
		if w.stop == nil {
			return nil, fmt.Errorf("loadgen: churn not started")
		}
		w.deliveredAtStop = w.delivered.Load()
		close(w.stop)
		w.running.Wait()
		// Late offlines (and the versions) settle within a grace.
		sleepCtx(ctx, w.env.o.Grace+1500*time.Millisecond)
		return w.report(ctx), nil
	case "close":
		w.close()
		return struct{}{}, nil
	}
	return nil, unknownOp(op)
}

// dispatch starts rate actions per second on idle users until stopped.
// Actions run on their own goroutines, at most one per user.
func (w *churnWorker) dispatch(ctx context.Context, rate float64) {
	if len(w.users) == 0 || rate <= 0 {
		return
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	last, credit := time.Now(), 0.0
	for {
		select {
		case <-w.stop:
			return
		case <-ctx.Done():
			return
		case now := <-t.C:
			credit += rate * now.Sub(last).Seconds()
			last = now
		}
		for ; credit >= 1; credit-- {
			u := w.pickIdle()
			if u == nil {
				w.skipped.Add(1)
				continue
			}
			w.running.Go(func() {
				defer u.busy.Store(false)
				w.act(ctx, u)
			})
		}
	}
}

func (w *churnWorker) pickIdle() *churnUser {
	for range 8 {
		u := w.users[rand.N(len(w.users))]
		if u.busy.CompareAndSwap(false, true) {
			return u
		}
	}
	return nil
}

func (w *churnWorker) act(ctx context.Context, u *churnUser) {
	switch p := rand.Float64(); {
	case p < flapShare:
		w.flaps.Add(1)
		d := rand.N(2)
		w.drop(u.devs[d])
		w.redial(ctx, u.devs[d])
	case p < flapShare+bounceShare:
		w.bounces.Add(1)
		w.both(u, w.drop)
		w.both(u, func(m *member) { w.redial(ctx, m) })
	default:
		w.leaves.Add(1)
		w.both(u, w.drop)
		away := w.env.o.Grace + time.Second + rand.N(time.Second)
		if !sleepCtx(ctx, away) {
			return
		}
		w.both(u, func(m *member) { w.redial(ctx, m) })
		if u.devs[0].c != nil || u.devs[1].c != nil {
			u.mu.Lock()
			u.leaves++
			u.mu.Unlock()
		}
	}
}

// drop closes a device. It counts as down from the start of the close: the
// server may see the close frame long before Close returns.
func (w *churnWorker) drop(m *member) {
	if m.c != nil {
		start := time.Now()
		if m.up.CompareAndSwap(true, false) {
			w.env.ctr.conns.Add(-1)
			w.byUser[m.user].deviceDown(start)
		}
		_ = m.c.Close()
		w.closeTime.Record(time.Since(start))
		m.c = nil
	}
}

func (w *churnWorker) redial(ctx context.Context, m *member) {
	if m.c == nil {
		start := time.Now()
		m.c, _ = w.env.dial.dial(ctx, m, w.options(m))
		w.dialTime.Record(time.Since(start))
		if m.c == nil {
			u := w.byUser[m.user]
			u.mu.Lock()
			u.failed = true
			u.mu.Unlock()
		}
	}
}

// both runs f on the user's two devices at once.
func (w *churnWorker) both(u *churnUser, f func(*member)) {
	var wg sync.WaitGroup
	for _, m := range u.devs {
		wg.Go(func() { f(m) })
	}
	wg.Wait()
}

// report gathers the counters and checks every user's version: 1 for the
// first connect, 2 per leave, and 0 or 2 per bounce that outlasted the
// grace.
func (w *churnWorker) report(ctx context.Context) churnReply {
	r := churnReply{
		Flaps: w.flaps.Load(), Bounces: w.bounces.Load(), Leaves: w.leaves.Load(), Skipped: w.skipped.Load(),
		InWindow: w.deliveredAtStop - w.deliveredAtStart, Delivered: w.delivered.Load() - w.deliveredAtStart,
		Spurious: w.spurious.Load(), Noops: w.noops.Load(), Foreign: w.foreign.Load(), Flickers: w.flickers.Load(),
		SnapshotChanges: w.snapshotChanges.Load(), Coalesced: w.coalesced.Load(),
		CloseTime: w.closeTime.take(), DialTime: w.dialTime.take(),
	}
	for start := 0; start < len(w.users); start += protocol.MaxQueryIDs {
		batch := w.users[start:min(start+protocol.MaxQueryIDs, len(w.users))]
		ids := make([]string, len(batch))
		for i, u := range batch {
			ids[i] = u.user
		}
		got, err := queryPresence(ctx, w.api, w.env.o, ids)
		if err != nil {
			r.CheckErr = err.Error()
			return r
		}
		for i, u := range batch {
			u.mu.Lock()
			least := 1 + 2*u.leaves
			most := 1 + 2*u.longGaps
			r.LongGaps += u.longGaps - u.leaves
			failed := u.failed
			u.mu.Unlock()
			if failed {
				r.Unchecked++
				continue
			}
			if got[i].Version >= clockVersionFloor {
				// A shared store (Redis) versions by its clock: the count of
				// transitions cannot be read from the version.
				r.ClockVersioned++
				continue
			}
			v := int(got[i].Version)
			r.ExtraVersions += max(v-most, 0)
			r.MissingVersions += max(least-v, 0)
			r.Checked++
		}
	}
	return r
}

func (w *churnWorker) close() {
	if w.stop != nil {
		select {
		case <-w.stop:
		default:
			close(w.stop)
		}
	}
	w.running.Wait()
	closeAll(w.ms)
	w.api.CloseIdleConnections()
}

// queryPresence asks the first target's HTTP API for users' presence.
func queryPresence(ctx context.Context, hc *http.Client, o *Options, ids []string) ([]protocol.UserPresence, error) {
	body, _ := json.Marshal(map[string][]string{"user_ids": ids})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, httpBase(o.Targets[0])+"/v1/presence/query", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+o.APIKey)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("loadgen: presence query: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("loadgen: presence query: %s", resp.Status)
	}
	var out struct {
		Users []protocol.UserPresence `json:"users"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("loadgen: presence query: %w", err)
	}
	if len(out.Users) != len(ids) {
		return nil, fmt.Errorf("loadgen: presence query: %d answers for %d users", len(out.Users), len(ids))
	}
	return out.Users, nil
}

func driveChurn(ctx context.Context, d *driver) error {
	o := d.o
	users := o.N / 2
	if err := d.setupTeams(ctx, teamPairs(o, users)); err != nil {
		return err
	}
	_, err := d.connectAndWait(ctx, "devices", nil)
	if err != nil {
		return err
	}
	defer closeWorkers(ctx, d)
	s1, err := d.settle(ctx, time.Minute)
	if err != nil {
		return err
	}
	if _, err := callAll[struct{}](ctx, d, "start", churnArgs{Rate: o.Rate}); err != nil {
		return err
	}
	t1 := time.Now()
	startChanges := d.progress().Changes
	end := t1.Add(o.Duration)
	d.setStatusf(func(p Progress) string {
		return fmt.Sprintf("churning %.0fs left, %.0f deliveries/s", max(time.Until(end), 0).Seconds(),
			float64(p.Changes-startChanges)/time.Since(t1).Seconds())
	})
	if !sleepCtx(ctx, o.Duration) {
		return ctx.Err()
	}
	s2, err := d.scrape(ctx)
	elapsed := time.Since(t1)
	if err != nil {
		return err
	}
	d.setStatus("stopping: actions in flight, then a grace for late offlines")
	replies, err := callAll[churnReply](ctx, d, "stop", nil)
	if err != nil {
		return err
	}
	s3, err := d.scrape(ctx)
	if err != nil {
		return err
	}
	var t churnReply
	for _, x := range replies {
		t.Flaps += x.Flaps
		t.Bounces += x.Bounces
		t.Leaves += x.Leaves
		t.Skipped += x.Skipped
		t.LongGaps += x.LongGaps
		t.InWindow += x.InWindow
		t.Delivered += x.Delivered
		t.Spurious += x.Spurious
		t.Noops += x.Noops
		t.Foreign += x.Foreign
		t.Flickers += x.Flickers
		t.SnapshotChanges += x.SnapshotChanges
		t.Coalesced += x.Coalesced
		t.CloseTime.Merge(x.CloseTime)
		t.DialTime.Merge(x.DialTime)
		t.Checked += x.Checked
		t.Unchecked += x.Unchecked
		t.ClockVersioned += x.ClockVersioned
		t.ExtraVersions += x.ExtraVersions
		t.MissingVersions += x.MissingVersions
		if t.CheckErr == "" {
			t.CheckErr = x.CheckErr
		}
	}
	serverDeliveries := s2.Get(mDeliveries) - s1.Get(mDeliveries)
	cpu := s2.Get(mCPU) - s1.Get(mCPU)
	real := 2 * t.Leaves
	res := d.res
	res.add("actions_flap", "flaps (one device reconnects)", float64(t.Flaps), "")
	res.add("actions_bounce", "bounces (both, within the grace)", float64(t.Bounces), "")
	res.add("actions_leave", "leaves (both, past the grace)", float64(t.Leaves), "")
	res.add("actions_skipped", "actions skipped (every user busy)", float64(t.Skipped), "")
	res.add("deliveries_per_s", "changes delivered (viewers counted)", float64(t.InWindow)/elapsed.Seconds(), "/s")
	res.goal(50000*float64(len(o.Targets)), true, fmt.Sprintf("≥ %s/s", groupThousands(fmt.Sprint(50000*len(o.Targets)))))
	res.add("server_deliveries_per_s", "changes delivered (server counted)", serverDeliveries/elapsed.Seconds(), "/s")
	res.add("cpu_ms_per_1000_deliveries", "server CPU per 1,000 deliveries", cpu*1e3/(serverDeliveries/1000), "ms")
	res.add("server_cpu_share", "server CPU use", cpu/elapsed.Seconds()*100, "%")
	res.add("real_transitions", "real transitions caused (2 per leave)", float64(real), "")
	res.add("published_transitions", "transitions published", s3.Sum(mChanges)-s1.Sum(mChanges), "")
	res.add("spurious_deliveries", "spurious deliveries", float64(t.Spurious), "")
	res.goal(0, false, "0")
	res.add("spurious_per_transition", "spurious deliveries per real transition", float64(t.Spurious)/float64(max(real, 1)), "")
	res.goal(0, false, "0")
	if t.Checked > 0 {
		res.add("spurious_transitions", "transitions published beyond those caused", float64(t.ExtraVersions), "")
		res.goal(0, false, "0")
		res.add("missing_transitions", "transitions caused but not published", float64(t.MissingVersions), "")
		res.goal(0, false, "0")
	}
	res.add("coalesced_deliveries", "deliveries that skipped versions (outbox coalescing)", float64(t.Coalesced), "")
	res.add("grace_cancellations", "graces cancelled", s3.Get(mGraceCancel)-s1.Get(mGraceCancel), "")
	res.addDur("close_p99", "a device's close, p99 (load generator)", t.CloseTime.Quantile(0.99))
	res.addDur("redial_p99", "a device's redial, p99 (load generator)", t.DialTime.Quantile(0.99))
	res.addDur("redial_max", "a device's redial, max", t.DialTime.Max())
	res.add("redials_failed", "redials that failed (after 3 tries)", float64(d.progress().DialErrs), "")
	res.add("users_unchecked", "users left out of the version check (a redial failed)", float64(t.Unchecked), "")
	res.serverFigures(s1, s2)
	if t.Noops+t.Foreign+t.Flickers > 0 {
		res.note("spurious: %d changed nothing, %d about users outside the viewer's team, %d offline flickers", t.Noops, t.Foreign, t.Flickers)
	}
	if t.LongGaps > 0 {
		res.note("%d times (leaves aside) a user had no connection for a grace or more (slow closes or redials); their transitions count as real", t.LongGaps)
	}
	if t.ClockVersioned > 0 {
		res.note("version check skipped for %d users: their versions follow the store's clock (Redis), not a count of transitions", t.ClockVersioned)
	}
	if t.CheckErr != "" {
		res.note("version check incomplete (%d users checked): %s", t.Checked, t.CheckErr)
	}
	return nil
}
