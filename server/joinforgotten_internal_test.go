package server

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/memstore"
)

// A user who shares a team again with a subject may hold the subject's
// state from before (hidden since), and the store may no longer have the
// subject at all: lost with Redis's data, or forgotten, read as "offline,
// version 0". The team's view holds the subject's newer offline, routed
// while the joiner was not in the team. The join's catch-up took the view's
// newer version for a change that had reached the joiner and sent nothing,
// so the joiner kept showing the subject away (chaos, one Redis, seed
// 225511678, ten minutes: a ghost after an empty restart). It must send
// the view's offline.
func TestJoinCatchUpCorrectsAStaleStateTheStoreNoLongerHas(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	h, st, _, local := catchUpHubWith(t, "shared", [][2]string{{"t3", "u03"}, {"t3", "u15"}, {"t1", "u15"}, {"t1", "u22"}},
		memstore.Config{ForgetAfter: time.Hour, Now: clock})
	online(t, st, "u15")
	if err := st.SetStatus(ctx, "d-u15", false); err != nil {
		t.Fatal(err)
	}
	away := read(t, st, "u15")
	local("u22") // t1's view holds u15 through u22
	w := &wire{c: local("u03")}

	// u03 leaves t3: u15 is out of sight, hidden at the version held.
	if hidden := leaveHiding(t, h, st, w, "u15"); hidden != away.Version {
		t.Fatalf("u15 hidden from u03 at %d, want the away u03 holds, %d", hidden, away.Version)
	}
	// u15 goes offline: routed through t1, to u22 only.
	if err := st.Disconnect(ctx, "d-u15", presence.Closed); err != nil {
		t.Fatal(err)
	}
	if err := st.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	off := read(t, st, "u15")
	if off.State != presence.Offline || off.Version <= away.Version {
		t.Fatalf("u15 after its disconnect: %+v", off)
	}
	h.OnPresence(store.PresenceEvent{Change: presence.Change{UserID: "u15", State: presence.Offline, Version: off.Version, At: clock()},
		Teams: []string{"t1"}})
	// The store no longer has u15.
	mu.Lock()
	now = now.Add(2 * time.Hour)
	mu.Unlock()
	if err := st.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if p := read(t, st, "u15"); p.Version != 0 {
		t.Fatalf("u15 after forget-after: %+v, want version 0 (never seen)", p)
	}

	if err := st.AddMember(ctx, "t1", "u03"); err != nil {
		t.Fatal(err)
	}
	h.OnMembership(store.MembershipEvent{Team: "t1", UserID: "u03", Joined: true, UserTeams: store.TeamList{"t1"}})
	runJobs(ctx, h, w)
	if want := fmt.Sprintf("u15=offline@%d", off.Version); !strings.Contains(w.String(), want) {
		t.Fatalf("u03, back in a team with u15 and holding its away, was sent %s; want %s", w, want)
	}
}

// leaveHiding takes u03, w's user, out of t3, its only team, and returns
// the version at which subject is hidden from it since.
func leaveHiding(t *testing.T, h *hub, st store.Store, w *wire, subject string) uint64 {
	t.Helper()
	ctx := context.Background()
	if err := st.RemoveMember(ctx, "t3", "u03"); err != nil {
		t.Fatal(err)
	}
	h.OnMembership(store.MembershipEvent{Team: "t3", UserID: "u03", UserTeams: store.TeamList{}})
	runJobs(ctx, h, w)
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	return w.c.hidden[subject]
}

func read(t *testing.T, st store.Store, user string) presence.Presence {
	t.Helper()
	ps, err := st.Presence(context.Background(), []string{user})
	if err != nil {
		t.Fatal(err)
	}
	return ps[0]
}

// lostShared is the memory store taken for a shared one whose reads take
// the users in lost for never seen: what Redis answers after a master
// restarted empty, until the users' nodes assert their connections again
// (a heartbeat of each, up to an interval later).
type lostShared struct {
	sharedHooked
	lost map[string]bool
}

func (s lostShared) Presence(ctx context.Context, users []string) ([]presence.Presence, error) {
	ps, err := s.sharedHooked.Presence(ctx, users)
	for i := range ps {
		if s.lost[ps[i].UserID] {
			ps[i] = presence.Presence{UserID: ps[i].UserID}
		}
	}
	return ps, err
}

