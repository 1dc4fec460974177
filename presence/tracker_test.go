package presence

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"
	"weak"
)

const (
	ttl   = 25 * time.Second
	grace = 5 * time.Second
)

var t0 = time.Unix(1_764_500_000, 0)

// world drives a Tracker with a clock it advances, like the store would.
type world struct {
	t   *testing.T
	tr  *Tracker
	now time.Time
}

func newWorld(t *testing.T) *world {
	return &world{t: t, tr: NewTracker(Config{TTL: ttl, Grace: grace}), now: t0}
}

func (w *world) advance(d time.Duration) Outcome {
	w.now = w.now.Add(d)
	return w.tr.Advance(w.now)
}

func (w *world) connect(id, user, device string) Outcome {
	w.t.Helper()
	out, err := w.tr.Connect(w.now, Conn{ID: id, UserID: user, Device: device, Node: "n1"})
	if err != nil {
		w.t.Fatalf("connect %s: %v", id, err)
	}
	return out
}

func (w *world) disconnect(id string) Outcome {
	w.t.Helper()
	out, err := w.tr.Disconnect(w.now, id, Closed)
	if err != nil {
		w.t.Fatalf("disconnect %s: %v", id, err)
	}
	return out
}

func (w *world) status(id string, active bool) Outcome {
	w.t.Helper()
	out, err := w.tr.SetStatus(w.now, id, active)
	if err != nil {
		w.t.Fatalf("status %s: %v", id, err)
	}
	return out
}

func expectChanges(t *testing.T, out Outcome, want ...string) {
	t.Helper()
	var got []string
	for _, c := range out.Changes {
		got = append(got, c.UserID+"="+c.State.String())
	}
	if len(got) != len(want) {
		t.Fatalf("changes = %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("changes = %v, want %v", got, want)
		}
	}
}

func TestFirstDeviceOnlineLastDeviceOfflineAfterGrace(t *testing.T) {
	w := newWorld(t)
	expectChanges(t, w.connect("c1", "bob", "web"), "bob=online")
	expectChanges(t, w.connect("c2", "bob", "ios")) // second device: nothing
	if p := w.tr.Presence("bob"); p.ConnectionCount != 2 || len(p.Devices) != 2 || p.Devices[0] != "ios" {
		t.Fatalf("presence = %+v", p)
	}
	expectChanges(t, w.disconnect("c1"))
	out := w.disconnect("c2")
	expectChanges(t, out)
	if out.GraceStarted != 1 {
		t.Fatalf("grace started = %d, want 1", out.GraceStarted)
	}
	expectChanges(t, w.advance(grace-time.Millisecond))
	expectChanges(t, w.advance(time.Millisecond), "bob=offline")
	p := w.tr.Presence("bob")
	if p.State != Offline || p.Version != 2 || !p.LastSeen.Equal(t0.Add(0)) {
		t.Fatalf("presence = %+v", p)
	}
}

func TestReconnectWithinGraceIsSilent(t *testing.T) {
	w := newWorld(t)
	w.connect("c1", "bob", "web")
	w.advance(time.Second)
	w.disconnect("c1")
	w.advance(grace - time.Millisecond)
	out := w.connect("c2", "bob", "web")
	expectChanges(t, out)
	if out.GraceCancelled != 1 {
		t.Fatalf("grace cancelled = %d", out.GraceCancelled)
	}
	expectChanges(t, w.advance(grace)) // the old grace's end passes: still nothing
}

func TestReconnectWithinGraceAwayToOnlinePublishes(t *testing.T) {
	w := newWorld(t)
	w.connect("c1", "bob", "web")
	expectChanges(t, w.status("c1", false), "bob=away")
	w.disconnect("c1")
	expectChanges(t, w.connect("c2", "bob", "web"), "bob=online")
}

func TestAwayOnlyWhenEveryDeviceIdle(t *testing.T) {
	w := newWorld(t)
	w.connect("c1", "bob", "web")
	w.connect("c2", "bob", "ios")
	expectChanges(t, w.status("c1", false))
	expectChanges(t, w.status("c2", false), "bob=away")
	expectChanges(t, w.status("c2", false))
	expectChanges(t, w.status("c1", true), "bob=online")
	// The active device leaves; the idle one remains: away, at once.
	expectChanges(t, w.disconnect("c1"), "bob=away")
}

