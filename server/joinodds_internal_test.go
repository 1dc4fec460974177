package server

import (
	"context"
	"fmt"
	"testing"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
)

// Chaos seed 618395093 (one Redis): alice and carol connected at once (a
// node drained onto this one), so t's view of bob names each of them as
// holding him (erin, there before, holds him offline: his online never
// reached the node). dave's join of t then sent dave bob, and the view,
// told only that "some member" read him, forgot who held what: the resync
// that a node found dead asked for sent bob's unchanged state to every
// member of t.
func TestJoinCatchUpKeepsAMixedViewExact(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, st, _, local := catchUpHub(t, kind, [][2]string{{"t", "alice"}, {"t", "bob"}, {"t", "carol"}, {"t", "erin"}, {"x", "dave"}})
		we := &wire{c: local("erin")}
		v := online(t, st, "bob")
		alice, noteAlice := connectLocal(t, h, st, "alice")
		carol, noteCarol := connectLocal(t, h, st, "carol")
		noteAlice()
		noteCarol()
		if cur, _ := h.views.get("t", "bob"); cur.odd == nil {
			t.Fatalf("t's view of bob = %+v, want mixed", cur)
		}
		wa, wc, wd := &wire{c: alice}, &wire{c: carol}, &wire{c: local("dave")}
		if err := st.AddMember(ctx, "t", "dave"); err != nil {
			t.Fatal(err)
		}
		h.OnMembership(store.MembershipEvent{Team: "t", UserID: "dave", Joined: true, UserTeams: store.TeamList{"t", "x"}})
		runJobs(ctx, h, wa, wc, wd)
		h.resync(noFloor)
		for _, w := range []*wire{wa, wc, wd} {
			w.write()
		}
		if got := wa.String() + wc.String(); got != "[][]" {
			t.Errorf("alice and carol were sent %s, want nothing: their snapshots showed bob", got)
		}
		if got, want := wd.String(), fmt.Sprintf("[bob=online@%d]", v); got != want {
			t.Errorf("dave was sent %s, want bob online once, by his catch-up", got)
		}
		we.write()
		if got, want := we.String(), fmt.Sprintf("[bob=online@%d]", v); got != want {
			t.Errorf("erin was sent %s, want bob online once, by the resync", got)
		}
	})
}

// A crowd connecting to a node at once, with no change to come (every
// subject's online reached the node before the team had local members),
// leaves every view agreed once each snapshot is noted: views kept mixed
// cost memory per subject for as long as the team has members (22 MB on a
// node with 5,000 idle connections in teams of 100).
func TestCrowdConnectingAtOnceLeavesViewsAgreed(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		users := []string{"u0", "u1", "u2", "u3", "u4", "u5"}
		var members [][2]string
		for _, u := range users {
			members = append(members, [2]string{"t", u}, [2]string{"t", "away-" + u})
		}
		h, st, _, _ := catchUpHub(t, kind, members)
		for _, u := range users {
			online(t, st, "away-"+u) // connected to another node
		}
		var notes []func()
		var conns []*client
		for _, u := range users {
			c, note := connectLocal(t, h, st, u)
			conns, notes = append(conns, c), append(notes, note)
		}
		// The first noted holds every subject before the others are noted:
		// the views are mixed until the last one is.
		for i, note := range notes {
			note()
			cur, _ := h.views.get("t", "away-u0")
			if mixed, last := cur.odd != nil, i == len(notes)-1; mixed == last {
				t.Fatalf("after %d of %d snapshots noted, t's view of away-u0 = %+v, want mixed %v", i+1, len(notes), cur, !last)
			}
		}
		for _, u := range users {
			if cur, _ := h.views.get("t", "away-"+u); cur.odd != nil || cur.look.State != presence.Online {
				t.Errorf("t's view of away-%s = %+v, want online and agreed", u, cur)
			}
		}
		// Agreed, and right: the resync sends nothing, a change reaches each.
		h.resync(noFloor)
		v := setActive(t, st, "away-u0", false)
		h.OnPresence(store.PresenceEvent{Change: change("away-u0", presence.Away, v), Teams: []string{"t"}, Via: "t"})
		for i, c := range conns {
			w := &wire{c: c}
			w.write()
			if got, want := w.String(), fmt.Sprintf("[away-u0=away@%d]", v); got != want {
				t.Errorf("%s was sent %s, want nothing from the resync, then %s", users[i], got, want)
			}
		}
	})
}

// Chaos seed 618395093, the other side: u13's join of t1 finds t1's view
// of u13 mixed (u21's snapshot, read after the join was written, holds
// him; u30's, read before, does not; u07 sees him through t0). The event
// sends u13 to u30 only; after it every member holds u13, and a resync must
// send nobody anything.
func TestJoinEventToAMixedViewLeavesItExact(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, st, _, local := catchUpHub(t, kind, [][2]string{{"t1", "u21"}, {"t1", "u30"}, {"t0", "u13"}, {"t1", "u07"}, {"t0", "u07"}})
		v := online(t, st, "u13")
		through := &wire{c: local("u07")}
		before := &wire{c: local("u30")}
		if err := st.AddMember(ctx, "t1", "u13"); err != nil {
			t.Fatal(err)
		}
		after := &wire{c: local("u21")}
		h.OnMembership(store.MembershipEvent{Team: "t1", UserID: "u13", Joined: true,
			State: presence.Online, Version: v, UserTeams: store.TeamList([]string{"t0", "t1"})})
		runJobs(ctx, h, before, after, through)
		h.resync(noFloor)
		before.write()
		after.write()
		through.write()
		if got := through.String(); got != "[]" {
			t.Errorf("u07, who sees u13 through t0, was sent %s, want nothing", got)
		}
		if got, want := before.String(), fmt.Sprintf("[u13=online@%d]", v); got != want {
			t.Errorf("u30 was sent %s, want %s once, by the join", got, want)
		}
		if got := after.String(); got != "[]" {
			t.Errorf("u21, whose snapshot holds u13 at v%d, was sent %s, want nothing", v, got)
		}
		if cur, _ := h.views.get("t1", "u13"); cur.odd != nil {
			t.Errorf("t1's view of u13 = %+v after the join and a resync, want agreed", cur)
		}
	})
}

