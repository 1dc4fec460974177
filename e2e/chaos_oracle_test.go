package e2e

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/greendot/greendot/client"
)

// The oracle judges, after the run, what every viewer applied and every
// frame that reached it against what truly happened: the devices'
// connections as the harness made and ended them, their statuses, the
// memberships and the faults. The rules are DESIGN.md's semantics with the
// timings of the run:
//
//   - A device is surely live from its client's Connected to the end of that
//     connection (the harness's own act when it caused the end: a close, a
//     dropped socket, a kill -9 of its node), except while frozen. The server
//     sees a connection no later than the client does, and its end no
//     earlier, so the server's view lies inside these bounds.
//   - A device is maybe live a little longer: while frozen (the server only
//     learns at the ttl), until the survivors release a killed node's
//     connections (node liveness + a sweep; also one whose end the harness
//     caused less than 500 ms before the kill, which the node may not have
//     told Redis of, and with the status before one sent that late), during
//     a failed connect attempt (registered, then
//     refused), and until a fault that kept its node from telling Redis is
//     over.
//   - No false offline: an offline published at time a is false if the user
//     had a surely live device at a, or lost the last one less than the grace
//     before a (slack 250 ms). The one exemption: the user's live devices
//     were on a node cut off from Redis for 2 s or more (node liveness is 3 s,
//     refreshed every second), whose connections the others rightly release;
//     those are counted as "released", not hidden.
//   - No ghost: a viewer shows a user online or away while the truth is
//     offline for no longer than ttl + grace + 2 s; other disagreements (a
//     missed online, a wrong status) last no longer than 2 s. While Redis is
//     away, restarted, emptied, or the network between a concerned node and
//     Redis is faulty, these bounds start again when it is over plus the 5 s
//     sweep hold-off; such samples are "degraded", not violations.
//   - Every dot move a viewer applies is a state the truth allowed at the
//     change's time (±1 s); the same state again (a restatement) is counted,
//     and an offline restated outside a recovery is a doubled change. A
//     recovery: Redis faults and a concerned node's network faults, until
//     the hold-off after them is over, and the resyncs a node's kill -9
//     makes every node run (when it is found dead, and at its restart).
//   - On every connection, versions per subject strictly increase (a same
//     version again is a resend: allowed only as the resync after a Redis
//     fault or a membership change re-sends the current state), nothing
//     arrives about a user who shares no team with the viewer (1 s tolerance
//     for changes in flight; on a cluster, a change made while the viewer's
//     node was cut off, read at the heal with the removal held too), and
//     nothing about the viewer itself.
//   - After the faults stop and things settle, every viewer shows every
//     visible user's true state, and every node's HTTP answer agrees
//     (state and connection count); what does not is lost.

const (
	nodeTTL    = 3 * time.Second // redisstore's node liveness
	holdOff    = 5 * time.Second // redisstore's sweep hold-off after a gap
	slack      = 250 * time.Millisecond
	deliverLag = 2 * time.Second
	gridStep   = 100 * time.Millisecond
)

const (
	bOnline uint8 = 1 << iota
	bAway
	bOffline
)

func stateBit(s string) uint8 {
	switch s {
	case "online":
		return bOnline
	case "away":
		return bAway
	}
	return bOffline
}

func bitsString(b uint8) string {
	var out []string
	for _, s := range []string{"online", "away", "offline"} {
		if b&stateBit(s) != 0 {
			out = append(out, s)
		}
	}
	return strings.Join(out, "|")
}

// livePiece is a stretch of time a device was live on a node.
type livePiece struct {
	interval
	dev  *devCopy
	node string
	kind string    // how it ended: the session's end kind, or "frozen"
	key  time.Time // its session's start
}

// devCopy is a device's record, copied once the run is over.
type devCopy struct {
	d        *device
	user     string
	name     string
	sessions []session
	attempts []attempt
	freezes  []interval
	statuses []statusChange
	changes  []client.Change
	raws     []*rawConn
	byUser   map[string][]client.Change
	closedAt time.Time // the harness closed or dropped it for good
	dialErr  error     // its first connect failed
}

func (dc *devCopy) String() string { return dc.user + "/" + dc.name }

func (dc *devCopy) statusAt(t time.Time) string {
	s := "online"
	for _, st := range dc.statuses {
		if st.at.After(t) {
			break
		}
		s = st.state
	}
	return s
}

type seg struct {
	from          time.Time
	sure, maybe   string
	allowed       uint8
	surelyLiveDev int
}

type userTruth struct {
	id    string
	devs  []*devCopy
	sure  []livePiece // surely live
	maybe []interval  // maybe live (sessions stretched, attempts)
	// starts: while a device may show online as a new connection does,
	// whatever status it set: a session's first second, and a connect
	// attempt's whole course and the second after it (its client sends its
	// status only once welcomed, which a slow or frozen one may be late for).
	starts []interval
	segs   []seg
}

