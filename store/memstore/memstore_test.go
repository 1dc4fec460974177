package memstore_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

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
