package redisstore

// A model-based test: the Lua scripts re-implement the rules of the pure
// tracker (presence.Tracker), so random operation sequences are driven
// through the memory store and the Redis store side by side and the two
// are compared after every step: every user's state, connection count,
// devices and last_seen, the changes each published in the step (as
// user=state sequences; versions compared by order, strictly increasing
// per user in both, not by value), what Pub/Sub delivered, team
// membership and membership events. User statuses (SetUserStatus, and
// their expiry by the sweeps) are driven alike: what viewers see is
// compared by state, text, emoji and whether an expiry and a last seen are
// shown; the status changes each store reported by mode, text, emoji and
// expiry; every user's version is the last of its changes and status
// changes.
//
// Time. The memory store runs on an injected clock that the test sets to
// the wall clock before each of its calls; the Redis store runs on Redis's
// clock, the same wall clock on this machine. Advancing time is waiting, on
// both, with short deadlines. The only deadline either store acts on by
// itself is the grace end (the memory store also expires silent
// connections, see below): before each sweep the test waits until no grace
// ends within a margin of it, so both sweeps fall on the same side of
// every grace end, and a sweep that overran the margin is reported as
// inconclusive, not as a disagreement.
//
// Expiry. The memory store expires a silent connection itself after the
// ttl. The Redis store leaves that to the server, which closes a silent
// socket and calls Disconnect with cause Expired (its sweep only has a
// safety net at 2×ttl): the test does what the server does, calling
// Disconnect(Expired) on the Redis store for every connection the memory
// store expired, on the node holding it. Heartbeats are batched by the
// Redis store; the test flushes the batch after each heartbeat, as the
// flush loop would a moment later.
//
// Node loss. Connections live on node "a" or "b", two Redis stores on one
// Redis. Losing b is kill9 (no goodbye); a's sweeps release b's
// connections once b's liveness is NodeTTL old. The memory store has no
// nodes: what presence.Tracker.DisconnectNode does (each of the node's
// connections removed with cause Lost) is done through Disconnect(Lost) in
// the memory store, when the Redis store released them. The order in which
// one user's connections are removed may show in what is published (see
// lossOrders); the test takes an order the pure tracker allows that yields
// what Redis published, and fails if there is none.
//
// Run longer: go test -race -run Model ./store/redisstore/ -rapid.checks=200
// (or RAPID_CHECKS=200), which both TestModelSingleServer and
// TestModelCluster (a 3-master Redis Cluster) then run; replay a failure
// with the -rapid.seed it prints (timing is real, so a replay may pass).

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/memstore"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

const (
	modelTTL     = 900 * time.Millisecond
	modelGrace   = 300 * time.Millisecond
	modelNodeTTL = 450 * time.Millisecond
	// modelMargin keeps sweeps this far from any grace end: more than a
	// sweep of both stores takes.
	modelMargin = 30 * time.Millisecond
	// modelSeenTolerance bounds how far apart the stores' last_seen may be:
	// they read one clock, a few calls apart, and Redis keeps milliseconds.
	modelSeenTolerance = 40 * time.Millisecond
	modelTeam          = "x"   // the team membership steps change
	modelAll           = "all" // every user's team, watched by node a
	modelMaxConns      = 3     // per user
)

var modelUsers = []string{"u0", "u1", "u2"}

// setModelChecks sets the number of rapid checks to n, small enough for
// both runs under -race on two shared cores in half a minute, unless
// -rapid.checks or RAPID_CHECKS asks for another.
func setModelChecks(n int) {
	checksGiven.Do(func() {
		checksOnCommandLine = os.Getenv("RAPID_CHECKS") != ""
		flag.Visit(func(f *flag.Flag) { checksOnCommandLine = checksOnCommandLine || f.Name == "rapid.checks" })
	})
	if !checksOnCommandLine {
		_ = flag.Set("rapid.checks", fmt.Sprint(n))
	}
}

var (
	checksGiven         sync.Once
	checksOnCommandLine bool
)

func TestModelSingleServer(t *testing.T) {
	setModelChecks(3)
	r := redistest.Start(t)
	rapid.Check(t, func(rt *rapid.T) {
		if _, err := r.Do("FLUSHALL"); err != nil {
			rt.Fatal(err)
		}
		runModel(rt, r.URL())
	})
}

func TestModelCluster(t *testing.T) {
	setModelChecks(2)
	c := redistest.StartCluster(t, 3)
	rapid.Check(t, func(rt *rapid.T) {
		for _, n := range c.Nodes {
			if _, err := n.Do("FLUSHALL"); err != nil {
				rt.Fatal(err)
			}
		}
		runModel(rt, c.URL())
	})
}

// modelConn is one connection as the test knows it.
type modelConn struct {
	id, user, device, node string
	active                 bool
	live                   bool
}

