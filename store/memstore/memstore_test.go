package memstore_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/memstore"
	"github.com/greendot/greendot/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, cfg storetest.Config) store.Store {
		s, err := memstore.New(memstore.Config{TTL: cfg.TTL, Grace: cfg.Grace, ForgetAfter: cfg.ForgetAfter,
			ChannelCountsTTL: cfg.ChannelCountsTTL})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// clock is a clock the test moves.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// changes records published changes.
type changes struct {
	mu  sync.Mutex
	got []presence.Change
}

func (r *changes) OnPresence(ev store.PresenceEvent) {
	r.mu.Lock()
	r.got = append(r.got, ev.Change)
	r.mu.Unlock()
}

func (r *changes) OnMembership(store.MembershipEvent) {}

func (r *changes) last() presence.Change {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[len(r.got)-1]
}

func TestForgetAfterDefaultOnInjectedClock(t *testing.T) {
	const grace, forgetAfter = 5 * time.Second, 720 * time.Hour
	ctx := context.Background()
	c := &clock{now: time.Unix(1_764_500_000, 0)}
	s, err := memstore.New(memstore.Config{Grace: grace, ForgetAfter: forgetAfter, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	rec := &changes{}
	s.Subscribe(rec)
	must(t, s.AddMember(ctx, "t1", "bob"))
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	must(t, s.Disconnect(ctx, "c1", presence.Closed))
	c.advance(grace)
	must(t, s.Sweep(ctx))
	offline := rec.last()
	if offline.State != presence.Offline {
		t.Fatalf("last change = %+v, want offline", offline)
	}
	c.advance(forgetAfter - time.Millisecond)
	must(t, s.Sweep(ctx))
	if p := presenceOf(t, s, "bob"); p.Version != offline.Version || p.LastSeen.IsZero() {
		t.Fatalf("forgotten early: %+v", p)
	}
	c.advance(time.Millisecond)
	must(t, s.Sweep(ctx))
	if p := presenceOf(t, s, "bob"); p.State != presence.Offline || p.Version != 0 || !p.LastSeen.IsZero() {
		t.Fatalf("after forget-after: %+v, want as never seen", p)
	}
	if ps, _ := s.States(ctx, []string{"bob"}); ps[0].Version != 0 {
		t.Fatalf("snapshot state = %+v", ps[0])
	}
	if teams, _ := s.TeamsOf(ctx, "bob"); !slices.Equal(teams, []string{"t1"}) {
		t.Fatalf("teams of bob = %q, want [t1]", teams)
	}
	if members, _ := s.Members(ctx, "t1"); !slices.Equal(members, []string{"bob"}) {
		t.Fatalf("members of t1 = %q, want [bob]", members)
	}
	must(t, s.Connect(ctx, presence.Conn{ID: "c2", UserID: "bob", Device: "web"}))
	if back := rec.last(); back.State != presence.Online || back.Version <= offline.Version {
		t.Fatalf("back with %+v, after version %d", back, offline.Version)
	}
}

func TestForgetAfterNonsenseRefused(t *testing.T) {
	for _, cfg := range []memstore.Config{
		{ForgetAfter: -time.Second},
		{Grace: 5 * time.Second, ForgetAfter: time.Second},
	} {
		if _, err := memstore.New(cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
	for _, cfg := range []memstore.Config{
		{Grace: 5 * time.Second},                               // 0: never
		{Grace: 5 * time.Second, ForgetAfter: 5 * time.Second}, // as long as the grace
	} {
		if _, err := memstore.New(cfg); err != nil {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}

func presenceOf(t *testing.T, s *memstore.Store, user string) presence.Presence {
	t.Helper()
	ps, err := s.Presence(context.Background(), []string{user})
	if err != nil {
		t.Fatal(err)
	}
	return ps[0]
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// MemberCount counts a team's members.
func TestMemberCount(t *testing.T) {
	ctx := context.Background()
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"alice", "bob", "carol", "bob"} {
		if err := s.AddMember(ctx, "t1", u); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.RemoveMember(ctx, "t1", "carol"); err != nil {
		t.Fatal(err)
	}
	for team, want := range map[string]int{"t1": 2, "none": 0} {
		if n, err := s.MemberCount(ctx, team); err != nil || n != want {
			t.Fatalf("MemberCount(%s) = %d, %v; want %d", team, n, err, want)
		}
	}
}

// Channel counts stop counting exactly at the ttl after they were set, on
// the injected clock; set again, they count again.
func TestChannelCountsExpireOnInjectedClock(t *testing.T) {
	ctx := context.Background()
	c := &clock{now: time.Unix(1_764_500_000, 0)}
	s, err := memstore.New(memstore.Config{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	counts := func() map[string]int {
		t.Helper()
		m, err := s.ChannelCounts(ctx, "")
		must(t, err)
		return m
	}
	must(t, s.SetChannelCounts(ctx, map[string]int{"presence-a": 2}))
	c.advance(store.ChannelCountsTTL - time.Millisecond)
	if got := counts(); got["presence-a"] != 2 {
		t.Fatalf("before the ttl: %v", got)
	}
	c.advance(time.Millisecond)
	if got := counts(); len(got) != 0 {
		t.Fatalf("at the ttl: %v, want none", got)
	}
	must(t, s.SetChannelCounts(ctx, map[string]int{"presence-a": 1}))
	if got := counts(); got["presence-a"] != 1 {
		t.Fatalf("set again: %v", got)
	}
	if _, err := memstore.New(memstore.Config{ChannelCountsTTL: -time.Second}); err == nil {
		t.Fatal("a negative channel-counts ttl was accepted")
	}
}

// With webhooks on, each change names the teams it gives their first
// present member (Occupied) and those it leaves with none (Vacated), as its
// member events count them: a removal takes a member out of the count
// without an event of its own, and a present user added to a team is not
// counted there until their next change between offline and not.
func TestOccupancy(t *testing.T) {
	var mu sync.Mutex
	var got []string
	s, err := memstore.New(memstore.Config{OnChange: func(ev store.PresenceEvent) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, ev.Change.UserID+" "+ev.Change.State.String()+" +"+strings.Join(ev.Occupied, ",")+" -"+strings.Join(ev.Vacated, ","))
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	do := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	do(s.AddMember(ctx, "eng", "ann"))
	do(s.AddMember(ctx, "ops", "ann"))
	do(s.AddMember(ctx, "eng", "bob"))
	do(s.Connect(ctx, presence.Conn{ID: "a1", UserID: "ann", Device: "web"}))
	do(s.Connect(ctx, presence.Conn{ID: "a2", UserID: "ann", Device: "phone"})) // no change
	do(s.Connect(ctx, presence.Conn{ID: "b1", UserID: "bob", Device: "web"}))
	do(s.SetStatus(ctx, "b1", false)) // away: still present
	do(s.RemoveMember(ctx, "eng", "ann"))
	do(s.Disconnect(ctx, "b1", presence.Closed)) // no grace: bob was eng's last present member
	do(s.Sweep(ctx))
	do(s.AddMember(ctx, "eng", "ann")) // ann, present: not counted in eng
	do(s.Disconnect(ctx, "a1", presence.Closed))
	do(s.Disconnect(ctx, "a2", presence.Closed))
	do(s.Sweep(ctx))
	mu.Lock()
	defer mu.Unlock()
	want := []string{
		"ann online +eng,ops -",
		"bob online + -",
		"bob away + -",
		"bob offline + -eng",
		"ann offline + -ops",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("changes\n%q\nwant\n%q", got, want)
	}
}

// teamViews records what each membership event's view of the user's teams
// answered while the event was handled (the view is valid only then).
type teamViews struct {
	changes
	mu    sync.Mutex
	lists [][]string
	ins   [][]bool
	probe []string
}

func (r *teamViews) OnMembership(ev store.MembershipEvent) {
	list, _ := ev.UserTeams.List(context.Background())
	in, _ := ev.UserTeams.In(context.Background(), r.probe)
	r.mu.Lock()
	r.lists = append(r.lists, list)
	r.ins = append(r.ins, in)
	r.mu.Unlock()
}

func TestTeamsOfStaySortedThroughJoinsAndLeavesInAnyOrder(t *testing.T) {
	ctx := context.Background()
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &teamViews{probe: []string{"a", "m", "q", "z"}}
	s.Subscribe(rec)
	for _, team := range []string{"m", "c", "z", "a", "q", "m"} { // "m" twice: a no-op
		must(t, s.AddMember(ctx, team, "bob"))
	}
	for _, team := range []string{"q", "x", "a"} { // "x": never joined
		must(t, s.RemoveMember(ctx, team, "bob"))
	}
	teams, err := s.TeamsOf(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"c", "m", "z"}; !slices.Equal(teams, want) {
		t.Fatalf("teams of bob = %q, want %q", teams, want)
	}
	teams[0] = "changed by the caller"
	if again, _ := s.TeamsOf(ctx, "bob"); again[0] != "c" {
		t.Fatalf("a caller's change to TeamsOf's answer reached the store: %q", again)
	}
	many, _ := s.TeamsOfMany(ctx, []string{"bob", "nobody"})
	if !slices.Equal(many[0], []string{"c", "m", "z"}) || len(many[1]) != 0 {
		t.Fatalf("TeamsOfMany = %q", many)
	}

	rec.mu.Lock()
	defer rec.mu.Unlock()
	// The events: joins m, c, z, a, q (the second m is none), then leaves
	// q, x, a; each view is the user's teams right after its change.
	wantLists := [][]string{{"m"}, {"c", "m"}, {"c", "m", "z"}, {"a", "c", "m", "z"}, {"a", "c", "m", "q", "z"},
		{"a", "c", "m", "z"}, {"a", "c", "m", "z"}, {"c", "m", "z"}}
	wantIns := [][]bool{{false, true, false, false}, {false, true, false, false}, {false, true, false, true},
		{true, true, false, true}, {true, true, true, true}, {true, true, false, true}, {true, true, false, true},
		{false, true, false, true}}
	if len(rec.lists) != len(wantLists) {
		t.Fatalf("%d membership events, want %d: %q", len(rec.lists), len(wantLists), rec.lists)
	}
	for i := range wantLists {
		if !slices.Equal(rec.lists[i], wantLists[i]) || !slices.Equal(rec.ins[i], wantIns[i]) {
			t.Errorf("event %d: List %q In(%q) %v, want %q and %v", i, rec.lists[i], rec.probe, rec.ins[i], wantLists[i], wantIns[i])
		}
	}
}

// TestMembershipKeepsCopiesOfItsNames: the names a membership keeps are
// the store's own, not pieces of the caller's strings (a request's URI).
func TestMembershipKeepsCopiesOfItsNames(t *testing.T) {
	ctx := context.Background()
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	uri := "/v1/teams/core/members/alice"
	team, user := uri[10:14], uri[23:]
	must(t, s.AddMember(ctx, team, user))
	inURI := func(v string) bool {
		p, start := uintptr(unsafe.Pointer(unsafe.StringData(v))), uintptr(unsafe.Pointer(unsafe.StringData(uri)))
		return p >= start && p < start+uintptr(len(uri))
	}
	if !inURI(team) || !inURI(user) {
		t.Fatal("the names are not pieces of the URI: this test checks nothing")
	}
	members, _ := s.Members(ctx, "core")
	if len(members) != 1 || members[0] != "alice" || inURI(members[0]) {
		t.Errorf("members of core = %q: the store kept the caller's string", members)
	}
	teams, _ := s.TeamsOf(ctx, "alice")
	if len(teams) != 1 || teams[0] != "core" {
		t.Fatalf("teams of alice = %q", teams)
	}

	// A leave's event, and a status's change of a user the store did not
	// know, carry the store's copies too: receivers keep them (a hidden
	// subject's id, a webhook's).
	rec := &names{}
	s.Subscribe(rec)
	leave := "/v1/teams/core/members/alice"
	must(t, s.RemoveMember(ctx, leave[10:14], leave[23:]))
	status := "/v1/users/carol/status"
	must(t, s.SetUserStatus(ctx, status[10:15], presence.Status{Mode: presence.ModeDND, Text: "away"}))
	if ps, _ := s.Presence(ctx, []string{"carol"}); ps[0].Status.Mode != presence.ModeDND {
		t.Errorf("carol after her status: %+v", ps[0])
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.got) != 3 {
		t.Fatalf("names in events: %q, want alice and core of the leave, carol of the status", rec.got)
	}
	for _, n := range rec.got {
		if within(n, leave) || within(n, status) {
			t.Errorf("an event carried %q, a piece of the caller's string", n)
		}
	}
}

// names records the ids and teams events carry.
type names struct {
	mu  sync.Mutex
	got []string
}

func (r *names) OnPresence(ev store.PresenceEvent) {
	r.mu.Lock()
	r.got = append(r.got, ev.Change.UserID)
	r.mu.Unlock()
}

func (r *names) OnMembership(ev store.MembershipEvent) {
	r.mu.Lock()
	r.got = append(r.got, ev.UserID, ev.Team)
	r.mu.Unlock()
}

func within(s, of string) bool {
	p, start := uintptr(unsafe.Pointer(unsafe.StringData(s))), uintptr(unsafe.Pointer(unsafe.StringData(of)))
	return len(s) > 0 && p >= start && p < start+uintptr(len(of))
}
