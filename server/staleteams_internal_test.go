package server

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
)

// A second connection of a user takes their teams from the node's index,
// which learns of a removal only from its event. A node cut off from Redis
// got the event at the heal together with the reads of a connect made
// during the cut, and the snapshot listed the members of the team the user
// had left (chaos, one Redis, seed 522684805: visibility). The connect's
// read of the members now drops a team the user is not in as of the read.
func TestSnapshotLeavesOutATeamLeftWhileItsEventIsOnTheWay(t *testing.T) {
	ctx := context.Background()
	h, st, _, local := catchUpHub(t, "redis", [][2]string{{"t0", "u03"}, {"t0", "u09"}, {"t1", "u03"}, {"t1", "u22"}})
	online(t, st, "u09")
	online(t, st, "u22")
	local("u03") // indexes u03 under t0 and t1
	// No events reach this hub by themselves: the removal's is held.
	if err := st.RemoveMember(ctx, "t0", "u03"); err != nil {
		t.Fatal(err)
	}

	c, teams, _, reads := registerSecond(t, h, "u03")
	if !slices.Contains(teams, "t0") {
		t.Fatalf("teams %v: the index should still hold t0 (its event was not delivered)", teams)
	}
	snap, _, err := h.srv.snapshot(ctx, c.user, teams, reads.members)
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, p := range snap {
		listed = append(listed, p.UserID)
	}
	if slices.Contains(listed, "u09") || !slices.Contains(listed, "u22") {
		t.Fatalf("the snapshot lists %v; want u22 (t1) and not u09 (t0, left)", listed)
	}
}

// The join's twin: the index lacks a team the user joined, its event on
// the way (or lost at a cut, for a resync to apply). The snapshot would
// leave the team's members out, and a client that held them, from a
// connection to another node, takes them for offline (chaos, one Redis,
// seed 621771424: a reconnect at the heal of its node's cut listed a
// teammate offline who had been online for 6 s). The connect is refused,
// to be retried once the index has the team.
func TestConnectRefusedWhileTheIndexLacksATeamJoined(t *testing.T) {
	ctx := context.Background()
	h, st, _, local := catchUpHub(t, "redis", [][2]string{{"t0", "u01"}, {"t1", "u03"}})
	online(t, st, "u03")
	local("u01") // indexes u01 under t0
	// No events reach this hub by themselves: the join's is held.
	if err := st.AddMember(ctx, "t1", "u01"); err != nil {
		t.Fatal(err)
	}
	c, teams, gen, reads := registerSecond(t, h, "u01")
	if slices.Contains(teams, "t1") {
		t.Fatalf("teams %v: the index should not have t1 yet (its event was not delivered)", teams)
	}
	if h.notGiven(c, gen, teams, reads) {
		t.Fatal("notGiven: true, want false: the snapshot would leave out t1, which the read has the user in")
	}

	// Once the join is applied, a connect goes through.
	h.OnMembership(store.MembershipEvent{Team: "t1", UserID: "u01", Joined: true, UserTeams: store.TeamList{"t0", "t1"}})
	runJobs(ctx, h)
	h.remove(c)
	if err := st.Disconnect(ctx, c.id, presence.Closed); err != nil {
		t.Fatal(err)
	}
	c, teams, gen, reads = registerSecond(t, h, "u01")
	if !slices.Contains(teams, "t1") || !h.notGiven(c, gen, teams, reads) {
		t.Fatalf("after the join: teams %v, notGiven false; want t1 and true", teams)
	}
}

// The other way to a user's side without a team the index holds: Redis
// lost it, and the memberships are being written back, a teammate's before
// the user's own. The connect leaves the team out, so the join that writes
// the user back, which the index takes for a team it holds, must still
// give that connection the team's members.
func TestJoinWrittenBackAfterASnapshotLeftTheTeamOutGivesItsMembers(t *testing.T) {
	ctx := context.Background()
	h, st, _, local := catchUpHub(t, "redis", [][2]string{{"t0", "u03"}, {"t0", "u09"}, {"t1", "u03"}, {"t1", "u22"}})
	v := online(t, st, "u09")
	online(t, st, "u22")
	first := &wire{c: local("u03")}
	// The user's side no longer holds t0, as after a loss written back
	// but for the user's own membership (no event reaches this hub).
	if err := st.RemoveMember(ctx, "t0", "u03"); err != nil {
		t.Fatal(err)
	}
	c, teams, gen, reads := registerSecond(t, h, "u03")
	if !h.notGiven(c, gen, teams, reads) {
		t.Fatal("notGiven: no membership event came, yet it reports one")
	}
	snap, members, err := h.srv.snapshot(ctx, c.user, teams, reads.members)
	if err != nil {
		t.Fatal(err)
	}
	h.noteSnapshot(c, members, snap)
	second := &wire{c: c}

	if err := st.AddMember(ctx, "t0", "u03"); err != nil {
		t.Fatal(err)
	}
	h.OnMembership(store.MembershipEvent{Team: "t0", UserID: "u03", Joined: true, UserTeams: store.TeamList{"t0", "t1"}})
	runJobs(ctx, h, first, second)
	if got, want := second.String(), fmt.Sprintf("[u09=online@%d]", v); got != want {
		t.Fatalf("the second connection was sent %s, want %s", got, want)
	}
	if got := first.String(); got != "[]" {
		t.Fatalf("the first connection, given t0 by its snapshot, was sent %s, want nothing", got)
	}
}