// modelWindow is when a grace ends: by the memory store's clock and by
// Redis's, both inside [lo, hi].
type modelWindow struct{ lo, hi time.Time }

// modelEvents records what one store published, in order.
type modelEvents struct {
	mu      sync.Mutex
	changes []store.PresenceEvent
	members []store.MembershipEvent
	// script changes and expiries, synchronously, as observed (Redis only)
	outcomes []presence.Change
	expired  []string
	via      string // record only copies that came on this team's channel
	// status changes: reported by the scripts (Redis), or emitted (memory)
	statuses []presence.StatusChange
}

// OnStatus records the memory store's status changes (store.StatusHandler);
// the Redis stores' are read from their outcomes.
func (e *modelEvents) OnStatus(ev presence.StatusChange) {
	if e.via != "" {
		return
	}
	e.mu.Lock()
	e.statuses = append(e.statuses, ev)
	e.mu.Unlock()
}

func (e *modelEvents) OnPresence(ev store.PresenceEvent) {
	if ev.Via != e.via {
		return
	}
	e.mu.Lock()
	e.changes = append(e.changes, ev)
	e.mu.Unlock()
}

func (e *modelEvents) OnMembership(ev store.MembershipEvent) {
	if ev.Team == modelAll {
		return
	}
	if ev.UserTeams != nil {
		// The view is valid only while the handler runs: kept as listed.
		teams, err := ev.UserTeams.List(context.Background())
		if err != nil {
			teams = []string{"error: " + err.Error()}
		}
		slices.Sort(teams) // listed in no set order
		ev.UserTeams = store.TeamList(teams)
	}
	e.mu.Lock()
	e.members = append(e.members, ev)
	e.mu.Unlock()
}

func (e *modelEvents) ObserveOutcome(_ string, out presence.Outcome, _ time.Duration) {
	e.mu.Lock()
	e.outcomes = append(e.outcomes, out.Changes...)
	if e.via != "" {
		e.statuses = append(e.statuses, out.Statuses...)
	}
	for _, c := range out.Expired {
		e.expired = append(e.expired, c.ID)
	}
	e.mu.Unlock()
}

type model struct {
	t   *rapid.T
	ctx context.Context

	memNow time.Time
	mem    *memstore.Store
	memEv  *modelEvents

	nodes map[string]*Store // "a", "b"; b is gone once lost
	redEv map[string]*modelEvents
	lostB bool

	conns  []*modelConn
	graces map[string]modelWindow
	// versions published so far per user, in order, by each store
	memVersions, redVersions map[string][]uint64
	// the last version of each user's changes and status changes together
	memLast, redLast       map[string]uint64
	memSeen, redSeen       int // published changes already compared
	redDelivered           int // Pub/Sub deliveries already compared
	memMembers, redMembers int
	step                   string
}

