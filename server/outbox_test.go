package server

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
)

// socketlessServer is enough of a Server for outboxes: metrics, a hub to
// collect the dirty list (no flusher runs), and writes that go nowhere for
// clients marked closed.
func socketlessServer() *Server {
	s := &Server{cfg: Config{MaxPending: 10000, Now: time.Now}, metrics: newMetrics(prometheus.NewRegistry())}
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
		c.hide("u"+strconv.Itoa(i), uint64(i))
	}
	if c.pending != nil || c.order != nil {
		t.Fatalf("after dropping all: pending nil %v, order cap %d", c.pending == nil, cap(c.order))
	}
	stale := func(s string) bool { ok, _ := c.unhide(s); return ok }
	if ok, held := c.unhide("u3"); !ok || held != 3 || stale("u3") || stale("u10") {
		t.Fatal("unhide reports a hidden subject once, with the version held, and only a hidden one")
	}

	// Hidden subjects past maxHidden are one flag, not a growing set.
	c = newClient()
	for i := range maxHidden + 10 {
		c.hide("u"+strconv.Itoa(i), 1)
	}
	if c.hidden != nil || !c.hiddenAll || !stale("anyone") {
		t.Fatalf("past maxHidden: %d entries, all %v", len(c.hidden), c.hiddenAll)
	}

}

// Changes queued while the snapshot was read are folded into it: a client
// puts a snapshot in place of its whole map, so a subject left out of the
// read but brought by a queued change (a team joined during the connect)
// would otherwise flicker offline until the next frame.
func TestSnapshotFoldsQueuedChanges(t *testing.T) {
	users := []presence.Presence{
		{UserID: "a", State: presence.Online, Version: 5},  // a queued change is older
		{UserID: "b", State: presence.Online, Version: 5},  // a queued change is newer
		{UserID: "c", State: presence.Offline, Version: 3}, // a queued change brings it back
		{UserID: "d", State: presence.Away, Version: 4},    // a queued change ends it
	}
	pending := map[string]protocol.Change{
		"a": {UserID: "a", State: protocol.StateAway, Version: 4},
		"b": {UserID: "b", State: protocol.StateAway, Version: 6},
		"c": {UserID: "c", State: protocol.StateOnline, Version: 7},
		"d": {UserID: "d", State: protocol.StateOffline, Version: 8},
		"e": {UserID: "e", State: protocol.StateOnline, Version: 9},  // not in the read
		"f": {UserID: "f", State: protocol.StateOffline, Version: 9}, // not in the read, offline
	}
	frame := foldSnapshot(users, pending, []string{"f", "e", "d", "c", "b", "a"})
	var got []string
	for _, u := range frame.Users {
		got = append(got, fmt.Sprintf("%s=%s@%d", u.UserID, u.State, u.Version))
	}
	if want := "a=online@5 b=away@6 c=online@7 e=online@9"; strings.Join(got, " ") != want {
		t.Fatalf("snapshot = %s, want %s", strings.Join(got, " "), want)
	}

	// Nothing stays queued: a later change is listed once.
	c := &client{srv: socketlessServer()}
	c.closed.Store(true) // writes become no-ops: no socket here
	c.push(protocol.Change{UserID: "a", State: protocol.StateOnline, Version: 5}, false)
	c.push(protocol.Change{UserID: "b", State: protocol.StateOnline, Version: 5}, false)
	c.sendSnapshot([]presence.Presence{{UserID: "a", State: presence.Online, Version: 5}})
	if c.pending != nil || c.order != nil {
		t.Fatalf("after the snapshot: %d pending, order %v", len(c.pending), c.order)
	}
	c.push(protocol.Change{UserID: "a", State: protocol.StateOffline, Version: 6}, false)
	if got := strings.Join(c.order, ","); got != "a" {
		t.Fatalf("order = %s, want a", got)
	}
}

