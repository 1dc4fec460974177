package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/greendot/greendot/store/redisstore/redistest"
)

// After a Redis outage every node resyncs its viewers. A resync must only
// deliver what differs from what each viewer holds: it used to send every
// offline teammate again at the floor version, so a viewer's callbacks
// fired "carol went offline" once more (and "dave went offline" for a
// teammate never seen), once per resync.
func TestResyncAfterOutageChangesNothingViewersHold(t *testing.T) {
	short := timing{ttl: 2 * time.Second, heartbeat: 500 * time.Millisecond, grace: 500 * time.Millisecond}
	r := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	a := startNode(t, r.URL(), "a", short)
	b := startNode(t, r.URL(), "b", short)
	a.join("t1", "alice", "bob", "carol", "dave")
	alice := connect(t, a, "alice", "web")
	connect(t, b, "bob", "web")
	carol := connect(t, b, "carol", "web")
	checkFor(t, 3*time.Second, func() error {
		if s, _ := alice.c.Get("carol"); s.State != "online" {
			return fmt.Errorf("alice holds carol=%s", s.State)
		}
		if s, _ := alice.c.Get("bob"); s.State != "online" {
			return fmt.Errorf("alice holds bob=%s", s.State)
		}
		return nil
	})
	_ = carol.c.Close()
	// Waited for in what OnChange recorded, not in the client's map: the
	// map is updated before OnChange runs, so a count taken when the map
	// shows offline may come before the offline's own record, which would
	// then pass for the resync's (CI, once).
	var before int
	checkFor(t, 3*time.Second, func() error {
		raw := alice.rawChanges()
		if !slices.Contains(raw, `carol=offline(was "online")`) {
			return fmt.Errorf("alice saw %v", raw)
		}
		before = len(raw)
		return nil
	})

	r.Stop()
	checkFor(t, 3*time.Second, func() error {
		if code, _ := a.get("/readyz"); code != 503 {
			return fmt.Errorf("a ready with Redis down")
		}
		return nil
	})
	r.Restart()
	checkFor(t, 10*time.Second, func() error {
		for _, n := range []*node{a, b} {
			if code, body := n.get("/readyz"); code != 200 {
				return fmt.Errorf("%s readyz = %d %s", n.name, code, body)
			}
			if m := metric(n, "greendot_resyncs_total"); m == "" || m == "0" {
				return fmt.Errorf("%s has not resynced yet", n.name)
			}
		}
		return nil
	})
	// Let the resyncs' deliveries, if any, arrive.
	time.Sleep(time.Second)
	if got := alice.rawChanges()[before:]; len(got) > 0 {
		t.Fatalf("the resync delivered %v to alice, who held all of it already; alice saw:\n%s", got, alice.events())
	}
	if m := metric(a, "greendot_resync_deliveries_total"); m != "0" {
		t.Fatalf("node a queued %s resync deliveries, want 0", m)
	}
}
