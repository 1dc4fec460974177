package storetest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/greendot/greendot/store"
)

// testMembersOfMany: the batched read agrees with Members, team by team, in
// the order asked, duplicates and teams without members included. The
// stores of this repository implement store.MembersBatcher; the suite
// requires it.
func testMembersOfMany(t *testing.T, h *harness) {
	b, ok := h.s.(store.MembersBatcher)
	if !ok {
		t.Fatalf("%T does not implement store.MembersBatcher", h.s)
	}
	got, err := b.MembersOfMany(h.ctx, nil)
	if err != nil || len(got) != 0 {
		t.Fatalf("no teams: %v, %v", got, err)
	}
	var teams []string
	for i := range 40 { // teams in many slots, on a cluster too
		team := fmt.Sprint("t", i)
		teams = append(teams, team)
		for k := range i % 5 {
			mustDo(t, h.s.AddMember(h.ctx, team, fmt.Sprint("u", (i+k)%9)))
		}
	}
	mustDo(t, h.s.RemoveMember(h.ctx, "t3", "u3"))
	teams = append(teams, "t3", "empty", "t7")
	got, err = b.MembersOfMany(h.ctx, teams)
	mustDo(t, err)
	if len(got) != len(teams) {
		t.Fatalf("%d answers for %d teams", len(got), len(teams))
	}
	for i, team := range teams {
		want, err := h.s.Members(h.ctx, team)
		mustDo(t, err)
		if !slices.Equal(got[i], want) || !slices.IsSorted(got[i]) {
			t.Fatalf("members of %s: batched %v, one by one %v", team, got[i], want)
		}
	}
	if got[len(teams)-2] != nil {
		t.Fatalf("a team without members: %v, want nil", got[len(teams)-2])
	}
}
