package storetest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
)

// Shared is what the suite asks of a store that many nodes share: nodes on
// one backend, and a way to lose one.
type Shared struct {
	// NewNode returns a store for node on the shared backend, with the
	// deadlines the backend was made with; closed by the caller's
	// t.Cleanup if it needs closing.
	NewNode func(t *testing.T, node string) store.Store
	// Kill stops s as a crash would (kill -9): no goodbye, nothing
	// flushed; its connections are left for the survivors to release.
	Kill func(s store.Store)
}

// NewShared returns a fresh, empty shared backend whose nodes use cfg's
// deadlines (cfg.Node is unused: NewNode names them).
type NewShared func(t *testing.T, cfg Config) Shared

// SharedTTL is the ttl of the node-loss test: long, so that a connection
// released by a survivor is told apart from one that merely expired.
const SharedTTL = 4 * time.Second

// RunShared runs the tests only a store shared by many nodes can pass, on
// top of Run's: node loss, two nodes ending one user, membership from two
// nodes at once, and (for a store.Watcher) Watch semantics.
func RunShared(t *testing.T, newShared NewShared) {
	tests := []struct {
		name string
		ttl  time.Duration
		fn   func(t *testing.T, sh Shared)
	}{
		{"NodeLossReleasesConnections", SharedTTL, testNodeLoss},
		{"TwoNodesOneOffline", TTL, testTwoNodesOneOffline},
		{"ConcurrentMembershipTwoNodes", TTL, testConcurrentMembershipTwoNodes},
		{"WatchConfirmed", TTL, testWatchConfirmed},
		{"WatchCounts", TTL, testWatchCounts},
		{"BroadcastTwoNodes", TTL, testBroadcastTwoNodes},
		{"ChannelCountsTwoNodes", TTL, testChannelCountsTwoNodes},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, newShared(t, Config{TTL: tt.ttl, Grace: Grace}))
		})
	}
}

// node is one node's store with a harness recording what it receives.
func node(t *testing.T, sh Shared, name string) *harness {
	h := &harness{t: t, ctx: context.Background()}
	h.s = sh.NewNode(t, name)
	h.s.Subscribe(h)
	if w, ok := h.s.(store.Watcher); ok {
		mustDo(t, w.Watch(h.ctx, []string{Everyone, "t1", "t2"}))
		t.Cleanup(func() { w.Unwatch([]string{Everyone, "t1", "t2"}) })
	}
	return h
}

func (h *harness) connectOn(node, id, user string) {
	h.t.Helper()
	mustDo(h.t, h.s.AddMember(h.ctx, Everyone, user))
	if err := h.s.Connect(h.ctx, presence.Conn{ID: id, UserID: user, Device: "web", Node: node}); err != nil {
		h.t.Fatalf("connect %s on %s: %v", id, node, err)
	}
}

// userHistory is the recorded changes of one user.
func (h *harness) userHistory(user string) []string {
	var out []string
	for _, c := range h.history() {
		if len(c) > len(user) && c[:len(user)+1] == user+"=" {
			out = append(out, c)
		}
	}
	return out
}