// sureAt is the state the surely live devices make at t (no grace).
func (u *userTruth) segAt(t time.Time) seg {
	i := sort.Search(len(u.segs), func(i int) bool { return u.segs[i].from.After(t) }) - 1
	if i < 0 {
		return seg{sure: "offline", maybe: "offline", allowed: bOffline}
	}
	return u.segs[i]
}

// allowedIn is every state the truth allowed at some moment of [a, b].
func (u *userTruth) allowedIn(a, b time.Time) uint8 {
	i := sort.Search(len(u.segs), func(i int) bool { return u.segs[i].from.After(a) }) - 1
	var bits uint8
	if i < 0 {
		bits = bOffline
		i = 0
	}
	for ; i < len(u.segs) && !u.segs[i].from.After(b); i++ {
		bits |= u.segs[i].allowed
	}
	return bits
}

// mustOnline: a surely live device at a, or one lost less than the grace
// ago; skip leaves pieces out (the exemption).
func (u *userTruth) mustOnline(a time.Time, grace time.Duration, skip func(livePiece, time.Time) bool) (bool, *livePiece) {
	for i := range u.sure {
		p := u.sure[i]
		if p.from.Add(slack).After(a) {
			continue
		}
		if p.to.IsZero() || a.Before(p.to.Add(grace-slack)) {
			if skip != nil && skip(p, a) {
				continue
			}
			return true, &u.sure[i]
		}
	}
	return false, nil
}

// lastLiveEnd is the end of the latest surely live piece ended by t.
func (u *userTruth) lastLiveEnd(t time.Time) (time.Time, *livePiece) {
	var best time.Time
	var bp *livePiece
	for i := range u.sure {
		p := u.sure[i]
		if p.to.IsZero() || p.to.After(t) {
			if p.from.Before(t) {
				return time.Time{}, nil // live at t
			}
			continue
		}
		if p.to.After(best) {
			best, bp = p.to, &u.sure[i]
		}
	}
	return best, bp
}

type oracle struct {
	w        *world
	tm       timing
	from, to time.Time
	devs     []*devCopy
	users    map[string]*userTruth
	shared   map[sharedKey][]interval

	fig        map[string]int
	secs       map[string]time.Duration
	lags       map[string][]time.Duration
	violations map[string][]string // the first few of each kind, for the report
	all        []string            // every one, for the record
}

func newOracle(w *world, from, to time.Time) *oracle {
	o := &oracle{w: w, tm: w.cfg.tm, from: from, to: to, users: map[string]*userTruth{},
		shared: map[sharedKey][]interval{}, fig: map[string]int{}, secs: map[string]time.Duration{},
		lags: map[string][]time.Duration{}, violations: map[string][]string{}}
	for _, u := range w.cfg.userIDs() {
		o.users[u] = &userTruth{id: u}
	}
	w.mu.Lock()
	devs := slices.Clone(w.devices)
	w.mu.Unlock()
	for _, d := range devs {
		d.mu.Lock()
		dc := &devCopy{d: d, user: d.user, name: d.name, attempts: nil,
			freezes: slices.Clone(d.freezes), statuses: slices.Clone(d.statuses),
			changes: slices.Clone(d.changes), raws: slices.Clone(d.raws), byUser: map[string][]client.Change{},
			closedAt: d.closedAt, dialErr: d.dialErr}
		for _, s := range d.sessions {
			dc.sessions = append(dc.sessions, *s)
		}
		for _, a := range d.attempts {
			dc.attempts = append(dc.attempts, *a)
		}
		d.mu.Unlock()
		for _, ch := range dc.changes {
			dc.byUser[ch.UserID] = append(dc.byUser[ch.UserID], ch)
		}
		o.devs = append(o.devs, dc)
		o.users[d.user].devs = append(o.users[d.user].devs, dc)
	}
	for _, u := range o.users {
		o.buildTruth(u)
	}
	return o
}

func (o *oracle) violate(kind, format string, args ...any) {
	o.fig[kind]++
	msg := fmt.Sprintf(format, args...)
	if len(o.violations[kind]) < 12 {
		o.violations[kind] = append(o.violations[kind], msg)
	}
	if len(o.all) < 10000 {
		o.all = append(o.all, kind+": "+msg)
	}
}

func (o *oracle) at(t time.Time) string { return o.w.since(t) }

// redisFaultsAround lists the faults that keep node (or everyone) from Redis.
func (o *oracle) netFault(f *faultWindow) bool {
	return f.redis || strings.HasPrefix(f.kind, "partition") || strings.HasPrefix(f.kind, "latency")
}

// faultHolding returns the fault, if any, during which node could not tell
// Redis what happened at t.
func (o *oracle) faultHolding(node string, t time.Time) *faultWindow {
	for _, f := range o.w.faults {
		if o.netFault(f) && (f.redis || f.node == node) && f.contains(t) {
			return f
		}
	}
	return nil
}

