package server

import (
	"context"
	"fmt"
	"testing"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
)

// Finding 11 of docs/reliability-findings.md: a joiner's catch-up running ahead of
// a teammate's join of another team the joiner is in (catchUpHub and its
// helpers: joincatchup_internal_test.go).

// Chaos seed 466426994 (one Redis): u03 joins t0 while u09, in t0, joins
// t2, which u03 is in and another member here (u08) sees u03 through. u09's
// catch-up of t2 reads u03 in t0 before u03's join of t0 is routed here:
// t0's members were not shown u03 yet, so t0 cannot be the team that showed
// them. Then the join of t0 finds u09 in t2, whose view holds u03 (u08's),
// and skips u09 too. u09 must be sent u03 once, by one or the other.
func TestJoinCatchUpAheadOfATeammatesJoinOfAnotherTeam(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, w, v := aheadHub(t, kind)
		runJobs(ctx, h, w)
		u03JoinsT0(h, v)
		runJobs(ctx, h, w)
		wantU03Once(t, w, v, "u09")
	})
}

// The same, with t0's view holding u03 already, read by the snapshot of
// another member of t0 (u07) that connected after u03's join was written:
// that view shows u03 to u07 only, not to u09.
func TestJoinCatchUpAheadOfATeammatesJoinReadByAnotherSnapshot(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, st, _, local := catchUpHub(t, kind, [][2]string{{"t0", "u09"}, {"t0", "u07"}, {"t2", "u03"}, {"t2", "u08"}})
		v := online(t, st, "u03")
		w := &wire{c: local("u09")}
		local("u08")
		addMembers(t, st, [2]string{"t0", "u03"})
		w7 := &wire{c: local("u07")} // its snapshot shows u03
		addMembers(t, st, [2]string{"t2", "u09"})
		u09JoinsT2(h)
		runJobs(ctx, h, w, w7)
		u03JoinsT0(h, v)
		runJobs(ctx, h, w, w7)
		wantU03Once(t, w, v, "u09")
		if w7.write(); w7.String() != "[]" {
			t.Errorf("u07 was sent %s, want nothing: its snapshot showed u03", w7)
		}
	})
}

// The same, with one of u09's two devices connected while Redis had lost
// u03's membership of t0 (its snapshot lacked u03), and the membership
// written back before u09 joins t2: that device alone is sent u03.
func TestJoinCatchUpReachesTheDeviceWhoseSnapshotLackedATeammate(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, st, _, local := catchUpHub(t, kind, [][2]string{{"t0", "u09"}, {"t0", "u03"}, {"t2", "u03"}, {"t2", "u08"}})
		v := online(t, st, "u03")
		w1 := &wire{c: local("u09")} // shows u03
		local("u08")
		if err := st.RemoveMember(ctx, "t0", "u03"); err != nil { // lost: no event
			t.Fatal(err)
		}
		w2 := &wire{c: local("u09")} // lacks u03
		addMembers(t, st, [2]string{"t0", "u03"}, [2]string{"t2", "u09"})
		u09JoinsT2(h)
		runJobs(ctx, h, w1, w2)
		u03JoinsT0(h, v)
		runJobs(ctx, h, w1, w2)
		if w1.write(); w1.String() != "[]" {
			t.Errorf("u09's first device was sent %s, want nothing: its snapshot showed u03", w1)
		}
		wantU03Once(t, w2, v, "u09's second device")
	})
}