func runModel(t *rapid.T, url string) {
	m := &model{t: t, ctx: context.Background(), graces: map[string]modelWindow{},
		nodes: map[string]*Store{}, redEv: map[string]*modelEvents{},
		memVersions: map[string][]uint64{}, redVersions: map[string][]uint64{},
		memLast: map[string]uint64{}, redLast: map[string]uint64{}}
	var err error
	m.memNow = time.Now()
	m.memEv = &modelEvents{}
	m.mem, err = memstore.New(memstore.Config{TTL: modelTTL, Grace: modelGrace,
		Now: func() time.Time { return m.memNow }, Observer: m.memEv})
	if err != nil {
		t.Fatal(err)
	}
	m.mem.Subscribe(m.memEv)
	for _, node := range []string{"a", "b"} {
		ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
		s, err := New(ctx, Config{URL: url, Node: node, TTL: modelTTL, Grace: modelGrace,
			NodeTTL: modelNodeTTL, HoldOff: 300 * time.Millisecond, Logger: logger()})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		ev := &modelEvents{via: modelAll}
		s.Subscribe(ev)
		s.SetObserver(ev)
		if node == "a" {
			if err := s.Watch(ctx, []string{modelAll}); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		m.nodes[node], m.redEv[node] = s, ev
	}
	defer func() {
		for node, s := range m.nodes {
			if node != "b" || !m.lostB {
				_ = s.Close()
			}
		}
	}()
	for _, u := range modelUsers {
		m.must(m.mem.AddMember(m.ctx, modelAll, u))
		m.must(m.nodes["a"].AddMember(m.ctx, modelAll, u))
	}
	t.Repeat(map[string]func(*rapid.T){
		"connect":    m.connect,
		"heartbeat":  m.heartbeat,
		"status":     m.status,
		"close":      m.close,
		"advance":    m.advance,
		"loseNodeB":  m.loseNodeB,
		"membership": m.membership,
		"userStatus": m.userStatus,
		"":           m.check,
	})
	// Whatever is still due: graces end, and nothing more may differ.
	m.setStep("final: past every deadline")
	m.waitFor(modelGrace + 2*modelMargin)
	m.check(t)
}

// setStep names the step for failure messages and logs it, so a failing
// case reads as its sequence of operations.
func (m *model) setStep(s string) {
	m.step = s
	m.t.Logf("step: %s", s)
}

func (m *model) must(err error) {
	m.t.Helper()
	if err != nil {
		m.t.Fatalf("%s: %v", m.step, err)
	}
}

// live lists the live connections on nodes nodeOK accepts, of users
// given (any when none).
func (m *model) live(nodeOK func(string) bool, users ...string) []*modelConn {
	var out []*modelConn
	for _, c := range m.conns {
		if c.live && nodeOK(c.node) && (len(users) == 0 || slices.Contains(users, c.user)) {
			out = append(out, c)
		}
	}
	return out
}

func anyNode(string) bool { return true }

// do runs one operation on both stores and notes which graces it started.
func (m *model) do(memOp, redOp func() error) {
	m.t.Helper()
	start := time.Now()
	m.memNow = start
	memErr := memOp()
	redErr := redOp()
	m.noteGraces(start, time.Now())
	for _, sentinel := range []error{store.ErrUnknownConn, store.ErrDuplicateConn} {
		if errors.Is(memErr, sentinel) != errors.Is(redErr, sentinel) {
			m.t.Fatalf("DISAGREE %s: memory store %v, Redis store %v", m.step, memErr, redErr)
		}
	}
	if memErr != nil && !errors.Is(memErr, store.ErrUnknownConn) {
		m.t.Fatalf("%s: memory store: %v", m.step, memErr)
	}
	if redErr != nil && !errors.Is(redErr, store.ErrUnknownConn) {
		m.t.Fatalf("%s: Redis store: %v", m.step, redErr)
	}
	m.sweep()
}

// noteGraces records the grace windows of users who entered grace in an
// operation that ran between start and end (graces take the clock then).
func (m *model) noteGraces(start, end time.Time) {
	ps, err := m.mem.Presence(m.ctx, modelUsers)
	m.must(err)
	for _, p := range ps {
		inGrace := p.ConnectionCount == 0 && p.State != presence.Offline
		_, had := m.graces[p.UserID]
		switch {
		case inGrace && !had:
			m.graces[p.UserID] = modelWindow{start.Add(modelGrace), end.Add(modelGrace)}
		case !inGrace:
			delete(m.graces, p.UserID)
		}
	}
}

// expiredWith reports whether a Redis node reported id expired already (with
// another connection of its user, in one Disconnect).
func (m *model) expiredWith(id string) bool {
	for _, ev := range m.redEv {
		ev.mu.Lock()
		found := slices.Contains(ev.expired, id)
		ev.mu.Unlock()
		if found {
			return true
		}
	}
	return false
}

// sweep sweeps both stores, as servers do several times a second, at a
// moment no grace ends near. The connections the memory store expired are
// ended in the Redis store as its server would (Disconnect, Expired); the
// connections Redis released for a lost node are ended in the memory store
// (Disconnect, Lost).
func (m *model) sweep() {
	m.t.Helper()
	for {
		now, wait := time.Now(), time.Duration(0)
		for _, w := range m.graces {
			if !now.Before(w.lo.Add(-modelMargin)) && now.Before(w.hi.Add(modelMargin)) {
				wait = max(wait, w.hi.Add(modelMargin).Sub(now))
			}
		}
		if wait == 0 {
			break
		}
		time.Sleep(wait) // real time must pass: Redis's clock cannot be moved
	}
	start := time.Now()
	m.memNow = start
	m.memEv.mu.Lock()
	expiredBefore := len(m.memEv.expired)
	m.memEv.mu.Unlock()
	m.must(m.mem.Sweep(m.ctx))
	m.memEv.mu.Lock()
	expired := slices.Clone(m.memEv.expired[expiredBefore:])
	m.memEv.outcomes = nil // the memory store's changes are read from its events
	m.memEv.mu.Unlock()
	for _, id := range expired {
		c := m.conn(id)
		c.live = false
		if c.node == "b" && m.lostB {
			m.t.Fatalf("%s: the memory store expired %s of lost node b before Redis released it", m.step, id)
		}
		// Ending one expired connection also ends its user's others on the
		// node whose deadline has passed (they expire at the same moment):
		// those are no longer known when their turn comes.
		err := m.nodes[c.node].Disconnect(m.ctx, id, presence.Expired)
		if errors.Is(err, store.ErrUnknownConn) && m.expiredWith(id) {
			continue
		}
		if err != nil {
			m.t.Fatalf("DISAGREE %s: memory store expired %s, Redis store's Disconnect(Expired): %v", m.step, id, err)
		}
	}
	a := m.redEv["a"]
	a.mu.Lock()
	outBefore, relBefore := len(a.outcomes), len(a.expired)
	a.mu.Unlock()
	m.must(m.nodes["a"].Sweep(m.ctx))
	a.mu.Lock()
	released := slices.Clone(a.expired[relBefore:])
	sweepChanges := slices.Clone(a.outcomes[outBefore:])
	a.mu.Unlock()
	if !m.lostB {
		m.must(m.nodes["b"].Sweep(m.ctx))
	}
	end := time.Now()
	m.heldOff(start)
	for u, w := range m.graces {
		if !(start.After(w.hi) || end.Before(w.lo)) {
			m.t.Fatalf("INCONCLUSIVE (timing, not a disagreement) %s: a sweep ran from %v to %v, across %s's grace end (%v to %v)",
				m.step, start.Format("15:04:05.000"), end.Format("15:04:05.000"), u, w.lo.Format("15:04:05.000"), w.hi.Format("15:04:05.000"))
		}
	}
	m.noteGraces(start, end)
	if len(released) > 0 {
		m.released(released, sweepChanges, start)
	}
}

// heldOff fails as inconclusive when a shard of the model's users held
// off its sweep (a pause in sweeping longer than 2/3 of NodeTTL, as when
// the machine stalls): the memory store has no hold-off, so the stores
// would differ for a reason the model does not cover.
func (m *model) heldOff(start time.Time) {
	pipe := m.nodes["a"].rdb.Pipeline()
	var cmds []*redis.StringCmd
	for _, u := range modelUsers {
		cmds = append(cmds, pipe.Get(m.ctx, prefix(shardOf(u))+"ho"))
	}
	_, _ = pipe.Exec(m.ctx)
	for i, c := range cmds {
		ho, err := c.Int64()
		if err == nil && ho >= start.UnixMilli() {
			m.t.Fatalf("INCONCLUSIVE (timing, not a disagreement) %s: %s's shard held off its sweep until %v (a gap in sweeping)",
				m.step, modelUsers[i], time.UnixMilli(ho).Format("15:04:05.000"))
		}
	}
}

// released ends in the memory store the connections Redis released for the
// lost node, one user at a time in an order that yields what Redis
// published for that user.
func (m *model) released(ids []string, redChanges []presence.Change, sweepStart time.Time) {
	m.t.Helper()
	byUser := map[string][]string{}
	for _, id := range ids {
		c := m.conn(id)
		if c == nil || c.node != "b" || !c.live {
			m.t.Fatalf("DISAGREE %s: Redis released %s, not a live connection of lost node b", m.step, id)
		}
		byUser[c.user] = append(byUser[c.user], id)
	}
	start := time.Now()
	m.memNow = start
	for _, u := range sortedKeysOf(byUser) {
		var got []string
		for _, c := range redChanges {
			if c.UserID == u {
				got = append(got, c.State.String())
			}
		}
		orders := m.lossOrders(u, byUser[u])
		var pick []string
		for _, o := range orders {
			if slices.Equal(o.states, got) {
				pick = o.ids
				break
			}
		}
		if pick == nil {
			m.t.Fatalf("DISAGREE %s: releasing %v of %s Redis published %v; the tracker allows %v", m.step, byUser[u], u, got, orders)
		}
		for _, id := range pick {
			m.must(m.mem.Disconnect(m.ctx, id, presence.Lost))
			m.conn(id).live = false
		}
	}
	m.noteGraces(sweepStart, time.Now())
}

type lossOrder struct {
	ids    []string
	states []string
}

// lossOrders lists, for each order of removing lost (connections of user),
// what the pure tracker publishes, as DisconnectNode would in that order
// (it walks a map: any order).
func (m *model) lossOrders(user string, lost []string) []lossOrder {
	var out []lossOrder
	for _, perm := range permutations(lost) {
		tr := presence.NewTracker(presence.Config{TTL: time.Hour, Grace: time.Hour})
		now := time.Now()
		for _, c := range m.conns {
			if c.live && c.user == user {
				_, _ = tr.Connect(now, presence.Conn{ID: c.id, UserID: user, Device: c.device, Node: c.node})
				if !c.active {
					_, _ = tr.SetStatus(now, c.id, false)
				}
			}
		}
		// The user's status shapes what is published (dnd, invisible); its
		// expiry does not.
		ps, err := m.mem.Presence(m.ctx, []string{user})
		m.must(err)
		st := ps[0].Status
		st.ExpiresAt = time.Time{}
		if _, err := tr.SetUserStatus(now, user, st); err != nil {
			m.t.Fatal(err)
		}
		var states []string
		for _, id := range perm {
			o, err := tr.Disconnect(now, id, presence.Lost)
			if err != nil {
				m.t.Fatal(err)
			}
			for _, ch := range o.Changes {
				states = append(states, ch.State.String())
			}
		}
		out = append(out, lossOrder{perm, states})
	}
	return out
}

func permutations(ids []string) [][]string {
	if len(ids) <= 1 {
		return [][]string{slices.Clone(ids)}
	}
	var out [][]string
	for i := range ids {
		rest := append(slices.Clone(ids[:i]), ids[i+1:]...)
		for _, p := range permutations(rest) {
			out = append(out, append([]string{ids[i]}, p...))
		}
	}
	return out
}

func (m *model) conn(id string) *modelConn {
	for _, c := range m.conns {
		if c.id == id {
			return c
		}
	}
	return nil
}

// waitFor lets d of real time pass, sweeping every 25 ms as servers do.
func (m *model) waitFor(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		m.sweep()
		time.Sleep(25 * time.Millisecond) // real time must pass, for both clocks
	}
	m.sweep()
}