// killedWithin returns when node was killed (kill -9) within [from, to],
// or zero.
func (o *oracle) killedWithin(node string, from, to time.Time) time.Time {
	for _, f := range o.w.faults {
		if f.kind == "kill -9" && f.node == node && !f.from.Before(from) && !f.from.After(to) {
			return f.from
		}
	}
	return time.Time{}
}

func (o *oracle) buildTruth(u *userTruth) {
	far := o.to.Add(time.Hour)
	var bounds []time.Time
	// A maybe-live connection keeps the status it had when it ended: the
	// device's later statuses go to its next connection.
	type mIv struct {
		interval
		dev      *devCopy
		key      time.Time // the session's start; zero for an attempt
		statusAt time.Time // its status is the device's as of then (zero: now)
	}
	var maybe []mIv
	for _, dc := range u.devs {
		for _, s := range dc.sessions {
			end := s.end
			if end.IsZero() {
				end = far
			}
			// Surely live: the session minus its freezes.
			pieces := []livePiece{{interval: interval{from: s.start, to: end}, dev: dc, node: s.node, kind: s.endKind, key: s.start}}
			for _, f := range dc.freezes {
				fto := f.to
				if fto.IsZero() {
					fto = far
				}
				var next []livePiece
				for _, p := range pieces {
					if !f.overlaps(p.from, p.to) || !fto.After(p.from) || !f.from.Before(p.to) {
						next = append(next, p)
						continue
					}
					if f.from.After(p.from) {
						q := p
						q.to, q.kind = f.from, "frozen"
						next = append(next, q)
					}
					// After a thaw the connection surely lives on only if
					// the server cannot have reaped it meanwhile: the last
					// frame may be a heartbeat before the freeze, the next
					// one a heartbeat after the thaw. (A frozen device does
					// not read, so it may learn of the reap only at the thaw.)
					if fto.Before(p.to) && fto.Sub(f.from)+2*o.tm.heartbeat+300*time.Millisecond < o.tm.ttl {
						q := p
						q.from = fto
						next = append(next, q)
					}
				}
				pieces = next
			}
			u.sure = append(u.sure, pieces...)
			// Maybe live: until the server can have noticed the end.
			mend := end
			var killed time.Time
			switch s.endKind {
			case "node killed":
				mend = end.Add(nodeTTL + 1500*time.Millisecond)
				killed = end
			default:
				mend = end.Add(500 * time.Millisecond)
				// Its node killed before it can have told Redis of the end
				// (a close sent just before a kill -9): the connection stays
				// until the survivors release the node's.
				if k := o.killedWithin(s.node, end, mend); !k.IsZero() {
					mend = k.Add(nodeTTL + 1500*time.Millisecond)
					killed = k
				}
			}
			if f := o.faultHolding(s.node, end); f != nil && !f.to.IsZero() {
				if lim := f.to.Add(holdOff + time.Second); lim.After(mend) {
					mend = lim
				}
			}
			iv := interval{from: s.start, to: mend}
			maybe = append(maybe, mIv{interval: iv, dev: dc, key: s.start, statusAt: s.end})
			// A status sent less than 500 ms before its node's kill -9 may
			// never have reached Redis (chaos seed 8888206): the lingering
			// connection may hold the status before it.
			if !killed.IsZero() {
				for _, st := range dc.statuses {
					if st.at.Before(killed.Add(-500*time.Millisecond)) || st.at.After(s.end) {
						continue
					}
					maybe = append(maybe, mIv{interval: iv, dev: dc, key: s.start, statusAt: st.at.Add(-time.Nanosecond)})
				}
			}
			// A device frozen in its session's first second may not have
			// sent its status yet (the client re-asserts away once
			// welcomed): the connection shows online until the thaw, or
			// until the server reaps it and the grace is over (chaos, one
			// Redis, seed 800521752: a reconnect frozen at once).
			startTo := s.start.Add(time.Second)
			for _, f := range dc.freezes {
				if f.from.After(startTo) || (!f.to.IsZero() && !f.to.After(s.start)) {
					continue
				}
				until := f.to.Add(time.Second)
				if f.to.IsZero() || f.to.After(end) {
					until = end.Add(o.tm.grace + 500*time.Millisecond)
				}
				if until.After(startTo) {
					startTo = until
				}
			}
			u.starts = append(u.starts, interval{from: s.start, to: startTo})
		}
		for _, a := range dc.attempts {
			// The server registers a connection before its welcome: from
			// the dial on, the user may be online (and stays so a moment
			// after a refused attempt).
			to := a.to
			if to.IsZero() {
				to = far
			}
			to = to.Add(300 * time.Millisecond)
			// A refused connect whose registration was held on the way to
			// Redis may still be written when the fault is over.
			if f := o.faultHolding(a.node, a.to); !a.ok && f != nil && !f.to.IsZero() && f.to.Add(time.Second).After(to) {
				to = f.to.Add(time.Second)
			}
			maybe = append(maybe, mIv{interval: interval{from: a.from, to: to}, dev: dc})
			until := far
			if !a.to.IsZero() {
				until = a.to.Add(time.Second)
			}
			u.starts = append(u.starts, interval{from: a.from, to: until})
		}
		for _, st := range dc.statuses {
			bounds = append(bounds, st.at)
		}
	}
	for _, p := range u.sure {
		bounds = append(bounds, p.from, p.to)
	}
	for _, m := range maybe {
		bounds = append(bounds, m.from, m.to)
		u.maybe = append(u.maybe, m.interval)
	}
	for _, s := range u.starts {
		bounds = append(bounds, s.from, s.to)
	}
	g := o.tm.grace + 500*time.Millisecond
	n := len(bounds)
	for i := 0; i < n; i++ {
		bounds = append(bounds, bounds[i].Add(g))
	}
	slices.SortFunc(bounds, func(a, b time.Time) int { return a.Compare(b) })
	bounds = slices.CompactFunc(bounds, func(a, b time.Time) bool { return a.Equal(b) })
	type ent struct {
		status string
	}
	stateOf := func(ents []ent) string {
		st := "offline"
		for _, e := range ents {
			if e.status == "online" {
				return "online"
			}
			st = "away"
		}
		return st
	}
	for _, b := range bounds {
		// The connections surely live at b, and those maybe live.
		var sure, maybes []ent
		covered := map[*devCopy]map[time.Time]bool{}
		for _, p := range u.sure {
			if p.contains(b) {
				sure = append(sure, ent{p.dev.statusAt(b)})
				if covered[p.dev] == nil {
					covered[p.dev] = map[time.Time]bool{}
				}
				covered[p.dev][p.key] = true
			}
		}
		for _, m := range maybe {
			if !m.contains(b) || (!m.key.IsZero() && covered[m.dev][m.key]) {
				continue
			}
			at := b
			if !m.statusAt.IsZero() && m.statusAt.Before(b) {
				at = m.statusAt
			}
			maybes = append(maybes, ent{m.dev.statusAt(at)})
		}
		s := seg{from: b, sure: stateOf(sure), maybe: stateOf(append(slices.Clone(sure), maybes...))}
		s.allowed = stateBit(s.sure) | stateBit(s.maybe)
		// Any of the maybe-live connections may be live or not: every mix.
		if len(maybes) > 1 && len(maybes) <= 8 {
			for mask := 1; mask < 1<<len(maybes); mask++ {
				set := slices.Clone(sure)
				for i, e := range maybes {
					if mask&(1<<i) != 0 {
						set = append(set, e)
					}
				}
				s.allowed |= stateBit(stateOf(set))
			}
		}
		for _, st := range u.starts {
			if st.contains(b) {
				s.allowed |= bOnline // a new connection starts online
			}
		}
		// The grace keeps the last state for a while after the last device.
		if s.sure == "offline" || s.maybe == "offline" {
			for j := len(u.segs) - 1; j >= 0; j-- {
				s.allowed |= stateBit(u.segs[j].sure) | stateBit(u.segs[j].maybe)
				if !u.segs[j].from.After(b.Add(-g)) {
					break // the segment current at b-g
				}
			}
		}
		u.segs = append(u.segs, s)
	}
}

