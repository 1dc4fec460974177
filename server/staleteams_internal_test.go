package server

import (
	"context"
	"slices"
	"testing"
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

	c, teams := addLocal(t, h, "u03")
	c.id = "second"
	if !slices.Contains(teams, "t0") {
		t.Fatalf("teams %v: the index should still hold t0 (its event was not delivered)", teams)
	}
	registered, reads, err := h.srv.register(ctx, c, teams)
	if err != nil || !registered {
		t.Fatalf("register: registered %v, err %v", registered, err)
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