// A join event to a mixed view whose state is offline pushes no offline to
// the members who hold the subject online (offline is what they would hold
// anyway, had they not read him): the view must not record that they hold
// offline, or the resync that corrects them sends nothing, and they show
// the subject online until his next change.
func TestJoinEventPushingNoOfflineLeavesTheViewUnsure(t *testing.T) {
	// The memory store ends a user at once (no grace): offline without a
	// sweep.
	for _, kind := range []string{"shared"} {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			h, st, _, local := catchUpHub(t, kind, [][2]string{{"t", "alice"}, {"t", "carol"}, {"x", "bob"}})
			v := online(t, st, "bob")
			if err := st.AddMember(ctx, "t", "bob"); err != nil {
				t.Fatal(err)
			}
			alice := &wire{c: local("alice")} // her snapshot shows bob online
			if err := st.Disconnect(ctx, "d-bob", presence.Closed); err != nil {
				t.Fatal(err)
			}
			if err := st.(interface{ Sweep(context.Context) error }).Sweep(ctx); err != nil {
				t.Fatal(err)
			}
			ps, err := st.Presence(ctx, []string{"bob"}) // missed: no event reaches the node
			if err != nil || ps[0].State != presence.Offline {
				t.Fatalf("bob is %+v (%v), want offline", ps, err)
			}
			off := ps[0].Version
			carol := &wire{c: local("carol")} // hers shows him offline
			if cur, _ := h.views.get("t", "bob"); cur.odd == nil || cur.version != off {
				t.Fatalf("t's view of bob = %+v, want mixed at v%d", cur, off)
			}
			h.OnMembership(store.MembershipEvent{Team: "t", UserID: "bob", Joined: true,
				State: presence.Online, Version: v, UserTeams: store.TeamList{"t", "x"}})
			runJobs(ctx, h, alice, carol)
			h.resync(noFloor)
			alice.write()
			carol.write()
			if got, want := alice.String(), fmt.Sprintf("[bob=offline@%d]", off); got != want {
				t.Errorf("alice, who holds bob online, was sent %s, want %s", got, want)
			}
			if got := carol.String(); got != "[]" {
				t.Errorf("carol, whose snapshot holds bob offline, was sent %s, want nothing", got)
			}
		})
	}
}

// A join event reaching a connection between the read of its snapshot
// (before the join was written: no bob) and the note of it queues bob,
// and the snapshot sent folds him in. The note must not record that the
// connection holds nothing of bob, or bob's offline, which moves nothing
// for a member holding nothing, is not sent it: bob stays online there.
func TestJoinQueuedBeforeTheSnapshotIsNotedIsHeld(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, st, _, _ := catchUpHub(t, kind, [][2]string{{"t", "alice"}, {"x", "bob"}})
		v := online(t, st, "bob")
		c, teams := addLocal(t, h, "alice")
		members, ps := readSnapshot(t, st, teams) // alice alone in t
		if err := st.AddMember(ctx, "t", "bob"); err != nil {
			t.Fatal(err)
		}
		h.OnMembership(store.MembershipEvent{Team: "t", UserID: "bob", Joined: true,
			State: presence.Online, Version: v, UserTeams: store.TeamList{"t", "x"}})
		runJobs(ctx, h)
		h.noteSnapshot(c, members, ps)
		w := &wire{c: c}
		w.write() // the snapshot, bob folded in
		h.OnPresence(store.PresenceEvent{Change: change("bob", presence.Offline, v+1), Teams: []string{"t", "x"}, Via: "t"})
		w.write()
		if got, want := w.String(), fmt.Sprintf("[bob=online@%d bob=offline@%d]", v, v+1); got != want {
			t.Fatalf("alice was sent %s, want %s", got, want)
		}
	})
}

// The other side of a crowd's first read: carol's snapshot was read before
// bob came online and is noted only after alice's, which holds him. The
// route of bob's online, coming after alice's note, must still reach carol
// (it is news to her), and not alice; once carol's note folds it in, the
// view is agreed.
func TestCrowdFirstReadStillRoutesToThoseReadEarlier(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		h, st, _, _ := catchUpHub(t, kind, [][2]string{{"t", "alice"}, {"t", "bob"}, {"t", "carol"}})
		carol, teams := addLocal(t, h, "carol")
		members, ps := readSnapshot(t, st, teams) // bob offline
		v := online(t, st, "bob")
		alice, noteAlice := connectLocal(t, h, st, "alice")
		noteAlice()
		h.OnPresence(store.PresenceEvent{Change: change("bob", presence.Online, v), Teams: []string{"t"}, Via: "t"})
		h.noteSnapshot(carol, members, ps)
		wa, wc := &wire{c: alice}, &wire{c: carol}
		wa.write()
		wc.write()
		if got := wa.String(); got != "[]" {
			t.Errorf("alice, whose snapshot holds bob, was sent %s, want nothing", got)
		}
		if got, want := wc.String(), fmt.Sprintf("[bob=online@%d]", v); got != want {
			t.Errorf("carol was sent %s, want %s", got, want)
		}
		if cur, _ := h.views.get("t", "bob"); cur.odd != nil {
			t.Errorf("t's view of bob = %+v, want agreed", cur)
		}
	})
}
