package server

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/memstore"
)

func change(user string, s presence.State, v uint64) presence.Change {
	return presence.Change{UserID: user, State: s, Version: v}
}

func seen(user string, s presence.State, v uint64) presence.Presence {
	return presence.Presence{UserID: user, State: s, Version: v}
}

// routeOne routes a change for one team.
func (v *views) routeOne(team string, ch presence.Change) bool {
	d := []reach{{}}
	v.route([]string{team}, ch, d)
	return d[0].any()
}

func TestViewsRoute(t *testing.T) {
	v := newViews()
	steps := []struct {
		ch   presence.Change
		want bool
	}{
		{change("bob", presence.Online, 5), true},   // first sight
		{change("bob", presence.Online, 5), false},  // a copy from another team
		{change("bob", presence.Away, 4), false},    // older than held
		{change("bob", presence.Away, 6), true},     // a real change
		{change("bob", presence.Away, 9), false},    // a restatement: no dot moves
		{change("bob", presence.Online, 8), false},  // older than the restatement
		{change("bob", presence.Online, 10), true},  // real again
		{change("bob", presence.Offline, 11), true}, // and gone
	}
	for i, s := range steps {
		if got := v.routeOne("t", s.ch); got != s.want {
			t.Fatalf("step %d %+v: route = %v, want %v", i, s.ch, got, s.want)
		}
	}
}

// Members who read different states in their snapshots disagree: the next
// change at or above the newest read goes to all of them, even one that
// would otherwise be a copy or a restatement.
func TestViewsMixedReadsLetTheChangeThrough(t *testing.T) {
	v := newViews()
	v.read("t", seen("bob", presence.Online, 5), nil, false) // alice's snapshot
	v.read("t", seen("bob", presence.Away, 7), nil, true)    // carol's, later
	if !v.routeOne("t", change("bob", presence.Away, 7)) {
		t.Fatal("the change carol's snapshot already showed must still reach alice")
	}
	if v.routeOne("t", change("bob", presence.Away, 7)) {
		t.Fatal("a second copy must not")
	}
	if v.routeOne("t", change("bob", presence.Away, 8)) {
		t.Fatal("now everyone agrees: a restatement is not sent")
	}
}

// A new member's snapshot showing the subject online, where members already
// there hold nothing (offline), mixes the team.
func TestViewsFirstReadBesideOthersIsMixed(t *testing.T) {
	v := newViews()
	v.read("t", seen("bob", presence.Online, 5), nil, true)
	if !v.routeOne("t", change("bob", presence.Online, 5)) {
		t.Fatal("members who held bob offline must get his online")
	}
}

func TestViewsResyncSendsOnlyDifferences(t *testing.T) {
	v := newViews()
	for _, c := range []presence.Change{
		change("same", presence.Online, 5),
		change("gone", presence.Online, 5),   // went offline at 6: missed
		change("back", presence.Offline, 5),  // came back at 6: missed
		change("lost", presence.Online, 5),   // Redis lost it: offline at 0
		change("idle", presence.Offline, 5),  // still offline, newer version
		change("late", presence.Online, 500), // changed after the floor
		change("left", presence.Online, 5),   // no longer a member
	} {
		v.routeOne("t", c)
	}
	truth := []presence.Presence{
		seen("same", presence.Online, 5),
		seen("gone", presence.Offline, 6),
		seen("back", presence.Online, 6),
		seen("lost", presence.Offline, 0),
		seen("idle", presence.Offline, 9),
		seen("late", presence.Away, 7), // read before the change at 500
		seen("new", presence.Away, 3),  // joined, never routed
		seen("quiet", presence.Offline, 2),
	}
	floor := func(string) uint64 { return 100 }
	var got []presence.Change
	for _, ch := range v.resync("t", truth, floor) {
		got = append(got, ch.Change)
	}
	want := []presence.Change{
		change("gone", presence.Offline, 6),
		change("back", presence.Online, 6),
		change("lost", presence.Offline, 100), // at the floor: overrides what they hold
		change("new", presence.Away, 3),
	}
	if !slices.Equal(got, want) {
		t.Fatalf("resync sent %v, want %v", got, want)
	}
	// A second resync right after finds nothing to send.
	if again := v.resync("t", truth, floor); len(again) != 0 {
		t.Fatalf("second resync sent %v, want nothing", again)
	}
	// What was resent is now what they hold; "left" is forgotten.
	if v.routeOne("t", change("lost", presence.Offline, 100)) || !v.routeOne("t", change("left", presence.Offline, 6)) {
		t.Fatal("views after a resync do not match what was sent")
	}
}

