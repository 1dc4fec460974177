package redisstore

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// A team-side write that arrives after a newer one for the same member (a
// slow node's add overtaken by a remove) changes nothing; a newer one does.
func TestTeamSideIgnoresOlderChange(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", time.Second, 0)
	must(t, s.AddMember(ctx, "t1", "bob"))
	added, err := r.Do("HGET", teamMVKey("t1"), "bob")
	must(t, err)
	must(t, s.RemoveMember(ctx, "t1", "bob"))
	team := func(join bool, version string) int64 {
		t.Helper()
		v, err := run(ctx, s.rdb, s.sc.memberTeam, []string{teamKey("t1"), teamMVKey("t1"), teamInfoKey("t1"), teamOccKey("t1")}, "bob", boolArg(join), version, "1")
		must(t, err)
		return toInt(v)
	}
	if changed := team(true, added); changed != 0 {
		t.Fatalf("the add's write, replayed after the remove, changed the member set")
	}
	if members, _ := s.Members(ctx, "t1"); len(members) != 0 {
		t.Fatalf("members of t1 = %v after a stale add, want none", members)
	}
	if changed := team(true, "99999999999999999"); changed != 1 {
		t.Fatalf("a newer add did not change the member set")
	}
}

// An event is published with the state the user's side holds, not with what
// the publishing call asked: a call whose publish comes late does not undo
// the one after it.
func TestLatePublishTellsCurrentState(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, h := mk(t, r.URL(), "a", time.Second, 0)
	must(t, s.AddMember(ctx, "t1", "bob"))
	must(t, s.RemoveMember(ctx, "t1", "bob"))
	must(t, s.publishMembership(ctx, "t1", "bob")) // the add's publish, late
	testwait.For(t, 2*time.Second, func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		want := []string{"t1 bob true", "t1 bob false", "t1 bob false"}
		if !slices.Equal(h.mem, want) {
			return fmt.Errorf("membership events %q, want %q", h.mem, want)
		}
		return nil
	})
}

// A removal that Redis had nothing to remove for (it lost its data, and the
// membership was not restored) is still published: the nodes' index may
// hold the membership, and would let the removed user hear the team until
// a resync. Found by the chaos test: a user removed during an empty restart
// was sent a team's changes for 9 s.
func TestRemovalAfterDataLossIsPublished(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, h := mk(t, r.URL(), "a", 10*time.Second, 100*time.Millisecond)
	must(t, s.AddMember(ctx, "t", "bob"))
	if _, err := r.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	must(t, s.RemoveMember(ctx, "t", "bob"))
	testwait.For(t, 5*time.Second, func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		if !slices.Contains(h.mem, "t bob false") {
			return fmt.Errorf("membership events %q, want the removal", h.mem)
		}
		return nil
	})
}

// MemberCount counts the team's set without reading it.
func TestMemberCount(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", time.Second, 0)
	for _, u := range []string{"alice", "bob", "carol", "bob"} {
		must(t, s.AddMember(ctx, "t1", u))
	}
	must(t, s.RemoveMember(ctx, "t1", "carol"))
	for team, want := range map[string]int{"t1": 2, "none": 0} {
		if n, err := s.MemberCount(ctx, team); err != nil || n != want {
			t.Fatalf("MemberCount(%s) = %d, %v; want %d", team, n, err, want)
		}
	}
}