// A change the snapshot already showed, arriving after it (it was still on
// its way from the node that published it), is not sent again; a newer one
// is, and so is anything after the window. Versions here are like a shared
// store's: microseconds of the clock.
func TestSnapshotShownChangeNotResent(t *testing.T) {
	s := socketlessServer()
	now := time.Now()
	s.cfg.Now = func() time.Time { return now }
	c := &client{srv: s}
	c.closed.Store(true) // writes become no-ops: no socket here
	v := uint64(now.Add(-time.Second).UnixMicro())
	old := uint64(now.Add(-time.Hour).UnixMicro())
	c.sendSnapshot([]presence.Presence{
		{UserID: "bob", State: presence.Online, Version: v},
		{UserID: "carol", State: presence.Offline, Version: v},
		{UserID: "dave", State: presence.Online, Version: old},
	})
	push := func(user, state string, v uint64) {
		c.push(protocol.Change{UserID: user, State: state, Version: v}, false)
	}
	push("bob", protocol.StateOnline, v)    // the snapshot's, late
	push("bob", protocol.StateAway, v-1)    // older still
	push("carol", protocol.StateOffline, v) // left out of the frame as offline, but shown
	push("dave", protocol.StateOnline, old) // not recent: not remembered (the outbox sends it)
	if got := strings.Join(c.order, ","); got != "dave" {
		t.Fatalf("queued %q, want only dave", got)
	}
	push("bob", protocol.StateAway, v+1) // newer: sent
	now = now.Add(recentWindow + time.Second)
	push("carol", protocol.StateOffline, v) // past the window
	if got := strings.Join(c.order, ","); got != "dave,bob,carol" {
		t.Fatalf("queued %q, want dave,bob,carol", got)
	}
	if c.recent != nil {
		t.Fatalf("past the window the snapshot's entries are kept: %v", c.recent)
	}

	// A snapshot of maxRecent recent entries keeps them all, sorted, each
	// found; one whose every entry is recent past that (after a data
	// loss) keeps none.
	v = uint64(now.Add(-time.Second).UnixMicro())
	many := func(n int) *client {
		c := &client{srv: s}
		c.closed.Store(true)
		var users []presence.Presence
		for i := range n {
			users = append(users, presence.Presence{UserID: fmt.Sprint("u", i), State: presence.Online, Version: v})
		}
		c.sendSnapshot(users)
		return c
	}
	c = many(maxRecent)
	if len(c.recent) != maxRecent || int(c.recentLive) != maxRecent {
		t.Fatalf("kept %d recent entries (%d live), want all %d", len(c.recent), c.recentLive, maxRecent)
	}
	if !slices.IsSortedFunc(c.recent, func(a, b recentEntry) int { return cmp.Compare(a.subject, b.subject) }) {
		t.Fatal("the recent entries are not sorted by subject")
	}
	for i := range maxRecent {
		if !c.inSnapshotLocked(protocol.Change{UserID: fmt.Sprint("u", i), Version: v}) {
			t.Fatalf("u%d's change at the snapshot's version taken for news", i)
		}
	}
	if c = many(maxRecent + 1); c.recent != nil {
		t.Fatalf("kept %d recent entries, want none past %d", len(c.recent), maxRecent)
	}
}

// The client struct, one per connection, stays in the 288-byte size
// class: a field added without a look at the padding moves every
// connection to the next (320).
func TestClientFitsItsSizeClass(t *testing.T) {
	if n := unsafe.Sizeof(client{}); n > 288 {
		t.Fatalf("client is %d bytes, over its 288-byte size class", n)
	}
}

// Two team-mates of one snapshot with one hash: the list is dropped, so no
// change of one is ever taken for the other's (resends are harmless).
func TestSnapshotEntriesWithOneHashForTwoSubjectsAreDropped(t *testing.T) {
	s := socketlessServer()
	now := time.Now()
	s.cfg.Now = func() time.Time { return now }
	v := uint64(now.Add(-time.Second).UnixMicro())
	real := subjectHash
	t.Cleanup(func() { subjectHash = real })
	subjectHash = func(user string) uint64 { return uint64(len(user)) } // bob and eve collide
	snapshot := func(users ...presence.Presence) *client {
		c := &client{srv: s}
		c.closed.Store(true) // writes become no-ops: no socket here
		c.sendSnapshot(users)
		return c
	}
	c := snapshot(presence.Presence{UserID: "bob", State: presence.Online, Version: v},
		presence.Presence{UserID: "carol", State: presence.Online, Version: v})
	if len(c.recent) != 2 {
		t.Fatalf("recent = %v, want bob's and carol's", c.recent)
	}
	c = snapshot(presence.Presence{UserID: "bob", State: presence.Online, Version: v},
		presence.Presence{UserID: "eve", State: presence.Online, Version: v + 5})
	if c.recent != nil {
		t.Fatalf("recent = %v with bob and eve on one hash, want none", c.recent)
	}
	c.push(protocol.Change{UserID: "bob", State: protocol.StateOnline, Version: v}, false)
	if got := strings.Join(c.order, ","); got != "bob" {
		t.Fatalf("queued %q, want bob's resend", got)
	}
	// One subject twice (read offline, folded in online from a pending
	// change) is no collision: its newer version is kept, whichever copy
	// holds it.
	for _, frameNewer := range []bool{true, false} {
		read, folded := v, v+1
		if !frameNewer {
			read, folded = v+1, v
		}
		c = &client{srv: s}
		c.noteRecentLocked([]presence.Presence{{UserID: "bob", State: presence.Offline, Version: read}},
			protocol.Snapshot{Users: []protocol.UserState{{UserID: "bob", State: protocol.StateOnline, Version: folded}}})
		if len(c.recent) != 1 || c.recent[0].version != v+1 {
			t.Fatalf("recent = %v, want bob's at %d", c.recent, v+1)
		}
	}
}