// Actions.

func (m *model) connect(t *rapid.T) {
	user := rapid.SampledFrom(modelUsers).Draw(t, "user")
	if len(m.live(anyNode, user)) >= modelMaxConns {
		return // the user has enough connections: this step does nothing
	}
	device := rapid.SampledFrom([]string{"web", "ios"}).Draw(t, "device")
	node := "a"
	if !m.lostB && rapid.Bool().Draw(t, "on node b") {
		node = "b"
	}
	c := &modelConn{id: fmt.Sprint("c", len(m.conns)), user: user, device: device, node: node, active: true, live: true}
	m.conns = append(m.conns, c)
	m.setStep(fmt.Sprintf("connect %s (%s, %s) on %s", c.id, user, device, node))
	pc := presence.Conn{ID: c.id, UserID: user, Device: device, Node: node}
	m.do(func() error { return m.mem.Connect(m.ctx, pc) }, func() error { return m.nodes[node].Connect(m.ctx, pc) })
}

// pick draws a connection: a live one mostly, sometimes one that ended
// (both stores must refuse it alike). Connections of a lost node are left
// alone: their node is gone, nothing calls for them. nil: there is none,
// and the step does nothing.
func (m *model) pick(t *rapid.T) *modelConn {
	var cands []*modelConn
	for _, c := range m.conns {
		if !(c.node == "b" && m.lostB) {
			cands = append(cands, c)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	return rapid.SampledFrom(cands).Draw(t, "conn")
}

func (m *model) heartbeat(t *rapid.T) {
	c := m.pick(t)
	if c == nil {
		return
	}
	m.setStep(fmt.Sprintf("heartbeat %s (live %v)", c.id, c.live))
	s := m.nodes[c.node]
	m.do(func() error { return m.mem.Heartbeat(m.ctx, c.id) }, func() error {
		err := s.Heartbeat(m.ctx, c.id)
		s.flushHeartbeats(m.ctx) // what the flush loop does within HeartbeatFlush
		return err
	})
}

func (m *model) status(t *rapid.T) {
	c := m.pick(t)
	if c == nil {
		return
	}
	active := rapid.Bool().Draw(t, "active")
	m.setStep(fmt.Sprintf("status %s active=%v (live %v)", c.id, active, c.live))
	s := m.nodes[c.node]
	m.do(func() error { return m.mem.SetStatus(m.ctx, c.id, active) }, func() error { return s.SetStatus(m.ctx, c.id, active) })
	if c.live {
		c.active = active
	}
}

func (m *model) close(t *rapid.T) {
	c := m.pick(t)
	if c == nil {
		return
	}
	m.setStep(fmt.Sprintf("close %s (live %v)", c.id, c.live))
	s := m.nodes[c.node]
	c.live = false
	m.do(func() error { return m.mem.Disconnect(m.ctx, c.id, presence.Closed) },
		func() error { return s.Disconnect(m.ctx, c.id, presence.Closed) })
}

// advance lets time pass: a little, past a grace, or past the ttl.
func (m *model) advance(t *rapid.T) {
	d := rapid.SampledFrom([]time.Duration{50 * time.Millisecond, modelGrace + 2*modelMargin, modelTTL + 2*modelMargin}).Draw(t, "advance")
	m.setStep(fmt.Sprintf("advance %v", d))
	m.waitFor(d)
}

// loseNodeB kills node b (kill -9: no goodbye) and sweeps until node a has
// released every connection b held. b's connections heartbeat just before,
// so that none reaches its ttl while b's liveness runs out.
func (m *model) loseNodeB(t *rapid.T) {
	if m.lostB {
		return // lost already: this step does nothing
	}
	m.setStep("lose node b")
	onB := m.live(func(n string) bool { return n == "b" })
	b := m.nodes["b"]
	for _, c := range onB {
		// Flushed in the same step, as in heartbeat: Redis takes a beat's
		// time at the flush, and do sweeps both stores after each step, so
		// one flush after them all would stamp the first beats that much
		// later in Redis than in the memory store.
		m.do(func() error { return m.mem.Heartbeat(m.ctx, c.id) }, func() error {
			err := b.Heartbeat(m.ctx, c.id)
			b.flushHeartbeats(m.ctx)
			return err
		})
	}
	kill9(b)
	m.lostB = true
	killed := time.Now()
	for len(m.live(func(n string) bool { return n == "b" })) > 0 {
		if time.Since(killed) > modelTTL {
			m.t.Fatalf("DISAGREE %s: b's connections %v still held %v after the kill (node ttl %v)",
				m.step, ids(m.live(func(n string) bool { return n == "b" })), time.Since(killed), modelNodeTTL)
		}
		m.sweep()
		time.Sleep(20 * time.Millisecond) // real time must pass: b's liveness runs out by Redis's clock
	}
}

func ids(cs []*modelConn) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.id)
	}
	return out
}