// sharedIntervals is when users a and b shared at least one team: surely
// (certain), or possibly (the requests in flight count).
func (o *oracle) sharedIntervals(a, b string, certain bool) []interval {
	if a > b {
		a, b = b, a
	}
	key := sharedKey{a, b, certain}
	if iv, ok := o.shared[key]; ok {
		return iv
	}
	span := func(s *memberSpan) (interval, bool) {
		if certain {
			return s.certain()
		}
		return s.interval, true
	}
	var out []interval
	for _, sa := range o.w.spans {
		ia, ok := span(sa)
		if sa.user != a || !ok {
			continue
		}
		for _, sb := range o.w.spans {
			ib, ok := span(sb)
			if sb.user != b || sb.team != sa.team || !ok {
				continue
			}
			from := ia.from
			if ib.from.After(from) {
				from = ib.from
			}
			to := ia.to
			if to.IsZero() || (!ib.to.IsZero() && ib.to.Before(to)) {
				to = ib.to
			}
			if to.IsZero() || to.After(from) {
				out = append(out, interval{from: from, to: to})
			}
		}
	}
	// Merge.
	slices.SortFunc(out, func(x, y interval) int { return x.from.Compare(y.from) })
	var merged []interval
	for _, iv := range out {
		if k := len(merged); k > 0 && (merged[k-1].to.IsZero() || !iv.from.After(merged[k-1].to)) {
			if !merged[k-1].to.IsZero() && (iv.to.IsZero() || iv.to.After(merged[k-1].to)) {
				merged[k-1].to = iv.to
			}
			continue
		}
		merged = append(merged, iv)
	}
	o.shared[key] = merged
	return merged
}

