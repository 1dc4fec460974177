package server

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
)

// eachSharedStore is eachStore for the stores with views: a resync and a
// mixed view exist only there.
func eachSharedStore(t *testing.T, f func(t *testing.T, kind string)) {
	for _, kind := range []string{"shared", "redis"} {
		t.Run(kind, func(t *testing.T) { f(t, kind) })
	}
}

// away sets user's device idle in the store, no event reaching the hub (as
// in an outage), and returns the new version.
func away(t *testing.T, st store.Store, user string) uint64 {
	t.Helper()
	return setActive(t, st, user, false)
}

func setActive(t *testing.T, st store.Store, user string, active bool) uint64 {
	t.Helper()
	ctx := context.Background()
	if err := st.SetStatus(ctx, "d-"+user, active); err != nil {
		t.Fatal(err)
	}
	ps, err := st.Presence(ctx, []string{user})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[bool]presence.State{true: presence.Online, false: presence.Away}[active]; ps[0].State != want {
		t.Fatalf("%s is %v, want %v", user, ps[0].State, want)
	}
	return ps[0].Version
}

// noFloor is a resync's floor after which nothing was published.
func noFloor(string) uint64 { return math.MaxUint64 }

// A teammate seen through two teams whose change the node missed differs
// in both teams' views: the resync, comparing team by team, must still send
// it to a viewer in both teams once, even when the viewer's socket took the
// first before the second team was read.
func TestResyncSendsATeammateOfTwoTeamsOnce(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		h, st, sm, local := catchUpHub(t, kind, [][2]string{{"t1", "alice"}, {"t1", "bob"}, {"t2", "alice"}, {"t2", "bob"}})
		online(t, st, "bob")
		w := &wire{c: local("alice")}
		v := away(t, st, "bob")
		sm.beforeMembers = func(string) { w.write() }
		h.resync(noFloor)
		w.write()
		if got, want := w.String(), fmt.Sprintf("[bob=away@%d]", v); got != want {
			t.Fatalf("alice was sent %s, want bob away once", got)
		}
	})
}

// mixedTeam is a team whose members disagree: alice's snapshot showed bob
// online, carol's, read after bob went idle and before that change reached
// the node, shows him away. It returns the wires of alice and carol and
// bob's away version.
func mixedTeam(t *testing.T, kind string) (*hub, store.Store, *wire, *wire, uint64) {
	t.Helper()
	h, st, _, local := catchUpHub(t, kind, [][2]string{{"t", "alice"}, {"t", "bob"}, {"t", "carol"}})
	online(t, st, "bob")
	wa := &wire{c: local("alice")}
	v := away(t, st, "bob")
	wc := &wire{c: local("carol")}
	if cur, _ := h.views.get("t", "bob"); cur.odd == nil {
		t.Fatalf("t's view of bob = %+v, want mixed", cur)
	}
	return h, st, wa, wc, v
}

// A resync after the away was lost sends it to alice only: carol holds it.
func TestResyncOfAMixedTeamSkipsWhoHoldsTheState(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		h, _, wa, wc, v := mixedTeam(t, kind)
		h.resync(noFloor)
		wa.write()
		wc.write()
		if got, want := wa.String(), fmt.Sprintf("[bob=away@%d]", v); got != want {
			t.Fatalf("alice was sent %s, want bob away", got)
		}
		if got := wc.String(); got != "[]" {
			t.Fatalf("carol was sent %s, want nothing: her snapshot showed bob away", got)
		}
		if cur, _ := h.views.get("t", "bob"); cur.odd != nil {
			t.Fatalf("t's view of bob = %+v after the resync, want agreed", cur)
		}
	})
}

// The away, arriving late, reaches alice only; a later change reaches
// whoever holds something else, and then the team agrees again.
func TestRouteToAMixedTeamSkipsWhoHoldsTheState(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		h, _, wa, wc, v := mixedTeam(t, kind)
		h.OnPresence(store.PresenceEvent{Change: change("bob", presence.Away, v), Teams: []string{"t"}, Via: "t"})
		wa.write()
		wc.write()
		if got, want := wa.String(), fmt.Sprintf("[bob=away@%d]", v); got != want {
			t.Fatalf("alice was sent %s, want bob away", got)
		}
		if got := wc.String(); got != "[]" {
			t.Fatalf("carol was sent %s, want nothing: her snapshot showed bob away", got)
		}
		h.OnPresence(store.PresenceEvent{Change: change("bob", presence.Online, v+1), Teams: []string{"t"}, Via: "t"})
		wa.write()
		wc.write()
		want := fmt.Sprintf("bob=online@%d", v+1)
		if got := wa.String(); got != fmt.Sprintf("[bob=away@%d %s]", v, want) {
			t.Fatalf("alice was sent %s, want bob away then online", got)
		}
		if got := wc.String(); got != "["+want+"]" {
			t.Fatalf("carol was sent %s, want bob online", got)
		}
	})
}

