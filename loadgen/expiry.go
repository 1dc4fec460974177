package loadgen

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/greendot/greendot/client"
	"github.com/greendot/greendot/protocol"
)

// The expiry scenario: N users in teams of TeamSize; in each team the users
// of odd index are subjects, the others viewers. Spread over Window, each
// subject sends a last heartbeat (a ping, whose send time is noted) and
// freezes: TCP stays open, nothing more is sent. The server must publish
// its offline at that time + ttl + grace; the lag past it is measured at
// every viewer's receipt.

type expSubject struct {
	team    int
	m       *member
	lastAt  atomic.Int64 // unix ns of the last frame sent; 0 until frozen
	firstAt atomic.Int64 // unix ns of the first viewer's receipt of its offline
}

type expiryWorker struct {
	env      *workerEnv
	ms       []*member
	subjects map[string]*expSubject // read-only after construction
	viewers  map[int]int            // team → viewers in it; set by connect
	ttl      time.Duration

	lag                      syncHist
	pairs, unexpected, early atomic.Int64
	// Per viewer and frozen subject, an offline counts once: a second is a
	// duplicate, and one a viewer learns from the snapshot of a reconnect
	// (it dropped meanwhile) is counted apart, not as missing.
	duplicates, fromSnapshot atomic.Int64
	armed                    atomic.Bool // connected: a viewer's drop from now on counts
	drops                    atomic.Int64
	dropMu                   sync.Mutex
	dropReason               string // the first drop's
}

func newExpiryWorker(env *workerEnv) handler {
	o := env.o
	w := &expiryWorker{env: env, subjects: map[string]*expSubject{}, viewers: map[int]int{}}
	for i := range o.N {
		k := o.teamOf(i)
		if !ownsTeam(k, env.index, env.count) {
			continue
		}
		// Pairs share a node, so every node holds subjects and viewers alike
		// (i % targets would put every subject on one node of two).
		m := &member{idx: i, user: o.user(i), device: "web", team: k, target: (i / 2) % len(o.Targets)}
		w.ms = append(w.ms, m)
		if i%2 == 1 {
			w.subjects[m.user] = &expSubject{team: k, m: m}
		}
	}
	return w
}

type freezeArgs struct {
	WindowMS int64 `json:"window_ms"`
}

type freezeReply struct {
	Frozen int `json:"frozen"`
	Failed int `json:"failed"` // the last ping failed; frozen all the same
}

type expiryReply struct {
	Expected     int       `json:"expected"` // viewer × frozen subject pairs
	Got          int64     `json:"got"`
	Lag          Histogram `json:"lag"`   // every receipt, past last frame + ttl + grace
	First        Histogram `json:"first"` // per subject, the first receipt
	Unexpected   int64     `json:"unexpected"`
	Early        int64     `json:"early"` // receipts before last frame + ttl + grace
	Duplicates   int64     `json:"duplicates"`
	FromSnapshot int64     `json:"from_snapshot"` // offlines a reconnected viewer's snapshot gave
	Drops        int64     `json:"drops"`         // viewer connections that ended under the run
	DropReason   string    `json:"drop_reason,omitempty"`
}

func (w *expiryWorker) handle(ctx context.Context, op string, raw json.RawMessage) (any, error) {
	switch op {
	case "connect":
		r := connectAll(ctx, w.env, w.ms, w.options)
		w.armed.Store(true)
		w.ttl = time.Duration(r.TTLMS) * time.Millisecond
		for _, m := range w.ms {
			if _, subject := w.subjects[m.user]; !subject && m.c != nil {
				w.viewers[m.team]++
			}
		}
		return r, nil
	case "freeze":
		var a freezeArgs
		if err := decodeArgs(raw, &a); err != nil {
			return nil, err
		}
		return w.freeze(ctx, time.Duration(a.WindowMS)*time.Millisecond), nil
	case "await":
		var a awaitArgs
		if err := decodeArgs(raw, &a); err != nil {
			return nil, err
		}
		return w.await(ctx, time.Duration(a.TimeoutMS)*time.Millisecond), nil
	case "close":
		w.armed.Store(false)
		closeAll(w.ms)
		return struct{}{}, nil
	}
	return nil, unknownOp(op)
}