type sharedKey struct {
	a, b    string
	certain bool
}

// visibleSince returns since when a and b surely share a team without a
// break up to t (zero if they do not surely share one at t).
func (o *oracle) visibleSince(a, b string, t time.Time) time.Time {
	for _, iv := range o.sharedIntervals(a, b, true) {
		if iv.contains(t) {
			return iv.from
		}
	}
	return time.Time{}
}

// visibleDuring reports whether a and b may have shared a team at some
// moment of [from, to].
func (o *oracle) visibleDuring(a, b string, from, to time.Time) bool {
	for _, iv := range o.sharedIntervals(a, b, false) {
		if iv.overlaps(from, to) {
			return true
		}
	}
	return false
}

// excused reports the fault, if any, that lets a disagreement at t last
// longer: Redis-wide faults, or network faults on the viewer's node or on a
// node where the subject had a device or tried to connect one.
func (o *oracle) excused(viewerNode string, u *userTruth, t time.Time, lag time.Duration) *faultWindow {
	for _, f := range o.w.faults {
		if !o.netFault(f) || f.from.After(t) {
			continue
		}
		if !f.to.IsZero() && t.After(f.to.Add(holdOff+lag)) {
			continue
		}
		if f.redis || f.node == viewerNode {
			return f
		}
		for _, p := range u.sure {
			if p.node == f.node && p.overlaps(f.from.Add(-lag), t) {
				return f
			}
		}
		for _, dc := range u.devs {
			for _, s := range dc.sessions {
				if s.node == f.node && (interval{from: s.start, to: s.end}).overlaps(f.from.Add(-lag), t) {
					return f
				}
			}
			// A connect tried there: refused, its registration may be
			// written at the heal, and live until its end is (chaos seed
			// 372444857).
			for _, a := range dc.attempts {
				if a.node == f.node && (interval{from: a.from, to: a.to}).overlaps(f.from.Add(-lag), t) {
					return f
				}
			}
		}
	}
	return nil
}

// cutOff is the exemption: the piece's node was cut off from Redis around
// a, long enough for node liveness to lapse (longCut).
func (o *oracle) cutOff(p livePiece, a time.Time) bool {
	for _, f := range o.w.faults {
		if f.node == p.node && longCut(f) && f.overlaps(a.Add(-o.tm.grace-nodeTTL-time.Second), a) {
			return true
		}
	}
	return false
}

// longCut reports whether f cut its node off from Redis for 2 s or more:
// node liveness (3 s, refreshed every second) can lapse, and the others
// then take the node for dead.
func longCut(f *faultWindow) bool {
	return strings.HasPrefix(f.kind, "partition") && !f.to.IsZero() && f.to.Sub(f.from) >= 2*time.Second
}

// recovering reports whether a viewer on node may be re-sent current state
// at t: a Redis fault or a network fault of its node just ended, or a
// membership change of the viewer or subject just happened.
func (o *oracle) recovering(node, viewer, subject string, t time.Time) bool {
	for _, f := range o.w.faults {
		if !o.netFault(f) || !(f.redis || f.node == node) || f.from.After(t) {
			continue
		}
		if f.to.IsZero() || !t.After(f.to.Add(holdOff+3*time.Second)) {
			return true
		}
	}
	for _, f := range o.w.faults {
		// A node killed: every node resyncs when the survivors find it
		// dead (its liveness after its last beat, which came up to a
		// second before the kill, then a sweep and a health check), and
		// when it starts again under its id while still listed
		// (redisstore's tellNodeDead), whatever node the viewer is on:
		// within 3 s of either. A node cut off long enough for its
		// liveness to lapse is found dead the same way (chaos seed
		// 618395093).
		if f.kind != "kill -9" && !longCut(f) {
			continue
		}
		found := f.from.Add(nodeTTL - time.Second)
		if !t.Before(found) && !t.After(found.Add(2*time.Second+3*time.Second)) {
			return true
		}
		// The new process tells at its first beat, before it answers
		// (chaos seed 621771424: 50 ms before the fault's end).
		restarted := f.to
		if !f.started.IsZero() {
			restarted = f.started
		}
		if !f.to.IsZero() && !t.Before(restarted) && !t.After(f.to.Add(3*time.Second)) {
			return true
		}
	}
	for _, s := range o.w.spans {
		if s.user != viewer && s.user != subject {
			continue
		}
		for _, m := range []time.Time{s.from, s.to} {
			if !m.IsZero() && !m.After(t) && t.Sub(m) < 3*time.Second {
				return true
			}
		}
	}
	return false
}