// A change back to what the members read before the reader's snapshot
// reaches the reader, who holds something else, and only it.
func TestRouteToAMixedTeamReachesTheReader(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		h, _, wa, wc, v := mixedTeam(t, kind)
		h.OnPresence(store.PresenceEvent{Change: change("bob", presence.Online, v+1), Teams: []string{"t"}, Via: "t"})
		wa.write()
		wc.write()
		if got := wa.String(); got != "[]" {
			t.Fatalf("alice was sent %s, want nothing: she holds bob online", got)
		}
		if got, want := wc.String(), fmt.Sprintf("[bob=online@%d]", v+1); got != want {
			t.Fatalf("carol was sent %s, want bob online", got)
		}
	})
}

// A connection indexed under the team whose snapshot is not noted yet is
// sent every change of a mixed view: the odds know nothing of it.
func TestRouteToAMixedTeamReachesAConnectionNotNotedYet(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		h, _, _, _, v := mixedTeam(t, kind)
		c := &client{srv: h.srv, user: "carol"}
		c.closed.Store(true)
		if _, err := h.add(context.Background(), c); err != nil {
			t.Fatal(err)
		}
		w := &wire{c: c}
		h.OnPresence(store.PresenceEvent{Change: change("bob", presence.Online, v+1), Teams: []string{"t"}, Via: "t"})
		w.write()
		if got, want := w.String(), fmt.Sprintf("[bob=online@%d]", v+1); got != want {
			t.Fatalf("carol's new connection was sent %s, want bob online", got)
		}
	})
}

// A resync pushes a connection a teammate's truth through the first team it
// reads; a change routed before the second team's turn, through that team
// first, must not take the second team's odds (from before the push) for
// what the connection holds.
func TestRouteThroughATeamTheResyncHasNotReachedYet(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		members := [][2]string{}
		for _, team := range []string{"t1", "t2"} {
			for _, u := range []string{"alice", "bob", "dave"} {
				members = append(members, [2]string{team, u})
			}
		}
		h, st, sm, local := catchUpHub(t, kind, members)
		online(t, st, "bob")
		local("dave")                 // holds bob online
		away(t, st, "bob")            // missed
		w := &wire{c: local("alice")} // holds bob away: both teams mixed
		v3 := setActive(t, st, "bob", true)
		var first string
		var v4 uint64
		sm.beforeMembers = func(team string) {
			w.write()
			if first == "" {
				first = team
				return
			}
			v4 = away(t, st, "bob")
			h.OnPresence(store.PresenceEvent{Change: change("bob", presence.Away, v4), Teams: []string{team, first}, Via: team})
			w.write()
		}
		h.resync(func(string) uint64 { return v3 + 1 })
		w.write()
		if got, want := w.String(), fmt.Sprintf("[bob=online@%d bob=away@%d]", v3, v4); got != want {
			t.Fatalf("alice was sent %s, want bob online then away", got)
		}
	})
}

// A change routed live while a resync is between its decision for a team
// and its pushes is queued after what the resync queued: flushed ahead of
// it, the connection would get the resync's older version second (out of
// order, seen from a review of the crash resyncs). Before the fix the live
// change was routed and flushed at once; now it waits for the team's pushes
// and supersedes the resync's change in the queue.
func TestLiveChangeDuringAResyncIsQueuedAfterIt(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		h, st, _, local := catchUpHub(t, kind, [][2]string{{"t", "alice"}, {"t", "bob"}})
		online(t, st, "bob")
		w := &wire{c: local("alice")} // holds bob online
		v := away(t, st, "bob")       // missed: the resync sends it
		live := liveDuringPush(h, w, store.PresenceEvent{Change: change("bob", presence.Online, v+1), Teams: []string{"t"}, Via: "t"})
		h.resync(noFloor)
		live.want(t, "the resync decided nothing for t", fmt.Sprintf("[bob=online@%d]", v+1))
	})
}