// sharedMem makes the memory store look shared to the hub (it watches
// teams), so the hub routes as it does for Redis.
type sharedMem struct{ *memstore.Store }

func (sharedMem) Watch(context.Context, []string) error { return nil }
func (sharedMem) Unwatch([]string)                      {}

// A shared store delivers a change once per team channel of its subject. If
// the viewer is indexed under a new team between two copies, the change
// must still reach it, once (it was lost for good when each copy went only
// to the members whose first shared team was the copy's).
func TestCopiesReachViewerOnceAcrossAJoin(t *testing.T) {
	for _, tc := range []struct {
		name string
		join bool // the viewer joins a0 between the copies, or leaves it
	}{{"join", true}, {"leave", false}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			mem, err := memstore.New(memstore.Config{})
			if err != nil {
				t.Fatal(err)
			}
			s := socketlessServer()
			reg := prometheus.NewRegistry()
			s.metrics = newMetrics(reg)
			s.store = sharedMem{mem}
			s.hub = newHub(s)
			h := s.hub
			for _, m := range [][2]string{{"t1", "alice"}, {"t1", "bob"}, {"a0", "bob"}} {
				if err := mem.AddMember(ctx, m[0], m[1]); err != nil {
					t.Fatal(err)
				}
			}
			if !tc.join {
				if err := mem.AddMember(ctx, "a0", "alice"); err != nil {
					t.Fatal(err)
				}
			}
			alice := &client{srv: s, user: "alice"}
			alice.closed.Store(true) // no socket: writes are no-ops
			if _, err := h.add(ctx, alice); err != nil {
				t.Fatal(err)
			}
			ev := func(via string, v uint64) store.PresenceEvent {
				return store.PresenceEvent{Change: change("bob", presence.Away, v), Teams: []string{"a0", "t1"}, Via: via}
			}
			h.OnPresence(ev("a0", 2))
			h.mu.Lock()
			lu := h.users["alice"]
			h.mu.Unlock()
			if tc.join {
				if err := mem.AddMember(ctx, "a0", "alice"); err != nil {
					t.Fatal(err)
				}
				h.joinWatched(ctx, lu, "a0", false)
			} else {
				if err := mem.RemoveMember(ctx, "a0", "alice"); err != nil {
					t.Fatal(err)
				}
				h.OnMembership(store.MembershipEvent{Team: "a0", UserID: "alice", UserTeams: store.TeamList{"t1"}})
			}
			h.OnPresence(ev("t1", 2))
			alice.mu.Lock()
			got := fmt.Sprint(alice.pending)
			alice.mu.Unlock()
			want := fmt.Sprint(map[string]protocol.Change{"bob": wireChange(change("bob", presence.Away, 2))})
			if got != want {
				t.Fatalf("alice's outbox = %s, want %s", got, want)
			}
			if n := staleDrops(t, reg); n != 0 {
				t.Fatalf("%v copies reached alice's outbox and were dropped there; want the node to send one", n)
			}
		})
	}
}

// staleDrops reads greendot_deliveries_dropped_total{reason="stale"}.
func staleDrops(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "greendot_deliveries_dropped_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reasonStale {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatal("no stale drops counter")
	return 0
}

// A join event carries the subject's state as of the membership change. A
// change naming the new team can overtake it (the event's publish was
// slow) and reach the team's members first; the event must then not push
// its older state after it, which clients would drop as out of order.
func TestJoinEventOvertakenByAChange(t *testing.T) {
	ctx := context.Background()
	h, mem, local := sharedHub(t, [][2]string{{"t1", "alice"}, {"t0", "bob"}})
	alice := local("alice")
	if err := mem.AddMember(ctx, "t1", "bob"); err != nil {
		t.Fatal(err)
	}
	h.OnPresence(store.PresenceEvent{Change: change("bob", presence.Online, 8), Teams: []string{"t0", "t1"}, Via: "t1"})
	alice.mu.Lock()
	got := fmt.Sprint(alice.pending)
	alice.pending, alice.order = nil, nil // written to the socket
	alice.mu.Unlock()
	if want := fmt.Sprint(map[string]protocol.Change{"bob": wireChange(change("bob", presence.Online, 8))}); got != want {
		t.Fatalf("alice's outbox = %s, want %s", got, want)
	}

	h.OnMembership(store.MembershipEvent{Team: "t1", UserID: "bob", Joined: true, State: presence.Away, Version: 5, UserTeams: store.TeamList{"t0", "t1"}})
	alice.mu.Lock()
	got = fmt.Sprint(alice.pending)
	alice.mu.Unlock()
	if got != "map[]" {
		t.Fatalf("after the late join event, alice's outbox = %s, want nothing (she holds bob=online v8)", got)
	}
	if cur, _ := h.views.get("t1", "bob"); cur.version != 8 || cur.look.State != presence.Online || cur.odd != nil {
		t.Fatalf("t1's view of bob = %+v, want online v8, not mixed", cur)
	}
}