// sessionAt is the device's session at t; a snapshot's changes are applied
// just before the client reports the connection, so a session starting
// right after t counts.
func (o *oracle) sessionAt(dc *devCopy, t time.Time) *session {
	for i := range dc.sessions {
		s := &dc.sessions[i]
		if !s.start.After(t.Add(time.Second)) && (s.end.IsZero() || t.Before(s.end)) {
			return s
		}
	}
	return nil
}

func (o *oracle) describeTruth(u *userTruth, t time.Time) string {
	sg := u.segAt(t)
	var live []string
	for _, p := range u.sure {
		if p.contains(t) {
			live = append(live, fmt.Sprintf("%s on %s since %s", p.dev.name, p.node, o.at(p.from)))
		}
	}
	desc := fmt.Sprintf("truth %s (maybe %s)", sg.sure, sg.maybe)
	if len(live) > 0 {
		desc += ", live: " + strings.Join(live, ", ")
	} else if end, p := u.lastLiveEnd(t); p != nil {
		desc += fmt.Sprintf(", last device %s on %s ended %q at %s", p.dev.name, p.node, p.kind, o.at(end))
	} else {
		desc += ", never live"
	}
	return desc
}

// judgeChanges checks every change each viewer applied.
func (o *oracle) judgeChanges() {
	for _, v := range o.devs {
		for _, ch := range v.changes {
			if ch.Received.Before(o.from) || ch.Received.After(o.to) {
				continue
			}
			u := o.users[ch.UserID]
			if u == nil {
				o.violate("visibility", "%s applied a change of unknown user %q", v, ch.UserID)
				continue
			}
			a := ch.Received
			if !ch.FromSnapshot && ch.At.After(o.from.Add(-time.Minute)) {
				a = ch.At
			}
			sess := o.sessionAt(v, ch.Received)
			node := ""
			if sess != nil {
				node = sess.node
			}
			if ch.State == ch.Previous || (ch.Previous == "" && ch.State == "offline") {
				o.fig["restatements"]++
				o.fig["restatements "+ch.State]++
				// Judged when it was made: a frozen viewer reads at the
				// thaw what a recovery restated during the freeze.
				made := ch.Received
				if a.Before(made) {
					made = a
				}
				if ch.State == "offline" && ch.Previous != "" && !ch.FromSnapshot && !o.recovering(node, v.user, ch.UserID, made) {
					o.violate("doubled", "%s on %s applied %s=offline v%d at %s while already showing offline (not in a recovery); %s",
						v, node, ch.UserID, ch.Version, o.at(ch.Received), o.describeTruth(u, a))
				}
				continue
			}
			o.fig["changes observed"]++
			since := o.visibleSince(v.user, ch.UserID, ch.Received)
			// An offline inferred from a snapshot that leaves the subject
			// out is out of sight too if the snapshot may have been read
			// before the membership surely held (a join in flight).
			inferred := ch.FromSnapshot && ch.State == "offline" && since.After(o.dialed(v, ch.Received))
			if since.IsZero() || since.After(ch.Received.Add(-time.Second)) || inferred {
				// Out of sight: a snapshot of a viewer who left the subject's
				// teams drops them (what was sent is judged by judgeFrames).
				o.fig["changes out of sight"]++
				continue
			}
			if ch.State == "offline" {
				o.judgeOffline(v, node, u, ch, a)
				continue
			}
			if u.allowedIn(a.Add(-time.Second), a.Add(time.Second))&stateBit(ch.State) == 0 {
				if f := o.excused(node, u, a, deliverLag); f != nil {
					o.fig["spurious in a fault (excused)"]++
					continue
				}
				o.violate("spurious", "%s on %s applied %s=%s v%d (from %s, at %s, snapshot %v) which the truth never allowed within 1s; %s",
					v, node, ch.UserID, ch.State, ch.Version, ch.Previous, o.at(a), ch.FromSnapshot, o.describeTruth(u, a))
			}
		}
	}
}

// dialed is when v dialed the connection it held at t.
func (o *oracle) dialed(v *devCopy, t time.Time) time.Time {
	var dialed time.Time
	for _, rc := range v.raws {
		if !rc.dialed.After(t) && rc.dialed.After(dialed) {
			dialed = rc.dialed
		}
	}
	return dialed
}