// A join and the removal after it can reach a node together (at the heal
// of a cut). The join's catch-up reads the team's members after both were
// written: the joiner, no longer among them, is not to be sent them.
func TestJoinCatchUpReadAfterTheLeaveSendsNothing(t *testing.T) {
	eachStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, st, _, local := catchUpHub(t, kind, [][2]string{{"t5", "u09"}})
		online(t, st, "u09")
		w := &wire{c: local("u01")}
		if err := st.AddMember(ctx, "t5", "u01"); err != nil {
			t.Fatal(err)
		}
		if err := st.RemoveMember(ctx, "t5", "u01"); err != nil {
			t.Fatal(err)
		}
		h.OnMembership(store.MembershipEvent{Team: "t5", UserID: "u01", Joined: true, UserTeams: store.TeamList{"t5"}})
		runJobs(ctx, h, w)
		h.OnMembership(store.MembershipEvent{Team: "t5", UserID: "u01", Joined: false, UserTeams: store.TeamList{}})
		runJobs(ctx, h, w)
		if got := w.String(); got != "[]" {
			t.Fatalf("u01, out of t5 again when its join's catch-up read it, was sent %s, want nothing", got)
		}
	})
}

// An event publishes the user's side as it is when sent, so the
// removal between a join and a re-join can reach a node as a join: the
// first join's catch-up reads the joiner out of the team and sends
// nothing, and the re-join, finding the team indexed, must still give the
// members.
func TestJoinCatchUpThatFoundTheJoinerOutLeavesTheNextJoinToGive(t *testing.T) {
	eachStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, st, sm, local := catchUpHub(t, kind, [][2]string{{"t5", "u09"}})
		v := online(t, st, "u09")
		w := &wire{c: local("u01")}
		if err := st.AddMember(ctx, "t5", "u01"); err != nil {
			t.Fatal(err)
		}
		sm.beforeMembers = func(team string) {
			sm.beforeMembers = nil
			// Removed after the index took t5, before the catch-up reads.
			if err := st.RemoveMember(ctx, "t5", "u01"); err != nil {
				t.Error(err)
			}
		}
		h.OnMembership(store.MembershipEvent{Team: "t5", UserID: "u01", Joined: true, UserTeams: store.TeamList{"t5"}})
		runJobs(ctx, h, w)
		if got := w.String(); got != "[]" {
			t.Fatalf("u01, out of t5 when the catch-up read it, was sent %s", got)
		}
		if err := st.AddMember(ctx, "t5", "u01"); err != nil {
			t.Fatal(err)
		}
		h.OnMembership(store.MembershipEvent{Team: "t5", UserID: "u01", Joined: true, UserTeams: store.TeamList{"t5"}})
		runJobs(ctx, h, w)
		if got, want := w.String(), fmt.Sprintf("[u09=online@%d]", v); got != want {
			t.Fatalf("after the re-join u01 was sent %s, want %s", got, want)
		}
	})
}

// A membership event of the user between the connect's read of its teams
// and the note of the teams it read no members of may have been a join
// taking such a team for given: the connect is refused, to be retried.
func TestNotGivenAfterAMembershipEventOfTheUserRefuses(t *testing.T) {
	ctx := context.Background()
	h, st, c, teams, gen, reads := secondAfterAHeldRemoval(t)
	if err := st.AddMember(ctx, "t0", "u03"); err != nil {
		t.Fatal(err)
	}
	h.OnMembership(store.MembershipEvent{Team: "t0", UserID: "u03", Joined: true, UserTeams: store.TeamList{"t0"}})
	if h.notGiven(c, gen, teams, reads) {
		t.Fatal("notGiven after the user's join came: true, want false (the join took t0 for given)")
	}
}

