package server

import (
	"context"
	"fmt"
	"math"
	"testing"

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
	ctx := context.Background()
	if err := st.SetStatus(ctx, "d-"+user, false); err != nil {
		t.Fatal(err)
	}
	ps, err := st.Presence(ctx, []string{user})
	if err != nil {
		t.Fatal(err)
	}
	if ps[0].State != presence.Away {
		t.Fatalf("%s is %v, want away", user, ps[0].State)
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
		sm.beforeMembers = w.write
		h.resync(noFloor)
		w.write()
		if got, want := w.String(), fmt.Sprintf("[bob=away@%d]", v); got != want {
			t.Fatalf("alice was sent %s, want bob away once", got)
		}
	})
}