func (o *oracle) judgeOffline(v *devCopy, node string, u *userTruth, ch client.Change, a time.Time) {
	g := o.tm.grace
	false_ := false
	var piece *livePiece
	if ch.FromSnapshot {
		// Inferred from a (re)connect snapshot that no longer lists the
		// user: false if the user was online throughout the connect.
		false_ = true
		for t := o.dialed(v, ch.Received); !t.After(ch.Received); t = t.Add(gridStep) {
			if ok, p := u.mustOnline(t, g, nil); !ok {
				false_ = false
				break
			} else {
				piece = p
			}
		}
	} else {
		false_, piece = u.mustOnline(a, g, nil)
	}
	if false_ {
		if ok, _ := u.mustOnline(a, g, o.cutOff); !ok {
			o.fig["released (node cut off)"]++
			return
		}
		o.violate("false offline", "%s on %s applied %s=offline v%d at %s (received %s, snapshot %v) while %s was live on %s since %s (ended %q at %s); %s",
			v, node, ch.UserID, ch.Version, o.at(a), o.at(ch.Received), ch.FromSnapshot, piece.dev.name, piece.node,
			o.at(piece.from), piece.kind, o.atOrOpen(piece.to), o.describeTruth(u, a))
		return
	}
	// A true offline: how long after the user's last device went.
	if end, p := u.lastLiveEnd(ch.Received); p != nil && u.segAt(ch.Received).sure == "offline" && !ch.FromSnapshot {
		for _, f := range v.freezes {
			if f.overlaps(end, ch.Received) {
				return // the viewer did not read meanwhile
			}
		}
		watching := false
		for _, vp := range o.users[v.user].sure {
			if vp.dev == v && !vp.from.After(end) && (vp.to.IsZero() || !vp.to.Before(ch.Received)) {
				watching = true
			}
		}
		if !watching {
			return // it connected since: its snapshot's delay is no offline lag
		}
		lag := ch.Received.Sub(end)
		cause := p.kind
		if o.excused(node, u, ch.Received, o.tm.ttl+o.tm.grace+2*time.Second) != nil {
			o.lags["in a Redis or network fault"] = append(o.lags["in a Redis or network fault"], lag)
			return
		}
		o.lags["all"] = append(o.lags["all"], lag)
		o.lags[cause] = append(o.lags[cause], lag)
	}
}

func (o *oracle) atOrOpen(t time.Time) string {
	if t.IsZero() || t.After(o.to) {
		return "end"
	}
	return o.at(t)
}

// removalHeldAtAHeal reports whether a frame about subject that reached
// viewer on node at recv may be a change made while node was cut off from a
// cluster, where the removal that ended their last shared team was held
// too: the membership and team channels live on different masters, so the
// node reads both at the heal in no set order (finding 21). On one Redis
// they share a connection, and this is a violation.
func (o *oracle) removalHeldAtAHeal(node, viewer, subject string, recv time.Time) bool {
	if o.w.cfg.topology != "cluster" {
		return false
	}
	var removed time.Time
	for _, iv := range o.sharedIntervals(viewer, subject, false) {
		if !iv.to.IsZero() && iv.to.Before(recv) && iv.to.After(removed) {
			removed = iv.to
		}
	}
	if removed.IsZero() {
		return false
	}
	for _, f := range o.w.faults {
		if f.node == node && strings.HasPrefix(f.kind, "partition") && !f.to.IsZero() &&
			!f.from.After(removed.Add(100*time.Millisecond)) && f.to.After(removed) && !recv.After(f.to.Add(time.Second)) {
			return true
		}
	}
	return false
}

// judgeFrames checks the raw frames of every connection.
func (o *oracle) judgeFrames() {
	for _, v := range o.devs {
		lastDev := map[string]uint64{}
		for _, rc := range v.raws {
			rc.mu.Lock()
			entries := slices.Clone(rc.entries)
			rc.mu.Unlock()
			last := map[string]uint64{}
			for _, e := range entries {
				if e.recv.Before(o.from) || e.recv.After(o.to) {
					continue
				}
				o.fig["entries received"]++
				if e.user == v.user {
					o.violate("self", "%s on %s was sent its own presence %s v%d at %s", v, rc.node, e.state, e.version, o.at(e.recv))
					continue
				}
				// A frozen device reads at the thaw what was sent during
				// the freeze: it may have been sent since the freeze began.
				sent := e.recv.Add(-time.Second)
				for _, f := range v.freezes {
					if f.overlaps(sent, e.recv) && f.from.Add(-time.Second).Before(sent) {
						sent = f.from.Add(-time.Second)
					}
				}
				afterFreeze := !sent.Equal(e.recv.Add(-time.Second))
				// A change is not sent before it happened, but may be held
				// on the way (a partition): it was in flight since then.
				if e.at != 0 {
					if at := time.UnixMilli(e.at).Add(-100 * time.Millisecond); at.Before(sent) {
						sent = at
					}
				}
				if !o.visibleDuring(v.user, e.user, sent, e.recv) {
					if o.removalHeldAtAHeal(rc.node, v.user, e.user, e.recv) {
						o.fig["visibility at a heal (cluster)"]++
					} else {
						o.violate("visibility", "%s on %s was sent %s=%s v%d at %s (snapshot %v) though they shared no team within 1s",
							v, rc.node, e.user, e.state, e.version, o.at(e.recv), e.snapshot)
					}
				}
				prev, seen := last[e.user]
				switch {
				case seen && e.version < prev:
					o.violate("out of order", "%s on %s got %s=%s v%d at %s after v%d on the same connection",
						v, rc.node, e.user, e.state, e.version, o.at(e.recv), prev)
				case seen && e.version == prev:
					if afterFreeze || o.recovering(rc.node, v.user, e.user, e.recv) {
						o.fig["resent in a recovery"]++
					} else {
						o.violate("resent", "%s on %s got %s=%s v%d twice on one connection (again at %s)",
							v, rc.node, e.user, e.state, e.version, o.at(e.recv))
					}
				case !seen && e.snapshot && lastDev[e.user] > e.version:
					o.violate("out of order", "%s on %s: the snapshot at %s lists %s=%s v%d, older than v%d it held from an earlier connection",
						v, rc.node, o.at(e.recv), e.user, e.state, e.version, lastDev[e.user])
				}
				if e.version > last[e.user] {
					last[e.user] = e.version
				}
				if e.version > lastDev[e.user] {
					lastDev[e.user] = e.version
				}
			}
		}
	}
}