func (m *model) membership(t *rapid.T) {
	user := rapid.SampledFrom(modelUsers).Draw(t, "user")
	join := rapid.Bool().Draw(t, "join")
	node := "a"
	if !m.lostB && rapid.Bool().Draw(t, "through b") {
		node = "b"
	}
	m.setStep(fmt.Sprintf("membership %s join=%v through %s", user, join, node))
	s := m.nodes[node]
	if join {
		m.do(func() error { return m.mem.AddMember(m.ctx, modelTeam, user) }, func() error { return s.AddMember(m.ctx, modelTeam, user) })
	} else {
		m.do(func() error { return m.mem.RemoveMember(m.ctx, modelTeam, user) }, func() error { return s.RemoveMember(m.ctx, modelTeam, user) })
	}
}

// userStatus sets a user's status through either node, sometimes with an
// expiry soon: the sweeps then reset it, away from which they are kept as
// from grace ends.
func (m *model) userStatus(t *rapid.T) {
	user := rapid.SampledFrom(modelUsers).Draw(t, "user")
	mode := rapid.SampledFrom([]presence.Mode{presence.ModeAuto, presence.ModeDND, presence.ModeInvisible}).Draw(t, "mode")
	text := rapid.SampledFrom([]string{"", "", "busy", "📅 in a meeting"}).Draw(t, "text")
	emoji := rapid.SampledFrom([]string{"", "🌴"}).Draw(t, "emoji")
	in := rapid.SampledFrom([]time.Duration{0, 0, 200 * time.Millisecond, 2 * modelGrace}).Draw(t, "expires in")
	node := "a"
	if !m.lostB && rapid.Bool().Draw(t, "through b") {
		node = "b"
	}
	st := presence.Status{Mode: mode, Text: text, Emoji: emoji}
	if in > 0 {
		st.ExpiresAt = time.UnixMilli(time.Now().Add(in).UnixMilli())
		m.graces["status:"+user] = modelWindow{st.ExpiresAt, st.ExpiresAt}
	}
	m.setStep(fmt.Sprintf("status of %s: %v %q %q expires in %v, through %s", user, mode, text, emoji, in, node))
	s := m.nodes[node]
	m.do(func() error { return m.mem.SetUserStatus(m.ctx, user, st) }, func() error { return s.SetUserStatus(m.ctx, user, st) })
}