// Each offline decided at a grace end reports how late past that end the
// sweep came; a grace cut short by a reconnect, and one whose end changes
// nothing viewers see (an invisible user's), report nothing.
func TestGraceLagIsHowLateTheOfflineWasDecided(t *testing.T) {
	w := newWorld(t)
	w.connect("c1", "bob", "web")
	w.connect("c2", "carol", "web")
	w.connect("c4", "dave", "web")
	w.setStatus("dave", Status{Mode: ModeInvisible})
	w.disconnect("c1")
	w.disconnect("c2")
	w.disconnect("c4")
	w.advance(time.Second)
	w.connect("c3", "carol", "web") // back within her grace
	out := w.advance(grace - time.Second + 40*time.Millisecond)
	expectChanges(t, out, "bob=offline")
	if len(out.GraceLag) != 1 || out.GraceLag[0] != 40*time.Millisecond {
		t.Fatalf("grace lags = %v, want [40ms]", out.GraceLag)
	}
	if out := w.advance(time.Minute); len(out.GraceLag) != 0 {
		t.Fatalf("grace lags after every grace is over = %v, want none", out.GraceLag)
	}
}

func TestExpiryOfSilentConnection(t *testing.T) {
	w := newWorld(t)
	w.connect("c1", "bob", "web")
	w.advance(10 * time.Second)
	if err := w.tr.Heartbeat(w.now, "c1"); err != nil {
		t.Fatal(err)
	}
	lastFrame := w.now
	// The old deadline (t0+ttl) passes: the heartbeat moved it.
	out := w.advance(ttl - 10*time.Second)
	if len(out.Expired) != 0 {
		t.Fatalf("expired too early: %+v", out.Expired)
	}
	out = w.advance(10*time.Second + 500*time.Millisecond)
	if len(out.Expired) != 1 || out.Expired[0].ID != "c1" || out.ExpiryLag[0] != 500*time.Millisecond {
		t.Fatalf("outcome = %+v", out)
	}
	expectChanges(t, out) // grace first
	expectChanges(t, w.advance(grace), "bob=offline")
	if p := w.tr.Presence("bob"); !p.LastSeen.Equal(lastFrame) {
		t.Fatalf("last seen = %v, want the last frame %v", p.LastSeen, lastFrame)
	}
	if err := w.tr.Heartbeat(w.now, "c1"); !errors.Is(err, ErrUnknownConn) {
		t.Fatalf("heartbeat after expiry: %v", err)
	}
}

func TestExpiryWithZeroGraceIsOfflineInOneAdvance(t *testing.T) {
	tr := NewTracker(Config{TTL: time.Second})
	if _, err := tr.Connect(t0, Conn{ID: "c1", UserID: "bob"}); err != nil {
		t.Fatal(err)
	}
	expectChanges(t, tr.Advance(t0.Add(time.Second)), "bob=offline")
}

func TestVersionsStrictlyIncrease(t *testing.T) {
	w := newWorld(t)
	var last uint64
	check := func(out Outcome) {
		for _, c := range out.Changes {
			if c.Version <= last {
				t.Fatalf("version %d after %d", c.Version, last)
			}
			last = c.Version
		}
	}
	for i := 0; i < 5; i++ {
		check(w.connect("a", "bob", "web"))
		check(w.status("a", false))
		check(w.status("a", true))
		w.disconnect("a")
		check(w.advance(grace))
	}
	if last != 20 {
		t.Fatalf("last version = %d, want 20", last)
	}
}

func TestDuplicateAndUnknownConnections(t *testing.T) {
	w := newWorld(t)
	w.connect("c1", "bob", "web")
	if _, err := w.tr.Connect(w.now, Conn{ID: "c1", UserID: "eve"}); !errors.Is(err, ErrDuplicateConn) {
		t.Fatalf("duplicate: %v", err)
	}
	if _, err := w.tr.Disconnect(w.now, "nope", Closed); !errors.Is(err, ErrUnknownConn) {
		t.Fatalf("unknown: %v", err)
	}
	if _, err := w.tr.SetStatus(w.now, "nope", true); !errors.Is(err, ErrUnknownConn) {
		t.Fatalf("unknown: %v", err)
	}
}

func TestGraceReenteredUsesLatestDeadline(t *testing.T) {
	w := newWorld(t)
	w.connect("c1", "bob", "web")
	w.disconnect("c1") // grace until t0+5s
	w.advance(2 * time.Second)
	w.connect("c2", "bob", "web") // cancelled
	w.disconnect("c2")            // grace until t0+7s
	expectChanges(t, w.advance(3*time.Second+time.Millisecond))
	expectChanges(t, w.advance(2*time.Second), "bob=offline")
}