// shownAt is what viewer v's map showed for user at t.
func shownAt(v *devCopy, user string, t time.Time) (string, time.Time) {
	chs := v.byUser[user]
	i := sort.Search(len(chs), func(i int) bool { return chs[i].Received.After(t) }) - 1
	if i < 0 {
		return "offline", time.Time{}
	}
	st := chs[i].State
	if st == "" {
		st = "offline"
	}
	return st, chs[i].Received
}

type episode struct {
	from, last time.Time
	kind       string
	shown      string
	since      time.Time
	node       string
}

// judgeScreens samples every viewer's map on a grid while it is connected
// and not frozen, against the truth.
func (o *oracle) judgeScreens() {
	ghostLag := o.tm.ttl + o.tm.grace + 2*time.Second
	for _, v := range o.devs {
		viewer := o.users[v.user]
		for _, p := range viewer.sure {
			if p.dev != v {
				continue
			}
			from := p.from.Add(time.Second)
			if from.Before(o.from) {
				from = o.from
			}
			to := p.to
			if to.IsZero() || to.After(o.to) {
				to = o.to
			}
			open := map[string]*episode{}
			closeEp := func(user string) {
				ep := open[user]
				delete(open, user)
				if ep == nil {
					return
				}
				u := o.users[user]
				dur := ep.last.Sub(ep.from) + gridStep
				kind := ep.kind
				if !ep.since.IsZero() && ep.since.Before(o.visibleSince(v.user, user, ep.from)) {
					kind += " (stale from before a re-join)"
				}
				o.violate(kind, "%s on %s showed %s=%s (applied %s) from %s to %s; %s",
					v, ep.node, user, ep.shown, o.atOrOpen(ep.since), o.at(ep.from), o.at(ep.last.Add(gridStep)), o.describeTruth(u, ep.from))
				o.fig[ep.kind+" episodes"]++
				o.secs[ep.kind+"-seconds"] += dur
			}
			for t := from; t.Before(to); t = t.Add(gridStep) {
				for id, u := range o.users {
					if id == v.user {
						continue
					}
					since := o.visibleSince(v.user, id, t)
					if since.IsZero() || t.Sub(since) < deliverLag {
						closeEp(id)
						continue
					}
					shown, applied := shownAt(v, id, t)
					sure := u.segAt(t).sure
					lag := deliverLag
					if shown != "offline" && sure == "offline" {
						lag = ghostLag
					}
					if u.allowedIn(t.Add(-lag), t)&stateBit(shown) != 0 {
						closeEp(id)
						continue
					}
					if f := o.excused(p.node, u, t, lag); f != nil {
						o.secs["degraded-seconds"] += gridStep
						closeEp(id)
						continue
					}
					kind := "lost"
					switch {
					case shown != "offline" && sure == "offline":
						kind = "ghost"
					case shown == "offline":
						kind = "missed online"
					default:
						kind = "wrong status"
					}
					if ep := open[id]; ep != nil && ep.kind == kind && ep.shown == shown {
						ep.last = t
						continue
					}
					closeEp(id)
					open[id] = &episode{from: t, last: t, kind: kind, shown: shown, since: applied, node: p.node}
				}
			}
			for id := range open {
				closeEp(id)
			}
		}
	}
}

// transitions counts the true dot moves (state changes of the surely live
// devices) within the judged period.
func (o *oracle) transitions() int {
	n := 0
	for _, u := range o.users {
		prev := u.segAt(o.from).sure
		for _, s := range u.segs {
			if s.from.Before(o.from) || s.from.After(o.to) {
				continue
			}
			if s.sure != prev {
				n++
				prev = s.sure
			}
		}
	}
	return n
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}