// The same for a join's catch-up: a change of a teammate routed live
// between the catch-up's decision and its push reached the joiner first,
// and the catch-up's older state second. Now the live change waits.
func TestLiveChangeDuringAJoinCatchUpIsQueuedAfterIt(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, st, _, local := catchUpHub(t, kind, [][2]string{{"a", "alice"}, {"t", "bob"}})
		v := online(t, st, "bob")
		w := &wire{c: local("alice")}
		addMembers(t, st, [2]string{"t", "alice"})
		h.OnMembership(store.MembershipEvent{Team: "t", UserID: "alice", Joined: true, UserTeams: store.TeamList{"a", "t"}})
		live := liveDuringPush(h, w, store.PresenceEvent{Change: change("bob", presence.Away, v+1), Teams: []string{"t"}, Via: "t"})
		runJobs(ctx, h) // the wire is written once the live change is routed
		live.want(t, "the catch-up decided nothing for t", fmt.Sprintf("[bob=away@%d]", v+1))
	})
}

// liveDuringPush routes ev live from the hub's next decision for a team
// to its pushes (beforePush): before the routing lock, the change was
// routed and written (w) ahead of them; now it waits for them.
func liveDuringPush(h *hub, w *wire, ev store.PresenceEvent) *livePush {
	l := &livePush{w: w}
	h.beforePush = func(string) {
		h.beforePush = nil
		done := make(chan struct{})
		l.done = done
		go func() {
			defer close(done)
			h.OnPresence(ev)
		}()
		select {
		case <-done:
			w.write() // routed ahead of the pushes: flushed
		case <-time.After(200 * time.Millisecond):
			// held back until the pushes are queued
		}
	}
	return l
}

// livePush is a change routed live by liveDuringPush.
type livePush struct {
	w    *wire
	done chan struct{} // closed once routed; nil while nothing was decided
}

// want waits for the live change, writes the wire and checks that it holds
// want alone: the older state queued first, superseded by the live change.
// undecided is the failure when no decision ran.
func (l *livePush) want(t *testing.T, undecided, want string) {
	t.Helper()
	if l.done == nil {
		t.Fatal(undecided)
	}
	<-l.done
	l.w.write()
	if got := l.w.String(); got != want {
		t.Fatalf("alice was sent %s, want %s: the older state superseded by the live change", got, want)
	}
}

// The same for a resync of a large team, whose members reach only their
// watchers: a watched member's change routed live between the resync's
// taking of a version and its push went out first.
func TestLiveChangeDuringALargeTeamResyncIsQueuedAfterIt(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		h, st, _, local := catchUpHub(t, kind, [][2]string{{"t", "alice"}, {"t", "bob"}, {"t", "carol"}})
		h.srv.cfg.LargeTeam = 2
		online(t, st, "bob")
		w := &wire{c: local("alice")}
		h.mu.RLock()
		large := h.isLargeLocked("t")
		h.mu.RUnlock()
		if !large {
			t.Fatal("t is not large")
		}
		h.watch.add(w.c, []string{"bob"})
		v := away(t, st, "bob") // missed: the resync sends it
		live := liveDuringPush(h, w, store.PresenceEvent{Change: change("bob", presence.Online, v+1), Teams: []string{"t"}, Via: "t"})
		h.resync(noFloor)
		live.want(t, "the resync sent t's watchers nothing", fmt.Sprintf("[bob=online@%d]", v+1))
	})
}

// Chaos seed 618395093 (one Redis, a write's reply lost): bob went away
// after the resync's floor, between its reads of t0 and t2. The resync
// sends the away to t0's members (its read is newer than what they hold),
// and the live copy of the change must still reach t2's: taken for a second
// copy of a change routed already through t0, it reached nobody, and carol
// showed bob online until she reconnected.
func TestChangeAfterTheResyncFloorReadByOneTeamReachesTheOther(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		h, st, sm, local := catchUpHub(t, kind, [][2]string{{"t0", "alice"}, {"t0", "bob"}, {"t2", "carol"}, {"t2", "bob"}})
		floor := online(t, st, "bob") // the last version before the resync
		wa, wc := &wire{c: local("alice")}, &wire{c: local("carol")}
		var v uint64
		sm.beforeMembers = func(string) {
			if v == 0 {
				v = 1 // the first team is read before the away
				return
			}
			if v == 1 {
				v = away(t, st, "bob")
			}
		}
		h.resync(func(string) uint64 { return floor })
		sm.beforeMembers = nil
		h.OnPresence(store.PresenceEvent{Change: change("bob", presence.Away, v), Teams: []string{"t0", "t2"}, Via: "t0"})
		wa.write()
		wc.write()
		want := fmt.Sprintf("[bob=away@%d]", v)
		if got := wa.String(); got != want {
			t.Errorf("alice was sent %s, want %s once", got, want)
		}
		if got := wc.String(); got != want {
			t.Errorf("carol was sent %s, want %s once", got, want)
		}
	})
}