// A node that missed membership events (cut off from Redis, or resubscribing)
// finds them in the resync: a local user removed meanwhile leaves the team
// here, so its changes stop passing both ways; a local member not indexed
// under the team joins it.
func TestResyncAppliesMissedMembership(t *testing.T) {
	ctx := context.Background()
	h, mem, local := sharedHub(t, [][2]string{{"t1", "alice"}, {"t1", "bob"}, {"t2", "carol"}, {"t2", "bob"}})
	alice, bob, carol := local("alice"), local("bob"), local("carol")
	// While the node heard nothing: alice left t1, carol joined it.
	if err := mem.RemoveMember(ctx, "t1", "alice"); err != nil {
		t.Fatal(err)
	}
	if err := mem.AddMember(ctx, "t1", "carol"); err != nil {
		t.Fatal(err)
	}
	h.resync(func(string) uint64 { return 0 })
	h.work.drain(ctx) // the joins and reconciles the resync queued

	teams := func(user string) string {
		ts := h.teamsOf(user)
		slices.Sort(ts)
		return fmt.Sprint(ts)
	}
	if got := teams("alice"); got != "[]" {
		t.Fatalf("alice is indexed under %s, want no team", got)
	}
	if got := teams("carol"); got != "[t1 t2]" {
		t.Fatalf("carol is indexed under %s, want [t1 t2]", got)
	}
	for _, c := range []*client{alice, bob, carol} {
		c.mu.Lock()
		c.pending, c.order = nil, nil
		c.mu.Unlock()
	}
	h.OnPresence(store.PresenceEvent{Change: change("bob", presence.Away, 9), Teams: []string{"t1", "t2"}, Via: "t1"})
	alice.mu.Lock()
	leaked := len(alice.pending)
	alice.mu.Unlock()
	if leaked != 0 {
		t.Fatalf("alice, no longer in t1, was queued bob's change")
	}
	carol.mu.Lock()
	got := fmt.Sprint(carol.pending)
	carol.mu.Unlock()
	if want := fmt.Sprint(map[string]protocol.Change{"bob": wireChange(change("bob", presence.Away, 9))}); got != want {
		t.Fatalf("carol's outbox = %s, want %s", got, want)
	}
}

// A local user who joined, while the node heard nothing, a team no local
// user was in: the resync finds that team too, or the user never hears its
// members (and they never hear it).
func TestResyncFindsATeamNoLocalUserWasIn(t *testing.T) {
	ctx := context.Background()
	h, mem, local := sharedHub(t, [][2]string{{"t1", "carol"}, {"t3", "dave"}})
	carol := local("carol")
	if err := mem.AddMember(ctx, "t3", "carol"); err != nil { // missed
		t.Fatal(err)
	}
	if err := mem.Connect(ctx, presence.Conn{ID: "d1", UserID: "dave", Device: "web"}); err != nil {
		t.Fatal(err)
	}
	carol.mu.Lock()
	carol.pending, carol.order = nil, nil
	carol.mu.Unlock()
	h.resync(func(string) uint64 { return 0 })
	h.work.drain(ctx)
	ts := h.teamsOf("carol")
	slices.Sort(ts)
	if got := fmt.Sprint(ts); got != "[t1 t3]" {
		t.Fatalf("carol is indexed under %s, want [t1 t3]", got)
	}
	carol.mu.Lock()
	ch, ok := carol.pending["dave"]
	carol.mu.Unlock()
	if !ok || ch.State != "online" {
		t.Fatalf("carol's outbox has dave = %+v (%v), want online: the join's catch-up", ch, ok)
	}
}

// drain runs the queued jobs, and those they queue, on the caller's
// goroutine (tests without the worker loop).
func (w *worker) drain(ctx context.Context) {
	for {
		w.mu.Lock()
		jobs := w.jobs
		w.jobs = nil
		w.mu.Unlock()
		if len(jobs) == 0 {
			return
		}
		for _, job := range jobs {
			job(ctx)
		}
	}
}