// lookOf is what the model compares of what viewers see: times differ
// between the stores by a few ms, so only whether they are shown.
func lookOf(c presence.Change) string {
	return fmt.Sprintf("%v[%s|%s|exp=%v|seen=%v]", c.State, c.Text, c.Emoji, !c.ExpiresAt.IsZero(), !c.LastSeen.IsZero())
}

func statusesPerUser(sts []presence.StatusChange) map[string]string {
	out := map[string]string{}
	for _, s := range sts {
		out[s.UserID] = strings.TrimPrefix(fmt.Sprintf("%s %v[%s|%s|%d]", out[s.UserID], s.Status.Mode, s.Status.Text,
			s.Status.Emoji, s.Status.ExpiresAt.UnixMilli()), " ")
	}
	return out
}

// check compares the stores after every step.
func (m *model) check(t *rapid.T) {
	t.Helper()
	// Status changes of this step.
	m.memEv.mu.Lock()
	memSt := m.memEv.statuses
	m.memEv.statuses = nil
	m.memEv.mu.Unlock()
	var redSt []presence.StatusChange
	for _, node := range []string{"a", "b"} {
		ev := m.redEv[node]
		ev.mu.Lock()
		redSt = append(redSt, ev.statuses...)
		ev.statuses = nil
		ev.mu.Unlock()
	}
	if a, b := statusesPerUser(memSt), statusesPerUser(redSt); !maps2Equal(a, b) {
		t.Fatalf("DISAGREE after %s: memory store changed statuses %v, Redis store %v", m.step, a, b)
	}
	for _, s := range memSt {
		m.memLast[s.UserID] = max(m.memLast[s.UserID], s.Version)
	}
	for _, s := range redSt {
		m.redLast[s.UserID] = max(m.redLast[s.UserID], s.Version)
	}
	// Changes published in this step, per user, in order.
	m.memEv.mu.Lock()
	var memNew []presence.Change
	for _, ev := range m.memEv.changes[m.memSeen:] {
		memNew = append(memNew, ev.Change)
	}
	m.memSeen = len(m.memEv.changes)
	m.memEv.mu.Unlock()
	var redNew []presence.Change
	for _, node := range []string{"a", "b"} {
		ev := m.redEv[node]
		ev.mu.Lock()
		// Each node's own outcomes are in the order it published them.
		last := map[string]uint64{}
		for _, c := range ev.outcomes {
			if c.Version <= last[c.UserID] {
				t.Fatalf("after %s: node %s published %s v%d after v%d", m.step, node, c.UserID, c.Version, last[c.UserID])
			}
			last[c.UserID] = c.Version
		}
		redNew = append(redNew, ev.outcomes...)
		ev.outcomes = nil
		ev.mu.Unlock()
	}
	// The two nodes' outcomes interleave: a status expiry is swept by the
	// node that set it, a grace end by the shard's owner. Their versions
	// (Redis's clock) give the order they were published in; appended node
	// by node, a status expiry on b came after a later offline on a (seed
	// 6220803954402393135).
	slices.SortStableFunc(redNew, func(x, y presence.Change) int { return cmp.Compare(x.Version, y.Version) })
	if a, b := perUser(memNew), perUser(redNew); !maps2Equal(a, b) {
		t.Fatalf("DISAGREE after %s: memory store published %v, Redis store %v", m.step, a, b)
	}
	for name, pair := range map[string]struct {
		changes  []presence.Change
		versions map[string][]uint64
	}{"memory": {memNew, m.memVersions}, "Redis": {redNew, m.redVersions}} {
		for _, c := range pair.changes {
			vs := pair.versions[c.UserID]
			if len(vs) > 0 && c.Version <= vs[len(vs)-1] {
				t.Fatalf("after %s: %s store published %s v%d after v%d", m.step, name, c.UserID, c.Version, vs[len(vs)-1])
			}
			pair.versions[c.UserID] = append(vs, c.Version)
		}
	}
	for _, c := range memNew {
		m.memLast[c.UserID] = max(m.memLast[c.UserID], c.Version)
	}
	for _, c := range redNew {
		m.redLast[c.UserID] = max(m.redLast[c.UserID], c.Version)
	}

	// Presence.
	mp, err := m.mem.Presence(m.ctx, modelUsers)
	m.must(err)
	rp, err := m.nodes["a"].Presence(m.ctx, modelUsers)
	m.must(err)
	for i, u := range modelUsers {
		a, b := mp[i], rp[i]
		if a.State != b.State || a.ConnectionCount != b.ConnectionCount || !slices.Equal(a.Devices, b.Devices) {
			t.Fatalf("DISAGREE after %s: %s is %v/%d conns/%v in memory, %v/%d conns/%v in Redis",
				m.step, u, a.State, a.ConnectionCount, a.Devices, b.State, b.ConnectionCount, b.Devices)
		}
		if a.Version != m.memLast[u] || b.Version != m.redLast[u] {
			t.Fatalf("after %s: %s's version is not its last change's: memory v%d (changes %v), Redis v%d (changes %v)",
				m.step, u, a.Version, m.memVersions[u], b.Version, m.redVersions[u])
		}
		if !a.Status.Equal(b.Status) || a.Actual != b.Actual {
			t.Fatalf("DISAGREE after %s: %s's status %+v (truth %v) in memory, %+v (truth %v) in Redis",
				m.step, u, a.Status, a.Actual, b.Status, b.Actual)
		}
		if la, lb := a.Look(), b.Look(); la.State != lb.State || la.Text != lb.Text || la.Emoji != lb.Emoji ||
			la.ExpiresAt != lb.ExpiresAt || (la.LastSeen == 0) != (lb.LastSeen == 0) || a.Since.IsZero() != b.Since.IsZero() {
			t.Fatalf("DISAGREE after %s: viewers see %s as %+v in memory, %+v in Redis", m.step, u, la, lb)
		}
		if a.LastSeen.IsZero() != b.LastSeen.IsZero() || a.LastSeen.Sub(b.LastSeen).Abs() > modelSeenTolerance {
			t.Fatalf("DISAGREE after %s: %s last seen %v in memory, %v in Redis", m.step, u,
				a.LastSeen.Format("15:04:05.000"), b.LastSeen.Format("15:04:05.000"))
		}
	}

	// Membership.
	for _, u := range modelUsers {
		a, err := m.mem.TeamsOf(m.ctx, u)
		m.must(err)
		b, err := m.nodes["a"].TeamsOf(m.ctx, u)
		m.must(err)
		if !slices.Equal(a, b) {
			t.Fatalf("DISAGREE after %s: teams of %s: memory %v, Redis %v", m.step, u, a, b)
		}
	}
	a, err := m.mem.Members(m.ctx, modelTeam)
	m.must(err)
	b, err := m.nodes["a"].Members(m.ctx, modelTeam)
	m.must(err)
	if !slices.Equal(a, b) {
		t.Fatalf("DISAGREE after %s: members of %s: memory %v, Redis %v", m.step, modelTeam, a, b)
	}

	m.checkDelivered(t)
}