func TestDisconnectNodeReleasesItsConnections(t *testing.T) {
	w := newWorld(t)
	w.connect("c1", "bob", "web")
	if _, err := w.tr.Connect(w.now, Conn{ID: "c2", UserID: "amy", Node: "n2"}); err != nil {
		t.Fatal(err)
	}
	out := w.tr.DisconnectNode(w.now, "n1")
	if out.GraceStarted != 1 || w.tr.Has("c1") || !w.tr.Has("c2") {
		t.Fatalf("outcome = %+v", out)
	}
	expectChanges(t, w.advance(grace), "bob=offline")
}

func TestCountsAndNextDeadline(t *testing.T) {
	w := newWorld(t)
	if !w.tr.NextDeadline().IsZero() {
		t.Fatal("empty tracker has a deadline")
	}
	w.connect("c1", "bob", "web")
	w.connect("c2", "amy", "web")
	if c, p := w.tr.Counts(); c != 2 || p != 2 {
		t.Fatalf("counts = %d, %d", c, p)
	}
	if got := w.tr.NextDeadline(); !got.Equal(t0.Add(ttl)) {
		t.Fatalf("next deadline = %v", got)
	}
	w.disconnect("c1")
	if got := w.tr.NextDeadline(); !got.Equal(t0.Add(grace)) {
		t.Fatalf("next deadline = %v", got)
	}
	w.advance(grace)
	if c, p := w.tr.Counts(); c != 1 || p != 1 {
		t.Fatalf("counts = %d, %d", c, p)
	}
}