func (w *expiryWorker) options(m *member) client.Options {
	co := w.env.dial.options(m)
	if _, subject := w.subjects[m.user]; subject {
		return co
	}
	grace := w.env.o.Grace
	counting := co.OnStateChange
	co.OnStateChange = func(sc client.StateChange) {
		counting(sc)
		if sc.State == client.Disconnected && w.armed.Load() {
			if w.drops.Add(1) == 1 {
				w.dropMu.Lock()
				w.dropReason = fmt.Sprintf("%s: close code %d, %v", m.user, sc.CloseCode, sc.Err)
				w.dropMu.Unlock()
			}
		}
	}
	seen := map[string]bool{} // frozen subjects whose offline this viewer got; its reader's alone
	co.OnChange = func(ch client.Change) {
		if ch.FromSnapshot {
			if s := w.subjects[ch.UserID]; ch.State == protocol.StateOffline && s != nil && s.lastAt.Load() != 0 && !seen[ch.UserID] {
				seen[ch.UserID] = true
				w.fromSnapshot.Add(1)
			}
			return
		}
		w.env.ctr.changes.Add(1)
		if ch.State != protocol.StateOffline {
			return
		}
		s := w.subjects[ch.UserID]
		if s == nil || s.lastAt.Load() == 0 {
			w.unexpected.Add(1)
			return
		}
		if seen[ch.UserID] {
			w.duplicates.Add(1)
			return
		}
		seen[ch.UserID] = true
		due := time.Unix(0, s.lastAt.Load()).Add(w.ttl + grace)
		lag := ch.Received.Sub(due)
		if lag < 0 {
			w.early.Add(1)
		}
		w.lag.Record(lag)
		w.pairs.Add(1)
		s.firstAt.CompareAndSwap(0, ch.Received.UnixNano())
	}
	return co
}