// checkDelivered waits until node a has received on Pub/Sub every change
// the scripts returned, once each, and every membership event, then
// compares them with what the memory store emitted.
func (m *model) checkDelivered(t *rapid.T) {
	t.Helper()
	ev := m.redEv["a"]
	wantChanges := 0
	for _, vs := range m.redVersions {
		wantChanges += len(vs)
	}
	m.memEv.mu.Lock()
	memChanges := slices.Clone(m.memEv.changes)
	memMembers := slices.Clone(m.memEv.members)
	m.memEv.mu.Unlock()
	deadline := time.Now().Add(2 * time.Second)
	for {
		ev.mu.Lock()
		n, k := len(ev.changes), len(ev.members)
		ev.mu.Unlock()
		if n >= wantChanges && k >= len(memMembers) || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond) // polling for delivery
	}
	ev.mu.Lock()
	delivered := slices.Clone(ev.changes)
	members := slices.Clone(ev.members)
	ev.mu.Unlock()
	// Delivered: exactly the versions the scripts returned, per user, in order.
	got := map[string][]uint64{}
	for _, d := range delivered {
		got[d.Change.UserID] = append(got[d.Change.UserID], d.Change.Version)
	}
	for _, u := range modelUsers {
		if !slices.Equal(got[u], m.redVersions[u]) {
			t.Fatalf("after %s: node a received %s's versions %v on Pub/Sub; the scripts published %v", m.step, u, got[u], m.redVersions[u])
		}
	}
	// Each change carries the teams of its user at the time, as in memory.
	memTeams := teamsByOrdinal(memChanges)
	redTeams := teamsByOrdinal(delivered)
	for k, v := range memTeams {
		if w, ok := redTeams[k]; ok && !slices.Equal(v, w) {
			t.Fatalf("DISAGREE after %s: change %d of %s carries teams %v in memory, %v in Redis", m.step, k.n, k.user, v, w)
		}
	}
	if len(members) != len(memMembers) {
		t.Fatalf("DISAGREE after %s: membership events: memory %v, Redis %v", m.step, describe(memMembers, m.memVersions), describe(members, m.redVersions))
	}
	if a, b := describe(memMembers, m.memVersions), describe(members, m.redVersions); !slices.Equal(a, b) {
		t.Fatalf("DISAGREE after %s: membership events: memory %v, Redis %v", m.step, a, b)
	}
}