// testNodeLoss: a node dies holding connections. A survivor releases them
// well before their ttl: a user connected only there goes offline after
// the grace, with last_seen the last heartbeat recorded (not the moment
// the loss was noticed); a user still connected elsewhere stays online,
// with nothing published.
func testNodeLoss(t *testing.T, sh Shared) {
	a, b := node(t, sh, "node-a"), node(t, sh, "node-b")
	b.connectOn("node-b", "c1", "bob")
	a.connectOn("node-a", "c2", "amy")
	b.connectOn("node-b", "c3", "amy")
	a.expectHistory(2*time.Second, "bob=online", "amy=online")
	connected := a.presence("bob").LastSeen
	// Real time must pass so that the heartbeat is told from the connect.
	time.Sleep(200 * time.Millisecond)
	heartbeat := time.Now()
	mustDo(t, b.s.Heartbeat(b.ctx, "c1"))
	var recorded time.Time
	checkFor(t, 2*time.Second, func() error {
		// A store may batch heartbeats: wait until this one is recorded.
		if recorded = a.presence("bob").LastSeen; recorded.Before(heartbeat.Add(-5 * time.Millisecond)) {
			return fmt.Errorf("bob last seen %v, the connect at %v: the heartbeat at %v is not recorded yet",
				recorded.Format("15:04:05.000"), connected.Format("15:04:05.000"), heartbeat.Format("15:04:05.000"))
		}
		return nil
	})
	// And again, so that the loss is told from the last heartbeat.
	time.Sleep(200 * time.Millisecond)
	sh.Kill(b.s)
	killed := time.Now()
	checkFor(t, SharedTTL/2, func() error {
		a.sweep()
		if got := a.userHistory("bob"); !slices.Equal(got, []string{"bob=online", "bob=offline"}) {
			return fmt.Errorf("bob's changes %v, want online then offline: node-b's connection not released", got)
		}
		return nil
	})
	took := time.Since(killed)
	p := a.presence("bob")
	if p.State != presence.Offline || p.ConnectionCount != 0 {
		t.Fatalf("bob after node-b's loss: %+v", p)
	}
	if d := p.LastSeen.Sub(recorded).Abs(); d > time.Millisecond {
		t.Fatalf("bob last seen %v, want the last heartbeat recorded, %v (node-b lost at %v, released within %v)",
			p.LastSeen.Format("15:04:05.000"), recorded.Format("15:04:05.000"), killed.Format("15:04:05.000"), took)
	}
	// amy keeps her connection on node-a: online, nothing published.
	a.sweepFor(Grace + 100*time.Millisecond)
	if got := a.userHistory("amy"); !slices.Equal(got, []string{"amy=online"}) {
		t.Fatalf("amy's changes %v, want only online: her connection on node-a lives", got)
	}
	if p := a.presence("amy"); p.State != presence.Online || p.ConnectionCount != 1 {
		t.Fatalf("amy after node-b's loss: %+v", p)
	}
}