// freeze makes every connected subject send a last ping and go silent, at
// a random moment within window.
func (w *expiryWorker) freeze(ctx context.Context, window time.Duration) freezeReply {
	var (
		mu sync.Mutex
		r  freezeReply
		wg sync.WaitGroup
	)
	for _, s := range w.subjects {
		if s.m.c == nil {
			continue
		}
		wg.Go(func() {
			if !sleepCtx(ctx, rand.N(window+1)) {
				return
			}
			at := time.Now()
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := s.m.c.Ping(pctx)
			cancel()
			s.m.c.Freeze(true)
			s.lastAt.Store(at.UnixNano())
			mu.Lock()
			r.Frozen++
			if err != nil {
				r.Failed++
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return r
}

// await waits until every viewer saw every frozen subject of its team go
// offline, or limit passes.
func (w *expiryWorker) await(ctx context.Context, limit time.Duration) expiryReply {
	var r expiryReply
	for _, s := range w.subjects {
		if s.lastAt.Load() != 0 {
			r.Expected += w.viewers[s.team]
		}
	}
	deadline := time.Now().Add(limit)
	for w.pairs.Load()+w.fromSnapshot.Load() < int64(r.Expected) && time.Now().Before(deadline) && sleepCtx(ctx, 20*time.Millisecond) {
	}
	r.Got = w.pairs.Load()
	r.FromSnapshot = w.fromSnapshot.Load()
	r.Duplicates = w.duplicates.Load()
	r.Drops = w.drops.Load()
	w.dropMu.Lock()
	r.DropReason = w.dropReason
	w.dropMu.Unlock()
	r.Lag = w.lag.take()
	for _, s := range w.subjects {
		if first, last := s.firstAt.Load(), s.lastAt.Load(); first != 0 {
			r.First.Record(time.Unix(0, first).Sub(time.Unix(0, last).Add(w.ttl + w.env.o.Grace)))
		}
	}
	r.Unexpected = w.unexpected.Load()
	r.Early = w.early.Load()
	return r
}

func (w *expiryWorker) close() { closeAll(w.ms) }

func driveExpiry(ctx context.Context, d *driver) error {
	o := d.o
	if err := d.setupTeams(ctx, teamPairs(o, o.N)); err != nil {
		return err
	}
	r, err := d.connectAndWait(ctx, "users", nil)
	if err != nil {
		return err
	}
	defer closeWorkers(ctx, d)
	s1, err := d.settle(ctx, time.Minute)
	if err != nil {
		return err
	}
	d.setStatusf(func(Progress) string { return "freezing subjects" })
	frozen, err := callAll[freezeReply](ctx, d, "freeze", freezeArgs{WindowMS: o.Window.Milliseconds()})
	if err != nil {
		return err
	}
	var fr freezeReply
	for _, x := range frozen {
		fr.Frozen += x.Frozen
		fr.Failed += x.Failed
	}
	ttl := time.Duration(r.TTLMS) * time.Millisecond
	d.setStatus("waiting for ttl + grace and the offlines")
	replies, err := callAll[expiryReply](ctx, d, "await", awaitArgs{TimeoutMS: (ttl + o.Grace + o.Window + 30*time.Second).Milliseconds()})
	if err != nil {
		return err
	}
	s2, err := d.scrape(ctx)
	if err != nil {
		return err
	}
	var t expiryReply
	for _, x := range replies {
		t.Expected += x.Expected
		t.Got += x.Got
		t.Lag.Merge(x.Lag)
		t.First.Merge(x.First)
		t.Unexpected += x.Unexpected
		t.Early += x.Early
		t.Duplicates += x.Duplicates
		t.FromSnapshot += x.FromSnapshot
		t.Drops += x.Drops
		t.DropReason = cmp.Or(t.DropReason, x.DropReason)
	}
	delta := s2.Sub(s1)
	res := d.res
	res.add("subjects_frozen", "subjects frozen", float64(fr.Frozen), "")
	res.add("ttl_ms", "server ttl (from welcome)", float64(ttl.Milliseconds()), "ms")
	res.addDur("lag_p50", "offline lag past ttl + grace p50", t.Lag.Quantile(0.5))
	res.addDur("lag_p99", "offline lag past ttl + grace p99", t.Lag.Quantile(0.99))
	res.goal(1000, false, "≤ 1 s")
	res.addDur("lag_max", "offline lag past ttl + grace max", t.Lag.Max())
	res.addDur("first_lag_p99", "first viewer's receipt, lag p99", t.First.Quantile(0.99))
	res.add("server_detection_p99_ms", "server's own expiry lag p99 (histogram)", delta.HistQuantile(mDetection, 0.99)*1000, "ms")
	res.add("expirations", "expirations counted by the servers", delta.Get(mExpirations), "")
	res.add("offlines_expected", "offline deliveries expected", float64(t.Expected), "")
	res.add("offlines_missing", "offline deliveries missing (neither sent nor in a reconnect's snapshot)", float64(int64(t.Expected)-t.Got-t.FromSnapshot), "")
	res.goal(0, false, "0")
	res.add("offlines_from_snapshot", "offlines a viewer learned from its reconnect's snapshot", float64(t.FromSnapshot), "")
	res.add("offlines_duplicate", "offlines delivered twice to a viewer", float64(t.Duplicates), "")
	res.goal(0, false, "0")
	res.add("viewer_drops", "viewer connections that ended under the load generator", float64(t.Drops), "")
	res.goal(0, false, "0")
	res.add("offlines_unexpected", "offlines of users who did not freeze", float64(t.Unexpected), "")
	res.goal(0, false, "0")
	res.add("offlines_early", "offlines before ttl + grace", float64(t.Early), "")
	res.goal(0, false, "0")
	res.serverFigures(s1, s2)
	if t.Drops > 0 {
		res.note("%d viewer connections ended before the run closed them; the first: %s", t.Drops, t.DropReason)
	}
	if fr.Failed > 0 {
		res.note("%d subjects' last ping failed before they froze", fr.Failed)
	}
	return nil
}