// The same as TestJoinCatchUpCorrectsAStaleStateTheStoreNoLongerHas with
// the view online: the joiner holds the subject's offline from before, the
// subject has come online since (routed while the joiner was out of their
// teams), and the store has lost the subject's data. The catch-up sent
// nothing, so the joiner showed the subject offline until a resync (chaos,
// cluster, seed 474819386: u03 showed u19 offline 6.7 s after joining t2;
// shard 1's master had restarted empty 3 s before the join).
func TestJoinCatchUpSendsTheViewsOnlineOfAMemberTheStoreLost(t *testing.T) {
	ctx := context.Background()
	h, st, sm, local := catchUpHub(t, "shared", [][2]string{{"t3", "u03"}, {"t3", "u15"}, {"t1", "u15"}, {"t1", "u22"}})
	mem := st.(*memstore.Store)
	online(t, st, "u15")
	if err := st.Disconnect(ctx, "d-u15", presence.Closed); err != nil {
		t.Fatal(err)
	}
	if err := st.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if off := read(t, st, "u15"); off.State != presence.Offline || off.Version == 0 {
		t.Fatalf("u15 after its disconnect: %+v", off)
	}
	local("u22") // t1's view holds u15 through u22
	w := &wire{c: local("u03")}
	// u03 leaves t3 holding u15's state: hidden at that version.
	hidden := leaveHiding(t, h, st, w, "u15")
	if hidden == 0 {
		t.Fatal("u15 not hidden from u03")
	}
	// u15 comes back, at a newer version: routed to u22 only.
	on := online(t, st, "u15")
	if on <= hidden {
		t.Fatalf("u15 back online at %d, not above the hidden %d", on, hidden)
	}
	back := time.Now().Truncate(time.Millisecond)
	h.OnPresence(store.PresenceEvent{Change: presence.Change{UserID: "u15", State: presence.Online, Version: on, At: back, Since: back},
		Teams: []string{"t1", "t3"}})
	runJobs(ctx, h, w)
	if strings.Contains(w.String(), "u15=") {
		t.Fatalf("u03, out of u15's teams, was sent %s", w)
	}
	// The store loses u15; u03 joins t1.
	h.srv.store = lostShared{sharedHooked{hookedMem{mem, sm}}, map[string]bool{"u15": true}}
	if p := read(t, h.srv.store, "u15"); p.Version != 0 {
		t.Fatalf("u15 as read now: %+v, want never seen", p)
	}
	if err := st.AddMember(ctx, "t1", "u03"); err != nil {
		t.Fatal(err)
	}
	h.OnMembership(store.MembershipEvent{Team: "t1", UserID: "u03", Joined: true, UserTeams: store.TeamList{"t1"}})
	runJobs(ctx, h, w)
	if want := fmt.Sprintf("u15=online@%d", on); !strings.Contains(w.String(), want) {
		t.Fatalf("u03, back in a team with u15 and holding an older state, was sent %s; want %s", w, want)
	}
	// Every entry carries since (docs/protocol.md), this one from the view.
	for _, ch := range w.whole {
		if ch.UserID == "u15" && ch.Since != back.UnixMilli() {
			t.Fatalf("u15's online sent with since %d, want %d (when it came online)", ch.Since, back.UnixMilli())
		}
	}
}

// A joiner routed a member's change while its catch-up waits holds it; a
// newer change of the same look (a re-assertion after a data loss) is
// routed to nobody. When the catch-up then reads the member as never seen
// (the store lost them), the view's state is no news to the joiner: sent,
// it was a second dnd, which clients take for a second "went busy".
func TestJoinCatchUpSendsNoSecondCopyOfWhatReachedTheJoinerMeanwhile(t *testing.T) {
	ctx := context.Background()
	h, st, sm, local := catchUpHub(t, "shared", [][2]string{{"t3", "u03"}, {"t1", "u15"}, {"t1", "u22"}})
	mem := st.(*memstore.Store)
	on := online(t, st, "u15")
	local("u22") // t1's view holds u15 online through u22
	w := &wire{c: local("u03")}

	// The store loses u15; u03 joins t1, and its catch-up waits.
	h.srv.store = lostShared{sharedHooked{hookedMem{mem, sm}}, map[string]bool{"u15": true}}
	if err := st.AddMember(ctx, "t1", "u03"); err != nil {
		t.Fatal(err)
	}
	h.OnMembership(store.MembershipEvent{Team: "t1", UserID: "u03", Joined: true, UserTeams: store.TeamList{"t1"}})
	h.work.mu.Lock()
	jobs := h.work.jobs // indexing u03 under t1 once watched, then the catch-up
	h.work.jobs = nil
	h.work.mu.Unlock()
	if len(jobs) != 2 {
		t.Fatalf("%d jobs queued by the join, want 2 (the watch, the catch-up)", len(jobs))
	}
	jobs[0](ctx)
	// Meanwhile u15 goes busy, routed to u03 and flushed; then a
	// re-assertion writes the same look at a newer version.
	at := time.Now().Truncate(time.Millisecond)
	busy := presence.Change{UserID: "u15", State: presence.DND, Version: on + 1, At: at, Since: at}
	h.OnPresence(store.PresenceEvent{Change: busy, Teams: []string{"t1"}})
	w.write()
	if want := fmt.Sprintf("[u15=dnd@%d]", on+1); w.String() != want {
		t.Fatalf("u03, indexed under t1, was sent %s; want %s", w, want)
	}
	again := busy
	again.Version, again.At = on+2, at.Add(time.Second)
	h.OnPresence(store.PresenceEvent{Change: again, Teams: []string{"t1"}})
	w.write()

	jobs[1](ctx)
	w.write()
	runJobs(ctx, h, w)
	if want := fmt.Sprintf("[u15=dnd@%d]", on+1); w.String() != want {
		t.Fatalf("u03 was sent %s; want only %s: the catch-up's copy is no news", w, want)
	}
}