// testTwoNodesOneOffline: users connected on two nodes at once close
// both connections at the same moment, one on each node, while both nodes
// sweep. Each user gets exactly one offline, seen once by each node.
func testTwoNodesOneOffline(t *testing.T, sh Shared) {
	a, b := node(t, sh, "node-a"), node(t, sh, "node-b")
	const users = 10
	user := func(i int) string { return fmt.Sprint("dual", i) }
	var online []string
	for i := range users {
		a.connectOn("node-a", fmt.Sprint("a", i), user(i))
		b.connectOn("node-b", fmt.Sprint("b", i), user(i))
		online = append(online, user(i)+"=online")
	}
	for _, h := range []*harness{a, b} {
		checkFor(t, 2*time.Second, func() error {
			if got := h.history(); !slices.Equal(got, online) {
				return fmt.Errorf("changes %v, want one online each %v", got, online)
			}
			return nil
		})
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 2*users+2)
	for _, h := range []*harness{a, b} {
		wg.Add(1)
		go func() { // both nodes sweep throughout, as servers do
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := h.s.Sweep(h.ctx); err != nil {
					errs <- err
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	var closes sync.WaitGroup
	for i := range users {
		closes.Add(2)
		go func() { defer closes.Done(); errs <- a.s.Disconnect(a.ctx, fmt.Sprint("a", i), presence.Closed) }()
		go func() { defer closes.Done(); errs <- b.s.Disconnect(b.ctx, fmt.Sprint("b", i), presence.Closed) }()
	}
	closes.Wait()
	offline := func(h *harness) error {
		for i := range users {
			if got := h.userHistory(user(i)); !slices.Equal(got, []string{user(i) + "=online", user(i) + "=offline"}) {
				return fmt.Errorf("%s's changes %v, want online then one offline", user(i), got)
			}
		}
		return nil
	}
	for _, h := range []*harness{a, b} {
		checkFor(t, Grace+2*time.Second, func() error { return offline(h) })
	}
	// Sweeps go on past another grace: still exactly one offline each.
	time.Sleep(Grace + 100*time.Millisecond) // real time must pass for a second offline to show
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		mustDo(t, err)
	}
	for _, h := range []*harness{a, b} {
		mustDo(t, offline(h))
	}
}

// testConcurrentMembershipTwoNodes is ConcurrentMembership with the adds
// made through one node and the removes through another.
func testConcurrentMembershipTwoNodes(t *testing.T, sh Shared) {
	a, b := node(t, sh, "node-a"), node(t, sh, "node-b")
	concurrentMembership(t, a, a.s, b.s)
}

// viaRec records the changes a node receives, with the team channel each
// copy came on.
type viaRec struct {
	mu  sync.Mutex
	got []string // "via user=state"
}

func (r *viaRec) OnPresence(ev store.PresenceEvent) {
	r.mu.Lock()
	r.got = append(r.got, ev.Via+" "+ev.Change.UserID+"="+ev.Change.State.String())
	r.mu.Unlock()
}

func (r *viaRec) OnMembership(store.MembershipEvent) {}

func (r *viaRec) has(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.got, s)
}

func (r *viaRec) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// watcher returns a node that records with a viaRec and its Watcher,
// skipping the test for a store that delivers everything.
func watcher(t *testing.T, sh Shared, name string) (store.Store, store.Watcher, *viaRec) {
	s := sh.NewNode(t, name)
	w, ok := s.(store.Watcher)
	if !ok {
		t.Skip("not a store.Watcher: every event is delivered")
	}
	r := &viaRec{}
	s.Subscribe(r)
	return s, w, r
}

// testWatchConfirmed: Watch returns once events about the team will be
// delivered, so a change published by another node right after it returns
// is received. Many fresh teams, to give a premature return its chance.
func testWatchConfirmed(t *testing.T, sh Shared) {
	_, w, r := watcher(t, sh, "node-a")
	b := sh.NewNode(t, "node-b")
	ctx := context.Background()
	const rounds = 20
	var want []string
	for i := range rounds {
		team, user := fmt.Sprint("fresh", i), fmt.Sprint("watched", i)
		mustDo(t, b.AddMember(ctx, team, user))
		mustDo(t, w.Watch(ctx, []string{team}))
		mustDo(t, b.Connect(ctx, presence.Conn{ID: "w" + user, UserID: user, Device: "web", Node: "node-b"}))
		want = append(want, team+" "+user+"=online")
	}
	checkFor(t, 2*time.Second, func() error {
		for _, s := range want {
			if !r.has(s) {
				return fmt.Errorf("received %v, missing %q: published right after Watch returned", r.all(), s)
			}
		}
		return nil
	})
}

// testWatchCounts: watches count. A team watched twice and unwatched once
// is still delivered; unwatched again, its changes stop (while those of a
// team still watched go on arriving).
func testWatchCounts(t *testing.T, sh Shared) {
	_, w, r := watcher(t, sh, "node-a")
	b := sh.NewNode(t, "node-b")
	ctx := context.Background()
	mustDo(t, b.AddMember(ctx, "counted", "vic"))
	mustDo(t, b.AddMember(ctx, "marker", "vic")) // vic's changes come on both channels
	mustDo(t, w.Watch(ctx, []string{"marker"}))
	mustDo(t, w.Watch(ctx, []string{"counted"}))
	mustDo(t, w.Watch(ctx, []string{"counted"}))
	expect := func(want ...string) {
		t.Helper()
		checkFor(t, 2*time.Second, func() error {
			for _, s := range want {
				if !r.has(s) {
					return fmt.Errorf("received %v, missing %q", r.all(), s)
				}
			}
			return nil
		})
	}
	mustDo(t, b.Connect(ctx, presence.Conn{ID: "v1", UserID: "vic", Device: "web", Node: "node-b"}))
	expect("counted vic=online", "marker vic=online")
	w.Unwatch([]string{"counted"})
	mustDo(t, b.SetStatus(ctx, "v1", false))
	expect("counted vic=away", "marker vic=away") // one watch is left
	w.Unwatch([]string{"counted"})
	mustDo(t, b.SetStatus(ctx, "v1", true))
	expect("marker vic=online")
	// One more change and its marker, so that a stray copy on the unwatched
	// channel would have come by now.
	mustDo(t, b.SetStatus(ctx, "v1", false))
	expect("marker vic=online", "marker vic=away")
	if got := r.all(); countOf(got, "counted vic=online") != 1 || countOf(got, "counted vic=away") != 1 {
		t.Fatalf("received %v: changes on team counted after its last unwatch", got)
	}
}

func countOf(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}