type ordinal struct {
	user string
	n    int
}

func teamsByOrdinal(evs []store.PresenceEvent) map[ordinal][]string {
	out := map[ordinal][]string{}
	n := map[string]int{}
	for _, ev := range evs {
		n[ev.Change.UserID]++
		out[ordinal{ev.Change.UserID, n[ev.Change.UserID]}] = ev.Teams
	}
	return out
}

// describe writes membership events with versions as their order among
// the user's changes (1 = first change), not their values.
func describe(evs []store.MembershipEvent, versions map[string][]uint64) []string {
	var out []string
	for _, ev := range evs {
		ord := slices.Index(versions[ev.UserID], ev.Version) + 1
		if ev.Version == 0 {
			ord = 0
		} else if ord == 0 {
			ord = -1 // a version never published
		}
		out = append(out, fmt.Sprintf("%s %s joined=%v %v %v #%d", ev.Team, ev.UserID, ev.Joined, ev.UserTeams, ev.State, ord))
	}
	return out
}

func perUser(cs []presence.Change) map[string]string {
	out := map[string]string{}
	for _, c := range cs {
		out[c.UserID] = strings.TrimPrefix(out[c.UserID]+" "+lookOf(c), " ")
	}
	return out
}

func maps2Equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func last(vs []uint64) uint64 {
	if len(vs) == 0 {
		return 0
	}
	return vs[len(vs)-1]
}

func sortedKeysOf(m map[string][]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