// The re-join's event can come while the first join's catch-up, which
// read the joiner out, is still in flight: it must not be taken for a join
// whose members were given.
func TestRejoinDuringACatchUpThatFoundTheJoinerOutGives(t *testing.T) {
	eachStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, st, sm, local := catchUpHub(t, kind, [][2]string{{"t5", "u09"}})
		v := online(t, st, "u09")
		w := &wire{c: local("u01")}
		if err := st.AddMember(ctx, "t5", "u01"); err != nil {
			t.Fatal(err)
		}
		sm.beforeMembers = func(string) {
			sm.beforeMembers = nil
			if err := st.RemoveMember(ctx, "t5", "u01"); err != nil {
				t.Error(err)
			}
		}
		sm.afterMembers = func(string) {
			sm.afterMembers = nil
			// Read out; back in, and the re-join's event comes.
			if err := st.AddMember(ctx, "t5", "u01"); err != nil {
				t.Error(err)
			}
			h.OnMembership(store.MembershipEvent{Team: "t5", UserID: "u01", Joined: true, UserTeams: store.TeamList{"t5"}})
		}
		h.OnMembership(store.MembershipEvent{Team: "t5", UserID: "u01", Joined: true, UserTeams: store.TeamList{"t5"}})
		runJobs(ctx, h, w)
		if got, want := w.String(), fmt.Sprintf("[u09=online@%d]", v); got != want {
			t.Fatalf("u01, back in t5, was sent %s, want %s", got, want)
		}
	})
}

// A connection marked as not given a team's members leaves the mark when
// it goes: a closed connection is not kept for the join to come.
func TestNotGivenMarkGoesWithItsConnection(t *testing.T) {
	h, _, c, teams, gen, reads := secondAfterAHeldRemoval(t)
	if !h.notGiven(c, gen, teams, reads) {
		t.Fatal("notGiven refused with no membership event")
	}
	h.mu.RLock()
	marked := slices.Contains(h.users["u03"].early["t0"], c)
	h.mu.RUnlock()
	if !marked {
		t.Fatal("t0 not marked as not given to the connection that read none of its members")
	}
	h.remove(c)
	h.mu.RLock()
	only, left := h.users["u03"].early["t0"]
	h.mu.RUnlock()
	if left {
		t.Fatalf("after the connection went, t0 is still marked for %v", only)
	}
}

// registerSecond adds a socketless connection of user, which the hub
// holds already, and registers it as a connect does: the index's teams,
// the generation they are as of, and what the connect read.
func registerSecond(t *testing.T, h *hub, user string) (*client, []string, uint64, connectReads) {
	t.Helper()
	ctx := context.Background()
	c := &client{srv: h.srv, user: user, id: "second"}
	c.closed.Store(true) // no socket: writes are no-ops
	teams, gen, err := h.addAt(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	registered, reads, err := h.srv.register(ctx, c, teams)
	if err != nil || !registered {
		t.Fatalf("register: registered %v, err %v", registered, err)
	}
	return c, teams, gen, reads
}

// secondAfterAHeldRemoval is a hub holding u03 in t0 (with u09), whose
// removal from t0 is written but its event held, and a second connection
// of u03 registered there.
func secondAfterAHeldRemoval(t *testing.T) (*hub, store.Store, *client, []string, uint64, connectReads) {
	t.Helper()
	h, st, _, local := catchUpHub(t, "redis", [][2]string{{"t0", "u03"}, {"t0", "u09"}})
	local("u03")
	if err := st.RemoveMember(context.Background(), "t0", "u03"); err != nil {
		t.Fatal(err)
	}
	c, teams, gen, reads := registerSecond(t, h, "u03")
	return h, st, c, teams, gen, reads
}

// Chaos seed 788421645 (one Redis): a resync's read of t0 was asked as a
// partition of the node began and answered at its heal, 4.8 s later; u06,
// removed from t0 meanwhile (the event held with the answer), was pushed
// the changes of two t0 members as read before the removal. A read
// answered that late is asked again, and the new answer's removal is
// applied before anything is pushed.
func TestResyncReadAnsweredLateIsReadAgain(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, st, sm, local := catchUpHub(t, kind, [][2]string{{"t", "alice"}, {"t", "bob"}, {"t", "carol"}})
		var now atomic.Int64
		now.Store(time.Now().UnixNano())
		h.srv.cfg.Now = func() time.Time { return time.Unix(0, now.Load()) }
		online(t, st, "bob")
		wa, wc := &wire{c: local("alice")}, &wire{c: local("carol")}
		v := away(t, st, "bob") // its event missed, as in an outage: the resync tells it
		late := true
		sm.afterMembers = func(string) {
			if !late {
				return
			}
			late = false
			// Answered 2 s after it was asked, alice left t meanwhile; the
			// event of it was held with the answer.
			if err := st.RemoveMember(ctx, "t", "alice"); err != nil {
				t.Error(err)
			}
			now.Add(int64(2 * time.Second))
		}
		h.resync(noFloor)
		wa.write()
		wc.write()
		if len(wa.sent) > 0 {
			t.Errorf("alice, removed from t during the resync's read, was sent %s", wa.String())
		}
		if want := fmt.Sprintf("[bob=away@%d]", v); wc.String() != want {
			t.Errorf("carol, still in t, was sent %s, want %s", wc.String(), want)
		}
	})
}
