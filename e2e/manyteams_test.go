package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/greendot/greendot/store/redisstore/redistest"
)

// A user in more teams than a membership message lists (100): the nodes
// decide from Redis, asked about their viewers' teams only, who sees them.
// Joining a viewer's team shows them to the viewer at once; leaving it keeps
// them visible to a viewer who shares another team, and nothing more passes
// to one who shares none.
func TestMembershipOfAUserInManyTeams(t *testing.T) {
	url := redistest.Start(t).URL()
	a := startNode(t, url, "a", quick)
	b := startNode(t, url, "b", quick)
	for i := range 150 {
		a.join(fmt.Sprintf("m%d", i), "bob")
	}
	a.join("t1", "alice", "carol")
	a.join("own", "alice")
	a.join("m7", "carol")
	alice := connect(t, a, "alice", "web")
	carol := connect(t, a, "carol", "web")
	alice.expect(5*time.Second, "carol=online")
	bob := connect(t, b, "bob", "web")
	carol.expect(5*time.Second, "alice=online", "bob=online")

	b.join("t1", "bob")
	alice.expect(5*time.Second, "carol=online", "bob=online")
	if code, body := b.do("DELETE", "/v1/teams/t1/members/bob"); code != 204 {
		t.Fatal(code, body)
	}
	setStatus(t, bob, "away")
	carol.expect(5*time.Second, "alice=online", "bob=online", "bob=away")
	alice.still(time.Second, "carol=online", "bob=online")
}

func setStatus(t *testing.T, v *viewer, state string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := v.c.SetStatus(ctx, state); err != nil {
		t.Fatal(err)
	}
}