// A change of a member queued to the joiner while its catch-up waits, and
// dropped unsent when a leave hid the member, is not held: a later
// catch-up that reads the member as never seen (the store lost them) must
// still send the view's state, though a newer version of the same look (a
// re-assertion) was routed to nobody. Found by review: the catch-up took
// the dropped change for one the joiner held, and the joiner kept showing
// the member online.
func TestJoinCatchUpSendsWhatALeaveDroppedUnsent(t *testing.T) {
	ctx := context.Background()
	h, st, sm, local := catchUpHub(t, "shared", [][2]string{{"t9", "x"}, {"t2", "u03"}, {"t2", "u15"}, {"t1", "u15"}, {"t1", "u22"}})
	mem := st.(*memstore.Store)
	on := online(t, st, "u15")
	local("u22")
	w := &wire{c: local("u03")} // holds u15 online, through t2
	// u03 joins t9: a catch-up in flight.
	if err := st.AddMember(ctx, "t9", "u03"); err != nil {
		t.Fatal(err)
	}
	h.OnMembership(store.MembershipEvent{Team: "t9", UserID: "u03", Joined: true, UserTeams: store.TeamList{"t2", "t9"}})
	// u15 goes busy: queued to u03 through t2, not written yet.
	at := time.Now().Truncate(time.Millisecond)
	busy := presence.Change{UserID: "u15", State: presence.DND, Version: on + 1, At: at, Since: at}
	h.OnPresence(store.PresenceEvent{Change: busy, Teams: []string{"t1", "t2"}})
	// The store loses u15; u03 leaves t2 (hiding u15, dropping the busy)
	// and joins t1; a re-assertion writes the busy again.
	h.srv.store = lostShared{sharedHooked{hookedMem{mem, sm}}, map[string]bool{"u15": true}}
	if err := st.RemoveMember(ctx, "t2", "u03"); err != nil {
		t.Fatal(err)
	}
	h.OnMembership(store.MembershipEvent{Team: "t2", UserID: "u03", UserTeams: store.TeamList{"t9"}})
	if err := st.AddMember(ctx, "t1", "u03"); err != nil {
		t.Fatal(err)
	}
	h.OnMembership(store.MembershipEvent{Team: "t1", UserID: "u03", Joined: true, UserTeams: store.TeamList{"t1", "t9"}})
	again := busy
	again.Version, again.At = on+2, at.Add(time.Second)
	h.OnPresence(store.PresenceEvent{Change: again, Teams: []string{"t1", "t2"}})
	runJobs(ctx, h) // every job queued, nothing written meanwhile
	w.write()
	if want := fmt.Sprintf("[u15=dnd@%d]", on+2); w.String() != want {
		t.Fatalf("u03, back in a team with u15, was sent %s; want %s", w, want)
	}
}

// The memory store has no views: while a join's catch-up waits, what it
// noted as sent is all that stops it from sending again a change already
// written. A hide of the subject with nothing of theirs still queued must
// leave that note alone. Found by review: every hide dropped it, and u03
// was sent u15's away twice.
func TestHideWithNothingQueuedKeepsTheCatchUpsNote(t *testing.T) {
	ctx := context.Background()
	h, st, _, local := catchUpHub(t, "memory", [][2]string{{"t1", "u03"}, {"t1", "u15"}, {"t2", "u15"}})
	online(t, st, "u15")
	w := &wire{c: local("u03")}
	if err := st.AddMember(ctx, "t2", "u03"); err != nil {
		t.Fatal(err)
	}
	h.OnMembership(store.MembershipEvent{Team: "t2", UserID: "u03", Joined: true, UserTeams: store.TeamList{"t1", "t2"}})
	if err := st.SetStatus(ctx, "d-u15", false); err != nil {
		t.Fatal(err)
	}
	away := read(t, st, "u15")
	h.OnPresence(store.PresenceEvent{Change: presence.Change{UserID: "u15", State: away.State, Version: away.Version,
		At: away.Since, Since: away.Since}, Teams: []string{"t1", "t2"}})
	w.write() // written before the hide below: u03 holds it
	if err := st.RemoveMember(ctx, "t1", "u15"); err != nil {
		t.Fatal(err)
	}
	h.OnMembership(store.MembershipEvent{Team: "t1", UserID: "u15", UserTeams: store.TeamList{"t2"}})
	runJobs(ctx, h, w)
	if want := fmt.Sprintf("[u15=away@%d]", away.Version); w.String() != want {
		t.Fatalf("u03 was sent %s; want %s once", w, want)
	}
}