// u09 joins t2 and leaves l, which showed it u03 and which it was the only
// member of here, before its catch-up of t2 runs: l's view is gone with the
// leave, but l showed u03 until then. Nothing is sent again.
func TestJoinCatchUpCountsATeamBeingLeft(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, st, _, local := catchUpHub(t, kind, [][2]string{{"l", "u09"}, {"l", "u03"}, {"t2", "u03"}, {"t2", "u08"}})
		online(t, st, "u03")
		w := &wire{c: local("u09")}
		local("u08")
		addMembers(t, st, [2]string{"t2", "u09"})
		h.OnMembership(store.MembershipEvent{Team: "t2", UserID: "u09", Joined: true, UserTeams: store.TeamList{"l", "t2"}})
		runFirstJob(ctx, h) // indexes u09 under t2; the catch-up waits
		if err := st.RemoveMember(ctx, "l", "u09"); err != nil {
			t.Fatal(err)
		}
		h.OnMembership(store.MembershipEvent{Team: "l", UserID: "u09", UserTeams: store.TeamList{"t2"}})
		runJobs(ctx, h, w)
		if got := w.String(); got != "[]" {
			t.Errorf("u09 was sent %s, want nothing: l showed it u03", got)
		}
	})
}

// u09 joins t2, whose watch fails (u09 is not indexed under it), while
// u03's join of t0, which u09 is in, is written and not routed here yet:
// that join, not the catch-up of a team u09 gets nothing through, sends
// u09 u03, once.
func TestJoinCatchUpOfATeamNotIndexedLeavesATeammateToTheirJoin(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, w, v := aheadHub(t, kind)
		h.work.mu.Lock()
		h.work.jobs = h.work.jobs[1:] // the watch of t2 fails: joinWatched indexes nothing
		h.work.mu.Unlock()
		runJobs(ctx, h, w)
		u03JoinsT0(h, v)
		runJobs(ctx, h, w)
		wantU03Once(t, w, v, "u09")
	})
}

// aheadHub is the scene of seed 466426994: u09 (a connection here, w) in
// t0, u03 (online at v) and u08 (a connection here) in t2; u03's join of t0
// and u09's of t2 written, and u09's event delivered.
func aheadHub(t *testing.T, kind string) (*hub, *wire, uint64) {
	t.Helper()
	h, st, _, local := catchUpHub(t, kind, [][2]string{{"t0", "u09"}, {"t2", "u03"}, {"t2", "u08"}})
	v := online(t, st, "u03")
	w := &wire{c: local("u09")}
	local("u08")
	addMembers(t, st, [2]string{"t0", "u03"}, [2]string{"t2", "u09"})
	u09JoinsT2(h)
	return h, w, v
}

// addMembers writes memberships, their events not delivered.
func addMembers(t *testing.T, st store.Store, ms ...[2]string) {
	t.Helper()
	for _, m := range ms {
		if err := st.AddMember(context.Background(), m[0], m[1]); err != nil {
			t.Fatal(err)
		}
	}
}

// u09JoinsT2 delivers the event of u09's join of t2 (in t0 already).
func u09JoinsT2(h *hub) {
	h.OnMembership(store.MembershipEvent{Team: "t2", UserID: "u09", Joined: true, UserTeams: store.TeamList{"t0", "t2"}})
}

// u03JoinsT0 delivers the event of u03's join of t0 (in t2 already), online
// at v.
func u03JoinsT0(h *hub, v uint64) {
	h.OnMembership(store.MembershipEvent{Team: "t0", UserID: "u03", Joined: true, UserTeams: store.TeamList{"t0", "t2"},
		State: presence.Online, Version: v})
}

// wantU03Once checks that w's connection (who) was sent u03 online at v,
// once, and nothing else.
func wantU03Once(t *testing.T, w *wire, v uint64, who string) {
	t.Helper()
	w.write()
	if got, want := w.String(), fmt.Sprintf("[u03=online@%d]", v); got != want {
		t.Errorf("%s was sent %s, want u03 online once", who, got)
	}
}

// runFirstJob runs the worker's first queued job only.
func runFirstJob(ctx context.Context, h *hub) {
	h.work.mu.Lock()
	if len(h.work.jobs) == 0 {
		h.work.mu.Unlock()
		return
	}
	job := h.work.jobs[0]
	h.work.jobs = h.work.jobs[1:]
	h.work.mu.Unlock()
	job(ctx)
}