// An idle connection gets no change that would drop its snapshot's recent
// entries: its liveness check frees them once the window is over (after a
// mass connect each connection would otherwise keep most of its snapshot),
// and comes back for them then, not a ping interval later.
func TestIdleConnectionForgetsItsSnapshotEntries(t *testing.T) {
	s := socketlessServer()
	now := time.Now()
	s.cfg.Now = func() time.Time { return now }
	s.cfg.TTL = time.Minute
	s.cfg.PingInterval = 30 * time.Second
	c := &client{srv: s}
	c.closed.Store(true) // the snapshot's write becomes a no-op: no socket here
	v := uint64(now.Add(-time.Second).UnixMicro())
	c.sendSnapshot([]presence.Presence{{UserID: "bob", State: presence.Online, Version: v}})
	if len(c.recent) != 1 {
		t.Fatalf("recent = %v, want bob's entry", c.recent)
	}
	c.closed.Store(false)
	check := func() time.Duration {
		c.lastFrame.Store(now.UnixNano()) // just heard from: no ping, no close
		next, live := c.checkSilence()
		if !live {
			t.Fatal("a connection heard from just now was taken for silent")
		}
		return next
	}
	now = now.Add(time.Second)
	if next := check(); next <= 0 || next > recentWindow-time.Second+time.Millisecond {
		t.Fatalf("next check in %v, want at the window's end, %v from now", next, recentWindow-time.Second)
	}
	if len(c.recent) != 1 {
		t.Fatalf("within the window the entries went: %v", c.recent)
	}
	now = now.Add(recentWindow)
	if next := check(); next != s.cfg.PingInterval {
		t.Fatalf("next check in %v once the entries went, want the ping interval %v", next, s.cfg.PingInterval)
	}
	if c.recent != nil {
		t.Fatalf("past the window an idle connection keeps %v", c.recent)
	}
}

func TestCatchUpVersions(t *testing.T) {
	now := time.Now()
	p := func(v uint64) presence.Presence {
		return presence.Presence{UserID: "bob", State: presence.Offline, Version: v}
	}
	for _, tc := range []struct {
		v, held, want uint64
		ok            bool
	}{
		{v: 9, held: 5, want: 9, ok: true}, // changed since: as read
		{v: 5, held: 5, ok: false},         // the client holds it
		{v: 0, held: 5, want: 6, ok: true}, // the store lost it: above what the client holds
		{v: 7, held: 0, want: 7, ok: true}, // nothing known of the client
	} {
		ch, ok := catchUp(p(tc.v), tc.held, now)
		if ok != tc.ok || (ok && ch.Version != tc.want) {
			t.Errorf("catchUp(v%d, held %d) = v%d %v, want v%d %v", tc.v, tc.held, ch.Version, ok, tc.want, tc.ok)
		}
	}
	// A routed change to a subject seen again is dropped when not newer
	// than what the client held, and never raised.
	c := &client{srv: socketlessServer()}
	c.closed.Store(true)
	c.hide("bob", 5)
	c.push(protocol.Change{UserID: "bob", State: protocol.StateAway, Version: 4}, false)
	c.push(protocol.Change{UserID: "bob", State: protocol.StateAway, Version: 5}, false)
	if len(c.pending) != 0 {
		t.Fatalf("pending %v, want nothing", c.pending)
	}
	c.push(protocol.Change{UserID: "bob", State: protocol.StateAway, Version: 6}, false)
	if q := c.pending["bob"]; q.Version != 6 {
		t.Fatalf("pending %v, want bob v6", c.pending)
	}
}

// A check that pings is not back for the window's end of the snapshot's
// recent versions: it would ping again before the answer could come.
// Without a ping, it is back when the window ends.
func TestNoSecondPingForTheWindowsEnd(t *testing.T) {
	s := socketlessServer()
	s.cfg.TTL, s.cfg.PingInterval = 25*time.Second, 10*time.Second
	c := &client{srv: s}
	for _, tc := range []struct {
		quiet, left, next time.Duration
		ping              bool
	}{
		{quiet: 10 * time.Second, left: 2 * time.Second, next: 10 * time.Second, ping: true},
		{quiet: 12 * time.Second, left: 0, next: 10 * time.Second, ping: true},
		{quiet: 3 * time.Second, left: 2 * time.Second, next: 2 * time.Second},
		{quiet: 3 * time.Second, left: 0, next: 7 * time.Second},
		{quiet: 3 * time.Second, left: 9 * time.Second, next: 7 * time.Second},
	} {
		next, ping := c.nextCheck(tc.quiet, tc.left)
		if next != tc.next || ping != tc.ping {
			t.Errorf("quiet %v, window ends in %v: next check in %v, ping %v; want %v, %v",
				tc.quiet, tc.left, next, ping, tc.next, tc.ping)
		}
	}
}