func BenchmarkHeartbeat(b *testing.B) {
	tr := NewTracker(Config{TTL: ttl, Grace: grace})
	ids := make([]string, 10000)
	for i := range ids {
		ids[i] = string(rune('a'+i%26)) + time.Duration(i).String()
		if _, err := tr.Connect(t0, Conn{ID: ids[i], UserID: ids[i]}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = tr.Heartbeat(t0.Add(time.Duration(i)), ids[i%len(ids)])
	}
}

func BenchmarkConnectDisconnect(b *testing.B) {
	tr := NewTracker(Config{TTL: ttl, Grace: 0})
	b.ReportAllocs()
	now := t0
	for i := 0; i < b.N; i++ {
		now = now.Add(time.Microsecond)
		_, _ = tr.Connect(now, Conn{ID: "c", UserID: "bob", Device: "web"})
		_, _ = tr.Disconnect(now, "c", Closed)
		tr.Advance(now)
	}
}

const forgetAfter = 720 * time.Hour

func newForgettingWorld(t *testing.T) *world {
	return &world{t: t, tr: NewTracker(Config{TTL: ttl, Grace: grace, ForgetAfter: forgetAfter}), now: t0}
}

// goOffline takes user from a new connection to a published offline and
// returns the offline's version.
func (w *world) goOffline(id, user string) uint64 {
	w.t.Helper()
	w.connect(id, user, "web")
	w.disconnect(id)
	out := w.advance(grace)
	expectChanges(w.t, out, user+"=offline")
	return out.Changes[0].Version
}

func expectForgotten(t *testing.T, tr *Tracker, user string) {
	t.Helper()
	p := tr.Presence(user)
	if p.State != Offline || p.Version != 0 || !p.LastSeen.IsZero() || p.ConnectionCount != 0 || len(p.Devices) != 0 {
		t.Fatalf("%s = %+v, want as never seen", user, p)
	}
	if s, v := tr.State(user); s != Offline || v != 0 {
		t.Fatalf("state of %s = %v v%d, want offline v0", user, s, v)
	}
	if _, ok := tr.users[user]; ok {
		t.Fatalf("%s is still held", user)
	}
}

func TestForgottenAfterOfflineForForgetAfter(t *testing.T) {
	w := newForgettingWorld(t)
	w.connect("c1", "bob", "web")
	w.status("c1", false)
	w.disconnect("c1")
	expectChanges(t, w.advance(grace), "bob=offline")
	offlineAt := w.now
	w.advance(ttl) // past the closed connection's stale heap entry
	if got := w.tr.NextDeadline(); !got.Equal(offlineAt.Add(forgetAfter)) {
		t.Fatalf("next deadline = %v, want the offline plus forget-after %v", got, offlineAt.Add(forgetAfter))
	}
	out := w.advance(offlineAt.Add(forgetAfter - time.Millisecond).Sub(w.now))
	if p := w.tr.Presence("bob"); out.Forgotten != 0 || p.Version != 3 || p.LastSeen.IsZero() {
		t.Fatalf("forgotten too early: %+v, %+v", out, p)
	}
	out = w.advance(time.Millisecond)
	expectChanges(t, out) // forgetting publishes nothing
	if out.Forgotten != 1 {
		t.Fatalf("forgotten = %d, want 1", out.Forgotten)
	}
	expectForgotten(t, w.tr, "bob")
	if w.tr.forgets.Len() != 0 || !w.tr.NextDeadline().IsZero() {
		t.Fatalf("%d users still queued, next deadline %v", w.tr.forgets.Len(), w.tr.NextDeadline())
	}
	// Back: a version above the forgotten one, which viewers may hold.
	out = w.connect("c2", "bob", "web")
	expectChanges(t, out, "bob=online")
	if v := out.Changes[0].Version; v <= 3 {
		t.Fatalf("version after coming back = %d, want above 3", v)
	}
}

func TestComebackCancelsForgetting(t *testing.T) {
	w := newForgettingWorld(t)
	w.goOffline("c1", "bob")
	w.advance(forgetAfter / 2)
	expectChanges(t, w.connect("c2", "bob", "web"), "bob=online")
	if w.tr.forgets.Len() != 0 {
		t.Fatalf("a comeback left %d entries queued", w.tr.forgets.Len())
	}
	w.disconnect("c2")
	expectChanges(t, w.advance(grace), "bob=offline") // armed again, from now
	again := w.now
	if out := w.advance(forgetAfter/2 + time.Hour); out.Forgotten != 0 || w.tr.Presence("bob").LastSeen.IsZero() {
		t.Fatalf("forgotten at the first offline's deadline: %+v", out)
	}
	if out := w.advance(again.Add(forgetAfter).Sub(w.now)); out.Forgotten != 1 {
		t.Fatalf("forgotten = %d at the second offline's deadline", out.Forgotten)
	}
	expectForgotten(t, w.tr, "bob")
}

func TestOnlyOfflineUsersAreForgotten(t *testing.T) {
	w := newForgettingWorld(t)
	w.connect("c1", "amy", "web") // online throughout, heard from
	w.connect("c2", "bob", "web")
	w.disconnect("c2") // in grace when the clock jumps
	for i := 0; i < 3; i++ {
		w.now = w.now.Add(forgetAfter)
		if err := w.tr.Heartbeat(w.now, "c1"); err != nil {
			t.Fatal(err)
		}
		w.tr.Advance(w.now)
	}
	if p := w.tr.Presence("amy"); p.State != Online || p.Version != 1 {
		t.Fatalf("amy = %+v", p)
	}
	// bob's offline came at the grace end: forgotten one forget-after later.
	expectForgotten(t, w.tr, "bob")
}

func TestForgettingReleasesEverythingPerUser(t *testing.T) {
	w := newForgettingWorld(t)
	w.connect("c1", "bob", "web")
	w.connect("c2", "bob", "ios")
	user, conn := weak.Make(w.tr.users["bob"]), weak.Make(w.tr.conns["c2"])
	w.disconnect("c1")
	w.disconnect("c2")
	w.advance(grace)
	runtime.GC()
	if conn.Value() != nil {
		t.Fatal("an ended connection is still reachable while its user is remembered")
	}
	w.advance(forgetAfter)
	expectForgotten(t, w.tr, "bob")
	runtime.GC()
	if user.Value() != nil || conn.Value() != nil {
		t.Fatal("the forgotten user's entries are still reachable")
	}
	runtime.KeepAlive(w.tr) // the tracker must live on for the check to mean anything
}

func TestVersionsOfForgottenUsersNeverGoBack(t *testing.T) {
	w := newForgettingWorld(t)
	var bob uint64
	for i := 0; i < 3; i++ {
		bob = w.goOffline("b", "bob")
	}
	amy := w.goOffline("a", "amy")
	w.advance(forgetAfter)
	expectForgotten(t, w.tr, "bob")
	expectForgotten(t, w.tr, "amy")
	for user, last := range map[string]uint64{"bob": bob, "amy": amy} {
		out := w.connect("again-"+user, user, "web")
		if len(out.Changes) != 1 || out.Changes[0].Version <= last {
			t.Fatalf("%s back with %+v, after version %d", user, out.Changes, last)
		}
	}
}

func TestForgetAfterZeroNeverForgets(t *testing.T) {
	w := newWorld(t)
	v := w.goOffline("c1", "bob")
	w.advance(100 * forgetAfter)
	if p := w.tr.Presence("bob"); p.Version != v || p.LastSeen.IsZero() || w.tr.forgets.Len() != 0 {
		t.Fatalf("bob = %+v, %d queued", p, w.tr.forgets.Len())
	}
}

// A user whose devices all go at once (their node is lost, or their
// deadlines are due in one sweep) stays as they were through the grace,
// then goes offline: never away in between because the active device
// happened to be ended first.
func TestDevicesEndedTogetherPublishNoStateBetween(t *testing.T) {
	for _, how := range []string{"node lost", "expired together"} {
		t.Run(how, func(t *testing.T) {
			for round := 0; round < 50; round++ {
				now := time.Unix(1000, 0)
				tr := NewTracker(Config{TTL: 10 * time.Second, Grace: time.Second})
				if _, err := tr.Connect(now, Conn{ID: "c1", UserID: "bob", Device: "web", Node: "n"}); err != nil {
					t.Fatal(err)
				}
				if _, err := tr.Connect(now, Conn{ID: "c2", UserID: "bob", Device: "ios", Node: "n"}); err != nil {
					t.Fatal(err)
				}
				if _, err := tr.SetStatus(now, "c2", false); err != nil {
					t.Fatal(err)
				}
				var out Outcome
				if how == "node lost" {
					out = tr.DisconnectNode(now.Add(time.Second), "n")
				} else {
					out = tr.Advance(now.Add(11 * time.Second))
				}
				if len(out.Changes) != 0 || out.GraceStarted != 1 {
					t.Fatalf("round %d: changes %v, graces started %d; want none and 1", round, out.Changes, out.GraceStarted)
				}
			}
		})
	}
}

// Many users' connections ending in one call (a late Advance, a node's
// death) each start one grace and end in one offline, past the few users a
// plain list holds.
func TestManyUsersEndingAtOnceGoOfflineOnceEach(t *testing.T) {
	const users = 40
	for _, end := range []string{"expiry", "node"} {
		tr := NewTracker(Config{TTL: ttl, Grace: grace})
		for i := range users {
			u := fmt.Sprint("u", i)
			for d := range 2 {
				c := Conn{ID: fmt.Sprint(u, "-", d), UserID: u, Device: fmt.Sprint("d", d), Node: "n"}
				if _, err := tr.Connect(t0, c); err != nil {
					t.Fatal(err)
				}
			}
		}
		at := t0.Add(2 * ttl)
		var out Outcome
		if end == "expiry" {
			out = tr.Advance(at)
			if len(out.Expired) != 2*users {
				t.Fatalf("%s: %d connections expired, want %d", end, len(out.Expired), 2*users)
			}
		} else {
			out = tr.DisconnectNode(at, "n")
		}
		if out.GraceStarted != users || len(out.Changes) != 0 {
			t.Fatalf("%s: %d graces started and %d changes, want %d and none", end, out.GraceStarted, len(out.Changes), users)
		}
		var got []string
		for _, ch := range tr.Advance(at.Add(grace)).Changes {
			if ch.State != Offline {
				t.Fatalf("%s: change %+v, want offline", end, ch)
			}
			got = append(got, ch.UserID)
		}
		// Order aside (deadlines tie; a node's connections are walked in
		// map order), each user comes once.
		slices.Sort(got)
		want := make([]string, users)
		for i := range want {
			want[i] = fmt.Sprint("u", i)
		}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: offlines for %v, want each of %v once", end, got, want)
		}
	}
}

// userList keeps each user once, in the order first added, before and
// after it switches to a set.
func TestUserListKeepsFirstOrderOnce(t *testing.T) {
	for _, n := range []int{3, 16, 17, 40} {
		var l userList
		var want []string
		for i := range n {
			u := fmt.Sprint("u", i)
			want = append(want, u)
			l.add(u)
			l.add(want[i/2]) // repeats, early and late
			l.add(u)
		}
		if !slices.Equal(l.order, want) {
			t.Fatalf("%d users: order %v, want %v", n, l.order, want)
		}
	}
}