// sharedHub is a hub on a memory store taken for a shared one (views on),
// with the given memberships; local connects a socketless client. No
// events flow by themselves: tests deliver them.
func sharedHub(t *testing.T, members [][2]string) (*hub, *memstore.Store, func(user string) *client) {
	t.Helper()
	ctx := context.Background()
	mem, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := socketlessServer()
	s.metrics = newMetrics(prometheus.NewRegistry())
	s.store = sharedMem{mem}
	s.hub = newHub(s)
	for _, m := range members {
		if err := mem.AddMember(ctx, m[0], m[1]); err != nil {
			t.Fatal(err)
		}
	}
	local := func(user string) *client {
		t.Helper()
		c := &client{srv: s, user: user}
		c.closed.Store(true) // no socket: writes are no-ops
		if _, err := s.hub.add(ctx, c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	return s.hub, mem, local
}

// A user whose keys a data loss took, offline since before it, reads as
// offline at version 0 with no last seen. Viewers hold them offline
// already: a resync sent them "offline" again for the sake of the last seen
// lost (chaos, one Redis, seed 4120303: 5 doubled offlines after an empty
// restart).
func TestViewsResyncKeepsAnOfflineTheStoreLost(t *testing.T) {
	v := newViews()
	v.routeOne("t", presence.Change{UserID: "gone", State: presence.Offline, Version: 5, LastSeen: time.UnixMilli(1_000_000)})
	v.routeOne("t", change("was", presence.Online, 5))
	truth := []presence.Presence{seen("gone", presence.Offline, 0), seen("was", presence.Offline, 0)}
	var got []presence.Change
	for _, ch := range v.resync("t", truth, func(string) uint64 { return 100 }) {
		got = append(got, ch.Change)
	}
	// Who was online and lost is offline now, at the floor; who was
	// offline already is no news.
	if want := []presence.Change{change("was", presence.Offline, 100)}; !slices.Equal(got, want) {
		t.Fatalf("resync sent %v, want %v", got, want)
	}
	if !v.routeOne("t", presence.Change{UserID: "gone", State: presence.Online, Version: 6}) {
		t.Fatal("the next real change of the kept offline must still go out")
	}
}

// Chaos seed 681366401 (one Redis): after an empty restart, u09, long
// offline, read as the store now had it: offline at version 0, no last
// seen. A snapshot's read of it, or a joiner's catch-up adopting t3's hold
// from another team whose view read it so, took that for a disagreement
// with t3's members, who hold u09 offline; the next resync sent them all
// the offline again.
func TestViewsReadOfAnOfflineTheStoreLostIsNoDisagreement(t *testing.T) {
	lost := seen("gone", presence.Offline, 0)
	held := presence.Change{UserID: "gone", State: presence.Offline, Version: 5, LastSeen: time.UnixMilli(1_000_000)}
	resyncSends := func(v *views) []resyncChange {
		return v.resync("t3", []presence.Presence{lost}, func(string) uint64 { return 100 })
	}
	t.Run("a snapshot's read", func(t *testing.T) {
		v := newViews()
		v.routeOne("t3", held)
		r := &client{user: "reader"}
		r.noted.Store(true)
		v.readAll("t3", []presence.Presence{lost}, r, true)
		if cur, _ := v.get("t3", "gone"); cur.odd != nil || cur.version != 5 {
			t.Fatalf("view after the read: %+v, want version 5 and no odds", cur)
		}
		if diff := resyncSends(v); len(diff) != 0 {
			t.Fatalf("resync sent %v, want nothing: every member holds gone offline", diff)
		}
	})
	t.Run("adopted from a team that read it", func(t *testing.T) {
		v := newViews()
		v.routeOne("t3", held)
		v.read("t0", lost, nil, false) // t0's join event, its first of gone here
		v.adopt("t3", "t0", "gone", true)
		if cur, _ := v.get("t3", "gone"); cur.odd != nil {
			t.Fatalf("t3's view after the adoption: %+v, want no odds", cur)
		}
		if diff := resyncSends(v); len(diff) != 0 {
			t.Fatalf("resync sent %v, want nothing: every member holds gone offline", diff)
		}
	})
	// Where the members disagree already, the reader is noted as holding
	// offline (not as unknown, nor as holding what the others do): the next
	// online reaches it.
	t.Run("beside members who disagree", func(t *testing.T) {
		v := newViews()
		v.routeOne("t3", change("gone", presence.Online, 5))
		x, r, other := &client{user: "x"}, &client{user: "reader"}, &client{user: "other"}
		for _, c := range []*client{x, r, other} {
			c.noted.Store(true)
		}
		v.readAll("t3", []presence.Presence{seen("gone", presence.Offline, 6)}, x, true) // not routed
		v.readAll("t3", []presence.Presence{lost}, r, true)
		d := []reach{{}}
		v.route([]string{"t3"}, change("gone", presence.Online, 7), d)
		if !d[0].to(r) || !d[0].to(x) || d[0].to(other) {
			t.Fatalf("the next online reaches reader %v, x %v, other %v; want the two who hold offline only",
				d[0].to(r), d[0].to(x), d[0].to(other))
		}
	})
}

// Chaos seed 643529765 (one Redis, finding 14): a node cut off from Redis
// re-asserted a device that had just dropped; the script landed as the
// partition healed, its reply was lost, and the online it wrote was never
// published. The offline that ended it came with a new last seen to
// viewers who held the user offline already: "went offline" twice. An
// offline after an offline moves no dot, whatever its last seen; a change
// of the offline's status text still does.
func TestViewsOfflineAfterOfflineIsNoNews(t *testing.T) {
	at := func(ms int64) time.Time { return time.UnixMilli(ms) }
	released := presence.Change{UserID: "u15", State: presence.Offline, Version: 7, LastSeen: at(573_000)}
	ended := presence.Change{UserID: "u15", State: presence.Offline, Version: 9, LastSeen: at(580_100)}
	t.Run("routed", func(t *testing.T) {
		v := newViews()
		v.routeOne("t", change("u15", presence.Online, 6))
		if !v.routeOne("t", released) {
			t.Fatal("the first offline must go out")
		}
		if v.routeOne("t", ended) {
			t.Fatal("an offline after an offline went out: only its last seen differs")
		}
		texted := ended
		texted.Version, texted.Text = 10, "on leave"
		if !v.routeOne("t", texted) {
			t.Fatal("a new status text on an offline user is news")
		}
	})
	t.Run("members who disagree", func(t *testing.T) {
		v := newViews()
		v.routeOne("t", released)
		x, y := &client{user: "x"}, &client{user: "y"}
		x.noted.Store(true)
		y.noted.Store(true)
		v.readAll("t", []presence.Presence{seen("u15", presence.Online, 8)}, x, true)
		d := []reach{{}}
		v.route([]string{"t"}, ended, d)
		if !d[0].to(x) {
			t.Fatal("x read u15 online: the offline must reach it")
		}
		if d[0].to(y) {
			t.Fatal("y held u15 offline: only the last seen differs, nothing to send")
		}
	})
	t.Run("resynced", func(t *testing.T) {
		v := newViews()
		v.routeOne("t", released)
		truth := []presence.Presence{{UserID: "u15", State: presence.Offline, Version: 9, LastSeen: at(580_100)}}
		if diff := v.resync("t", truth, func(string) uint64 { return 100 }); len(diff) != 0 {
			t.Fatalf("resync sent %v, want nothing: the members hold u15 offline", diff)
		}
	})
}

// A resync that finds a member the store lost (offline, version 0) where
// the view holds their offline keeps the view's version, and its since:
// a join's catch-up sends the view's state later, and every entry carries
// since.
func TestViewsResyncKeepsTheSinceOfWhatTheMembersHold(t *testing.T) {
	v := newViews()
	at := time.Now().Truncate(time.Millisecond)
	v.routeOne("t1", presence.Change{UserID: "u15", State: presence.Offline, Version: 5, At: at, Since: at, LastSeen: at})
	if out := v.resync("t1", []presence.Presence{{UserID: "u15"}}, func(string) uint64 { return 10 }); len(out) != 0 {
		t.Fatalf("the resync sent %+v; the members hold u15 offline already", out)
	}
	cur, _ := v.get("t1", "u15")
	if cur.version != 5 || cur.since != at.UnixMilli() {
		t.Fatalf("view after the resync: version %d, since %d; want 5, %d", cur.version, cur.since, at.UnixMilli())
	}
	// An older offline (a replica behind) with another last seen: the view
	// keeps what the members hold, last seen included.
	before := at.Add(-time.Minute)
	v.resync("t1", []presence.Presence{{UserID: "u15", State: presence.Offline, Version: 3, Since: before, LastSeen: before, ShownLastSeen: before}},
		func(string) uint64 { return 10 })
	cur, _ = v.get("t1", "u15")
	if cur.version != 5 || cur.since != at.UnixMilli() || cur.look.LastSeen != at.UnixMilli() {
		t.Fatalf("view after an older read: version %d, since %d, last seen %d; want 5, %d, %d",
			cur.version, cur.since, cur.look.LastSeen, at.UnixMilli(), at.UnixMilli())
	}
}
