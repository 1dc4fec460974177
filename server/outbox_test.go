package server

import (
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
)

// socketlessServer is enough of a Server for outboxes: metrics, a hub to
// collect the dirty list (no flusher runs), and writes that go nowhere for
// clients marked closed.
func socketlessServer() *Server {
	s := &Server{cfg: Config{MaxPending: 10000}, metrics: newMetrics(prometheus.NewRegistry())}
	s.hub = newHub(s)
	return s
}

// An idle connection must not keep the queue of its busiest moment: 15,000
// idle connections each holding an emptied map of a team's changes was a
// fifth of the server's heap.
func TestEmptiedOutboxHoldsNoMemory(t *testing.T) {
	s := socketlessServer()
	newClient := func() *client {
		c := &client{srv: s}
		c.closed.Store(true) // writes become no-ops: no socket here
		return c
	}
	change := func(i int) protocol.Change {
		return protocol.Change{UserID: "u" + strconv.Itoa(i), State: protocol.StateOnline, Version: 5}
	}

	// Changes that raced the snapshot, all covered by it.
	c := newClient()
	var snap []presence.Presence
	for i := range 99 {
		c.push(change(i), false)
		snap = append(snap, presence.Presence{UserID: "u" + strconv.Itoa(i), State: presence.Online, Version: 5})
	}
	c.sendSnapshot(snap)
	if c.pending != nil || c.order != nil {
		t.Fatalf("after a covering snapshot: pending %d entries (nil: %v), order cap %d", len(c.pending), c.pending == nil, cap(c.order))
	}

	// Changes dropped one by one, as after leaving their teams.
	c = newClient()
	for i := range 10 {
		c.push(change(i), false)
	}
	for i := range 10 {
		c.hide("u" + strconv.Itoa(i))
	}
	if c.pending != nil || c.order != nil {
		t.Fatalf("after dropping all: pending nil %v, order cap %d", c.pending == nil, cap(c.order))
	}
	if !c.unhide("u3") || c.unhide("u3") || c.unhide("u10") {
		t.Fatal("unhide reports a hidden subject once, and only a hidden one")
	}

	// Hidden subjects past maxHidden are one flag, not a growing set.
	c = newClient()
	for i := range maxHidden + 10 {
		c.hide("u" + strconv.Itoa(i))
	}
	if c.hidden != nil || !c.hiddenAll || !c.unhide("anyone") {
		t.Fatalf("past maxHidden: %d entries, all %v", len(c.hidden), c.hiddenAll)
	}

}

// A subject the snapshot covered, pushed again later, is listed once: the
// flush writes each pending change once.
func TestSnapshotForgetsCoveredSubjectsPlaces(t *testing.T) {
	c := &client{srv: socketlessServer()}
	c.closed.Store(true) // writes become no-ops: no socket here
	c.push(protocol.Change{UserID: "a", State: protocol.StateOnline, Version: 5}, false)
	c.push(protocol.Change{UserID: "b", State: protocol.StateOnline, Version: 5}, false)
	c.sendSnapshot([]presence.Presence{{UserID: "a", State: presence.Online, Version: 5}})
	c.push(protocol.Change{UserID: "a", State: protocol.StateOffline, Version: 6}, false)
	if got := strings.Join(c.order, ","); got != "b,a" {
		t.Fatalf("order = %s, want b,a", got)
	}
}
