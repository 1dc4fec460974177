// Package storetest is the conformance suite for store.Store
// implementations, as testing/slogtest is for slog handlers.
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, cfg storetest.Config) store.Store { … })
//	}
//
// The suite runs on real time with short deadlines, since a remote store
// keeps its own clock; it sweeps the store itself, as a server would.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
)

// Config is what the suite asks of a new store.
type Config struct {
	TTL         time.Duration
	Grace       time.Duration
	ForgetAfter time.Duration // 0: never forget
	Node        string
	// ChannelCountsTTL: store.ChannelCountsTTL when 0; only the test of
	// the counts' expiry sets it.
	ChannelCountsTTL time.Duration
}

// NewStore returns a fresh, empty store; it is closed by the caller's
// t.Cleanup if it needs closing.
type NewStore func(t *testing.T, cfg Config) store.Store

// Deadlines the suite uses; generous enough for a remote store under -race.
const (
	TTL         = 600 * time.Millisecond
	Grace       = 300 * time.Millisecond
	ForgetAfter = time.Second // only for the test of forgetting; the others never forget
)

// Run runs every conformance test against stores made by newStore.
func Run(t *testing.T, newStore NewStore) {
	tests := []struct {
		name string
		fn   func(t *testing.T, h *harness)
	}{
		{"FirstDeviceOnlineOnce", testFirstDeviceOnlineOnce},
		{"OfflineAfterGrace", testOfflineAfterGrace},
		{"ReconnectWithinGraceSilent", testReconnectWithinGraceSilent},
		{"AwayWhenAllIdle", testAwayWhenAllIdle},
		{"ConnectIdle", testConnectIdle},
		{"SilentConnectionExpires", testSilentConnectionExpires},
		{"HeartbeatKeepsAlive", testHeartbeatKeepsAlive},
		{"UnknownConnection", testUnknownConnection},
		{"DuplicateConnection", testDuplicateConnection},
		{"NeverSeenUser", testNeverSeenUser},
		{"Membership", testMembership},
		{"TeamsOfMany", testTeamsOfMany},
		{"MembersOfMany", testMembersOfMany},
		{"MembershipEvents", testMembershipEvents},
		{"MembershipEventsOfManyTeams", testMembershipEventsOfManyTeams},
		{"ConcurrentMembership", testConcurrentMembership},
		{"ChangeCarriesTeams", testChangeCarriesTeams},
		{"VersionsIncrease", testVersionsIncrease},
		{"UserStatus", testUserStatus},
		{"StatusExpiryBeforeGraceEnd", testStatusExpiryBeforeGraceEnd},
		{"StatusOfAnOfflineUser", testStatusOfAnOfflineUser},
		{"Broadcast", testBroadcast},
		{"ChannelCounts", testChannelCounts},
		{"MemberInfos", testMemberInfos},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, newHarness(t, newStore, Config{TTL: TTL, Grace: Grace, Node: "node-a"}))
		})
	}
	t.Run("ForgottenAfterForgetAfter", func(t *testing.T) {
		testForgottenAfterForgetAfter(t, newHarness(t, newStore,
			Config{TTL: TTL, Grace: Grace, ForgetAfter: ForgetAfter, Node: "node-a"}))
	})
	t.Run("ChannelCountsExpire", func(t *testing.T) {
		testChannelCountsExpire(t, newHarness(t, newStore,
			Config{TTL: TTL, Grace: Grace, Node: "node-a", ChannelCountsTTL: ChannelCountsTTL}))
	})
}

func newHarness(t *testing.T, newStore NewStore, cfg Config) *harness {
	h := &harness{t: t, ctx: context.Background()}
	h.s = newStore(t, cfg)
	h.s.Subscribe(h)
	if w, ok := h.s.(store.Watcher); ok {
		// A shared store delivers changes only for watched teams.
		mustDo(t, w.Watch(h.ctx, []string{Everyone, "t1", "t2"}))
		t.Cleanup(func() { w.Unwatch([]string{Everyone, "t1", "t2"}) })
	}
	return h
}

// Everyone is the team every user the suite connects joins first, so that
// its changes have an audience (a shared store publishes to teams only).
const Everyone = "everyone"

// harness records events and drives sweeps.
type harness struct {
	t   *testing.T
	ctx context.Context
	s   store.Store

	mu          sync.Mutex
	changes     []presence.Change
	teamsOf     map[string][]string // teams carried by the last change of each user
	memberships []store.MembershipEvent
	// memberTeams[i] is what memberships[i]'s view listed while its
	// handler ran (the view is valid only then); probed[i], its answers
	// for probe.
	memberTeams [][]string
	probe       []string
	probed      [][]bool
	statuses    []presence.StatusChange
}

// OnStatus implements store.StatusHandler.
func (h *harness) OnStatus(ev presence.StatusChange) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.statuses = append(h.statuses, ev)
}

func (h *harness) setUserStatus(user string, st presence.Status) {
	h.t.Helper()
	ss, ok := h.s.(store.StatusStore)
	if !ok {
		h.t.Fatal("the store does not hold statuses (store.StatusStore)")
	}
	mustDo(h.t, ss.SetUserStatus(h.ctx, user, st))
}

// expectStatuses waits (sweeping) until the status changes received are
// want, as "user=mode:text".
func (h *harness) expectStatuses(within time.Duration, want ...string) []presence.StatusChange {
	h.t.Helper()
	deadline := time.Now().Add(within)
	for {
		h.sweep()
		h.mu.Lock()
		got := make([]string, 0, len(h.statuses))
		for _, s := range h.statuses {
			got = append(got, s.UserID+"="+s.Status.Mode.String()+":"+s.Status.Text)
		}
		sts := slices.Clone(h.statuses)
		h.mu.Unlock()
		if slices.Equal(got, want) {
			return sts
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("status changes = %v, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (h *harness) OnPresence(ev store.PresenceEvent) {
	if ev.Via != "" && (len(ev.Teams) == 0 || ev.Via != ev.Teams[0]) {
		return // the same change arrives once per team: keep the first team's
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.changes = append(h.changes, ev.Change)
	if h.teamsOf == nil {
		h.teamsOf = make(map[string][]string)
	}
	h.teamsOf[ev.Change.UserID] = ev.Teams
}

func (h *harness) OnMembership(ev store.MembershipEvent) {
	if ev.Team == Everyone {
		return
	}
	var teams []string
	var in []bool
	var err error
	if ev.UserTeams != nil {
		if teams, err = ev.UserTeams.List(h.ctx); err != nil {
			h.t.Errorf("event %+v: list: %v", ev, err)
		}
		teams = slices.Sorted(slices.Values(teams)) // listed in no set order
	}
	h.mu.Lock()
	probe := h.probe
	h.mu.Unlock()
	if probe != nil {
		in = make([]bool, len(probe))
		if ev.UserTeams != nil {
			if in, err = ev.UserTeams.In(h.ctx, probe); err != nil {
				h.t.Errorf("event %+v: in: %v", ev, err)
			}
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.memberships = append(h.memberships, ev)
	h.memberTeams = append(h.memberTeams, teams)
	h.probed = append(h.probed, in)
}

func (h *harness) connect(id, user, device string) {
	h.t.Helper()
	mustDo(h.t, h.s.AddMember(h.ctx, Everyone, user))
	if err := h.s.Connect(h.ctx, presence.Conn{ID: id, UserID: user, Device: device, Node: "node-a"}); err != nil {
		h.t.Fatalf("connect %s: %v", id, err)
	}
}

func (h *harness) disconnect(id string) {
	h.t.Helper()
	if err := h.s.Disconnect(h.ctx, id, presence.Closed); err != nil {
		h.t.Fatalf("disconnect %s: %v", id, err)
	}
}

func (h *harness) status(id string, active bool) {
	h.t.Helper()
	if err := h.s.SetStatus(h.ctx, id, active); err != nil {
		h.t.Fatalf("status %s: %v", id, err)
	}
}

func (h *harness) sweep() {
	h.t.Helper()
	if err := h.s.Sweep(h.ctx); err != nil {
		h.t.Fatalf("sweep: %v", err)
	}
}

// sweepFor sweeps every 20 ms for d.
func (h *harness) sweepFor(d time.Duration) {
	h.t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		h.sweep()
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *harness) history() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, c := range h.changes {
		out = append(out, c.UserID+"="+c.State.String())
	}
	return out
}

// expectHistory waits (sweeping) until the recorded changes equal want.
func (h *harness) expectHistory(within time.Duration, want ...string) {
	h.t.Helper()
	deadline := time.Now().Add(within)
	for {
		h.sweep()
		got := h.history()
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("changes = %v, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (h *harness) presence(user string) presence.Presence {
	h.t.Helper()
	ps, err := h.s.Presence(h.ctx, []string{user})
	if err != nil || len(ps) != 1 {
		h.t.Fatalf("presence %s: %v %v", user, ps, err)
	}
	return ps[0]
}

func testFirstDeviceOnlineOnce(t *testing.T, h *harness) {
	h.connect("c1", "bob", "web")
	h.connect("c2", "bob", "ios")
	h.sweepFor(50 * time.Millisecond)
	h.expectHistory(0, "bob=online")
	p := h.presence("bob")
	if p.State != presence.Online || p.ConnectionCount != 2 || !slices.Equal(p.Devices, []string{"ios", "web"}) || p.Version != h.lastVersion("bob") {
		t.Fatalf("presence = %+v", p)
	}
}

func testOfflineAfterGrace(t *testing.T, h *harness) {
	h.connect("c1", "bob", "web")
	h.connect("c2", "bob", "ios")
	h.disconnect("c1")
	lastClose := time.Now()
	h.disconnect("c2")
	closedAt := time.Now()
	h.sweepFor(Grace / 2)
	// Read during the grace, unless the machine stalled past its end (a
	// sweep under load can outlast half the grace): then what must hold is
	// that the offline came no earlier than the grace's end, checked below.
	got, during := h.history(), h.presence("bob")
	if time.Since(lastClose) < Grace {
		if !slices.Equal(got, []string{"bob=online"}) {
			t.Fatalf("changes during grace = %v, want [bob=online]", got)
		}
		if during.State != presence.Online || during.ConnectionCount != 0 {
			t.Fatalf("during grace: %+v", during)
		}
	}
	h.expectHistory(Grace+time.Second, "bob=online", "bob=offline")
	if off := h.lastChange("bob"); off.At.Before(lastClose.Add(Grace - 5*time.Millisecond)) {
		t.Fatalf("offline at %v, %v after the last close: before the grace (%v) was over", off.At, off.At.Sub(lastClose), Grace)
	}
	p := h.presence("bob")
	if p.State != presence.Offline || p.Version != h.lastVersion("bob") {
		t.Fatalf("after grace: %+v, last change version %d", p, h.lastVersion("bob"))
	}
	if d := p.LastSeen.Sub(closedAt); d > 100*time.Millisecond || d < -100*time.Millisecond {
		t.Fatalf("last seen %v, closed at %v", p.LastSeen, closedAt)
	}
}

func testReconnectWithinGraceSilent(t *testing.T, h *harness) {
	h.connect("c1", "bob", "web")
	h.disconnect("c1")
	h.sweepFor(Grace / 3)
	h.connect("c2", "bob", "web")
	h.sweepFor(Grace + 100*time.Millisecond)
	h.expectHistory(0, "bob=online")
	if p := h.presence("bob"); p.State != presence.Online || p.ConnectionCount != 1 {
		t.Fatalf("presence = %+v", p)
	}
}

func testAwayWhenAllIdle(t *testing.T, h *harness) {
	h.connect("c1", "bob", "web")
	h.connect("c2", "bob", "ios")
	h.status("c1", false)
	h.status("c2", false)
	h.status("c1", true)
	h.disconnect("c1") // the idle device remains
	h.expectHistory(time.Second, "bob=online", "bob=away", "bob=online", "bob=away")
	// Away, then a reconnect in grace: a real difference is published.
	h.disconnect("c2")
	h.connect("c3", "bob", "web")
	h.expectHistory(time.Second, "bob=online", "bob=away", "bob=online", "bob=away", "bob=online")
}

// A connection registered again idle (the store had lost it) publishes
// away, never an online first.
func testConnectIdle(t *testing.T, h *harness) {
	mustDo(t, h.s.AddMember(h.ctx, Everyone, "bob"))
	mustDo(t, h.s.Connect(h.ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web", Node: "node-a", Idle: true}))
	h.sweepFor(50 * time.Millisecond)
	h.expectHistory(0, "bob=away")
	h.status("c1", true)
	h.expectHistory(time.Second, "bob=away", "bob=online")
}

func testSilentConnectionExpires(t *testing.T, h *harness) {
	h.connect("c1", "bob", "web")
	lastFrame := time.Now()
	h.sweepFor(TTL / 2)
	h.expectHistory(0, "bob=online")
	h.expectHistory(TTL+Grace+time.Second, "bob=online", "bob=offline")
	p := h.presence("bob")
	if d := p.LastSeen.Sub(lastFrame); d > 100*time.Millisecond || d < -100*time.Millisecond {
		t.Fatalf("last seen = %v, want the last frame at %v", p.LastSeen, lastFrame)
	}
	if err := h.s.Heartbeat(h.ctx, "c1"); !errors.Is(err, store.ErrUnknownConn) {
		t.Fatalf("heartbeat of an expired connection: %v, want ErrUnknownConn", err)
	}
}

func testHeartbeatKeepsAlive(t *testing.T, h *harness) {
	h.connect("c1", "bob", "web")
	end := time.Now().Add(TTL * 3)
	for time.Now().Before(end) {
		if err := h.s.Heartbeat(h.ctx, "c1"); err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		h.sweepFor(TTL / 6)
	}
	h.expectHistory(0, "bob=online")
}

func testUnknownConnection(t *testing.T, h *harness) {
	for name, err := range map[string]error{
		"heartbeat":  h.s.Heartbeat(h.ctx, "nope"),
		"status":     h.s.SetStatus(h.ctx, "nope", false),
		"disconnect": h.s.Disconnect(h.ctx, "nope", presence.Closed),
	} {
		if !errors.Is(err, store.ErrUnknownConn) {
			t.Errorf("%s of an unknown connection: %v, want ErrUnknownConn", name, err)
		}
	}
}

func testDuplicateConnection(t *testing.T, h *harness) {
	h.connect("c1", "bob", "web")
	err := h.s.Connect(h.ctx, presence.Conn{ID: "c1", UserID: "eve", Device: "web", Node: "node-a"})
	if !errors.Is(err, store.ErrDuplicateConn) {
		t.Fatalf("duplicate connect: %v, want ErrDuplicateConn", err)
	}
	if p := h.presence("eve"); p.State != presence.Offline {
		t.Fatalf("eve = %+v", p)
	}
}

func testNeverSeenUser(t *testing.T, h *harness) {
	p := h.presence("ghost")
	if p.State != presence.Offline || p.Version != 0 || !p.LastSeen.IsZero() || p.ConnectionCount != 0 {
		t.Fatalf("never seen = %+v", p)
	}
}

func testMembership(t *testing.T, h *harness) {
	for _, m := range [][2]string{{"t1", "bob"}, {"t1", "amy"}, {"t2", "bob"}, {"t1", "bob"}} {
		if err := h.s.AddMember(h.ctx, m[0], m[1]); err != nil {
			t.Fatal(err)
		}
	}
	expectList(t, "teams of bob", must(h.s.TeamsOf(h.ctx, "bob")), "t1", "t2")
	expectList(t, "members of t1", must(h.s.Members(h.ctx, "t1")), "amy", "bob")
	if err := h.s.RemoveMember(h.ctx, "t1", "bob"); err != nil {
		t.Fatal(err)
	}
	if err := h.s.RemoveMember(h.ctx, "t1", "nobody"); err != nil {
		t.Fatal(err)
	}
	expectList(t, "teams of bob", must(h.s.TeamsOf(h.ctx, "bob")), "t2")
	expectList(t, "members of t1", must(h.s.Members(h.ctx, "t1")), "amy")
	expectList(t, "members of t9", must(h.s.Members(h.ctx, "t9")))
}

// testTeamsOfMany: the batched read agrees with TeamsOf, user by user, in
// the order asked, duplicates and users in no team included. The stores of
// this repository implement store.TeamsBatcher; the suite requires it.
func testTeamsOfMany(t *testing.T, h *harness) {
	b, ok := h.s.(store.TeamsBatcher)
	if !ok {
		t.Fatalf("%T does not implement store.TeamsBatcher", h.s)
	}
	got, err := b.TeamsOfMany(h.ctx, nil)
	if err != nil || len(got) != 0 {
		t.Fatalf("no users: %v, %v", got, err)
	}
	var users []string
	for i := range 300 { // past one pipeline's worth of a shard, on a cluster too
		u := fmt.Sprint("u", i)
		users = append(users, u)
		for k := range i % 4 {
			mustDo(t, h.s.AddMember(h.ctx, fmt.Sprint("t", (i+k)%7), u))
		}
	}
	mustDo(t, h.s.RemoveMember(h.ctx, "t3", "u3"))
	users = append(users, "u3", "nobody", "u7")
	got, err = b.TeamsOfMany(h.ctx, users)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(users) {
		t.Fatalf("%d users: %d answers", len(users), len(got))
	}
	for i, u := range users {
		expectList(t, "teams of "+u, got[i], must(h.s.TeamsOf(h.ctx, u))...)
	}
	expectList(t, "teams of u3", got[len(users)-3], "t4", "t5")
	expectList(t, "teams of nobody", got[len(users)-2])
	if got[0] != nil {
		t.Errorf("u0 is in no team: %q, want nil", got[0])
	}
}

func testMembershipEvents(t *testing.T, h *harness) {
	h.connect("c1", "bob", "web")
	mustDo(t, h.s.AddMember(h.ctx, "t1", "bob"))
	mustDo(t, h.s.AddMember(h.ctx, "t1", "bob")) // no second event
	mustDo(t, h.s.AddMember(h.ctx, "t2", "bob"))
	mustDo(t, h.s.RemoveMember(h.ctx, "t1", "bob"))
	checkFor(t, time.Second, func() error {
		v := h.lastVersion("bob")
		h.mu.Lock()
		defer h.mu.Unlock()
		var got []string
		for i, m := range h.memberships {
			got = append(got, fmt.Sprintf("%s %s %v %v %s v%d", m.Team, m.UserID, m.Joined, h.memberTeams[i], m.State, m.Version))
		}
		want := []string{
			fmt.Sprintf("t1 bob true [everyone t1] online v%d", v),
			fmt.Sprintf("t2 bob true [everyone t1 t2] online v%d", v),
			fmt.Sprintf("t1 bob false [everyone t2] online v%d", v),
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("membership events = %q, want %q", got, want)
		}
		return nil
	})
}

// testMembershipEventsOfManyTeams: a membership event of a user in many
// teams (more than a shared store lists in its messages) still tells, while
// it is handled, which teams the user is in, asked one by one or listed.
func testMembershipEventsOfManyTeams(t *testing.T, h *harness) {
	const n = 150
	team := func(i int) string { return fmt.Sprintf("m%03d", i) }
	for i := range n {
		mustDo(t, h.s.AddMember(h.ctx, team(i), "bob"))
	}
	h.mu.Lock()
	h.probe = []string{team(0), team(1), team(n - 1), "nope"}
	h.mu.Unlock()
	mustDo(t, h.s.RemoveMember(h.ctx, team(0), "bob"))
	checkFor(t, 2*time.Second, func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		i := len(h.memberships) - 1
		if i < 0 || h.memberships[i].Team != team(0) || h.memberships[i].Joined || h.probed[i] == nil {
			return fmt.Errorf("no removal event yet (%d events)", len(h.memberships))
		}
		if want := []bool{false, true, true, false}; !slices.Equal(h.probed[i], want) {
			return fmt.Errorf("in %v: %v, want %v", h.probe, h.probed[i], want)
		}
		want := make([]string, 0, n-1)
		for j := 1; j < n; j++ {
			want = append(want, team(j))
		}
		if !slices.Equal(h.memberTeams[i], want) {
			return fmt.Errorf("listed %d teams %v…, want %d", len(h.memberTeams[i]), h.memberTeams[i][:min(3, len(h.memberTeams[i]))], len(want))
		}
		return nil
	})
}

// testConcurrentMembership races an add and a remove of each membership,
// as nodes serving API calls at once would. Afterwards a user's teams and
// the teams' members must agree, every membership event must describe one
// moment (joined exactly when its user's teams name the team), and the last
// event of each membership must tell its final state.
func testConcurrentMembership(t *testing.T, h *harness) {
	concurrentMembership(t, h, h.s, h.s)
}

// concurrentMembership is testConcurrentMembership with the adds made
// through add and the removes through remove (two nodes of a shared store).
func concurrentMembership(t *testing.T, h *harness, add, remove store.Teams) {
	const users, teams, rounds = 10, 3, 10
	user := func(i int) string { return fmt.Sprint("racer", i) }
	team := func(j int) string { return fmt.Sprint("race", j) }
	final := make(map[[2]string]bool) // {user, team} → member
	for r := 0; r < rounds; r++ {
		var wg sync.WaitGroup
		errs := make(chan error, 2*users*teams)
		for i := 0; i < users; i++ {
			for j := 0; j < teams; j++ {
				wg.Add(2)
				go func() { defer wg.Done(); errs <- add.AddMember(h.ctx, team(j), user(i)) }()
				go func() { defer wg.Done(); errs <- remove.RemoveMember(h.ctx, team(j), user(i)) }()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			mustDo(t, err)
		}
		members := make([][]string, teams)
		for j := range members {
			members[j] = must(h.s.Members(h.ctx, team(j)))
		}
		var disagree []string
		for i := 0; i < users; i++ {
			mine := must(h.s.TeamsOf(h.ctx, user(i)))
			for j := 0; j < teams; j++ {
				inUser, inTeam := slices.Contains(mine, team(j)), slices.Contains(members[j], user(i))
				if inUser != inTeam {
					disagree = append(disagree, fmt.Sprintf("%s/%s: teams of user %v, members of team %v",
						user(i), team(j), inUser, inTeam))
				}
				final[[2]string{user(i), team(j)}] = inUser
			}
		}
		if len(disagree) > 0 {
			t.Fatalf("round %d: %d of %d memberships disagree: %q", r, len(disagree), users*teams, disagree)
		}
	}
	checkFor(t, 2*time.Second, func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		last := make(map[[2]string]bool)
		for i, m := range h.memberships {
			if m.Joined != slices.Contains(h.memberTeams[i], m.Team) {
				return fmt.Errorf("event %+v: joined disagrees with the user's teams", m)
			}
			last[[2]string{m.UserID, m.Team}] = m.Joined
		}
		var wrong []string
		for k, member := range final {
			if last[k] != member {
				wrong = append(wrong, fmt.Sprintf("%s/%s: last event joined=%v, member=%v", k[0], k[1], last[k], member))
			}
		}
		if len(wrong) > 0 {
			slices.Sort(wrong)
			return fmt.Errorf("%d memberships' last event is not their state: %q", len(wrong), wrong)
		}
		return nil
	})
}

func testChangeCarriesTeams(t *testing.T, h *harness) {
	mustDo(t, h.s.AddMember(h.ctx, "t2", "bob"))
	mustDo(t, h.s.AddMember(h.ctx, "t1", "bob"))
	h.connect("c1", "bob", "web")
	h.expectHistory(time.Second, "bob=online")
	h.mu.Lock()
	teams := h.teamsOf["bob"]
	h.mu.Unlock()
	expectList(t, "teams on the change", teams, Everyone, "t1", "t2")
}

func testVersionsIncrease(t *testing.T, h *harness) {
	for i := 0; i < 3; i++ {
		id := fmt.Sprint("c", i)
		h.connect(id, "bob", "web")
		h.status(id, false)
		h.disconnect(id)
		h.expectHistory(Grace+time.Second, repeat(i+1, "bob=online", "bob=away", "bob=offline")...)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := 1; i < len(h.changes); i++ {
		if h.changes[i].Version <= h.changes[i-1].Version {
			t.Fatalf("change %d has version %d after %d", i, h.changes[i].Version, h.changes[i-1].Version)
		}
	}
}

// testForgottenAfterForgetAfter: a user offline for forget-after is answered
// as never seen, silently, keeps their teams, and on coming back publishes
// online with a version above the last one they had.
func testForgottenAfterForgetAfter(t *testing.T, h *harness) {
	mustDo(t, h.s.AddMember(h.ctx, "t1", "bob"))
	h.connect("c1", "bob", "web")
	h.status("c1", false)
	left := time.Now()
	h.disconnect("c1")
	h.expectHistory(Grace+time.Second, "bob=online", "bob=away", "bob=offline")
	last := h.lastVersion("bob")
	if p := h.presence("bob"); p.State != presence.Offline || p.Version != last || p.LastSeen.IsZero() {
		t.Fatalf("just offline: %+v, want remembered at version %d", p, last)
	}
	checkFor(t, ForgetAfter+3*time.Second, func() error {
		if err := h.s.Sweep(h.ctx); err != nil {
			return err
		}
		if p := h.presence("bob"); p.Version != 0 || !p.LastSeen.IsZero() {
			return fmt.Errorf("bob = %+v, want as never seen", p)
		}
		return nil
	})
	if d := time.Since(left); d < ForgetAfter {
		t.Fatalf("forgotten %v after leaving, before forget-after (%v)", d, ForgetAfter)
	}
	if p := h.presence("bob"); p.State != presence.Offline || p.ConnectionCount != 0 || len(p.Devices) != 0 {
		t.Fatalf("forgotten = %+v, want as never seen", p)
	}
	if st, ok := h.s.(interface {
		States(context.Context, []string) ([]presence.Presence, error)
	}); ok {
		ps := must(st.States(h.ctx, []string{"bob"}))
		if ps[0].State != presence.Offline || ps[0].Version != 0 {
			t.Fatalf("snapshot state of the forgotten = %+v, want offline, version 0", ps[0])
		}
	}
	h.expectHistory(0, "bob=online", "bob=away", "bob=offline") // forgetting is not a change
	expectList(t, "teams of bob", must(h.s.TeamsOf(h.ctx, "bob")), Everyone, "t1")
	expectList(t, "members of t1", must(h.s.Members(h.ctx, "t1")), "bob")

	h.connect("c2", "bob", "web")
	h.expectHistory(time.Second, "bob=online", "bob=away", "bob=offline", "bob=online")
	if v := h.lastVersion("bob"); v <= last {
		t.Fatalf("back with version %d, not above the forgotten %d", v, last)
	}
	if p := h.presence("bob"); p.State != presence.Online || p.Version != h.lastVersion("bob") {
		t.Fatalf("back: %+v, last change version %d", p, h.lastVersion("bob"))
	}
}

// lastVersion is the version of the last change recorded for user.
// A status: dnd with a text, shown at once, reported to the user's own
// connections, written again to no effect, and ended by a sweep at its
// expiry, once; bad ones refused.
func testUserStatus(t *testing.T, h *harness) {
	h.connect("c1", "bob", "web")
	h.expectHistory(time.Second, "bob=online")
	until := time.UnixMilli(time.Now().Add(4 * Grace).UnixMilli())
	st := presence.Status{Mode: presence.ModeDND, Text: "focus", Emoji: "🎧", ExpiresAt: until}
	h.setUserStatus("bob", st)
	h.expectHistory(time.Second, "bob=online", "bob=dnd")
	sts := h.expectStatuses(time.Second, "bob=dnd:focus")
	h.mu.Lock()
	c := h.changes[1]
	h.mu.Unlock()
	if c.Text != "focus" || c.Emoji != "🎧" || !c.ExpiresAt.Equal(until) || c.Version != sts[0].Version || c.Since.IsZero() {
		t.Fatalf("dnd change = %+v, status %+v", c, sts[0])
	}
	h.setUserStatus("bob", st) // the same: nothing
	p := h.presence("bob")
	if p.State != presence.DND || p.Actual != presence.DND || !p.Status.Equal(st) || p.Version != c.Version {
		t.Fatalf("presence = %+v, want dnd at v%d", p, c.Version)
	}
	if ss := h.s.(store.StatusStore); !errors.Is(ss.SetUserStatus(h.ctx, "bob", presence.Status{Text: string([]byte{0xff})}), presence.ErrBadStatus) {
		t.Fatal("a status with invalid UTF-8 was not refused with ErrBadStatus")
	}
	// Kept alive (a memory store expires silent connections itself) until
	// the expiry has been published.
	for end := until.Add(time.Second); len(h.history()) < 3 && time.Now().Before(end); {
		mustDo(t, h.s.Heartbeat(h.ctx, "c1"))
		h.sweepFor(50 * time.Millisecond)
	}
	h.expectHistory(0, "bob=online", "bob=dnd", "bob=online")
	h.expectStatuses(time.Second, "bob=dnd:focus", "bob=auto:")
	mustDo(t, h.s.Heartbeat(h.ctx, "c1"))
	h.sweepFor(100 * time.Millisecond)
	h.expectHistory(0, "bob=online", "bob=dnd", "bob=online")
	if p := h.presence("bob"); !p.Status.IsZero() || p.Version != h.lastVersion("bob") {
		t.Fatalf("after the expiry: %+v", p)
	}
}

// An offline user's status: dnd changes nothing viewers see but takes a
// version; invisible then a connection shows nothing; back to auto the
// real state.
func testStatusOfAnOfflineUser(t *testing.T, h *harness) {
	mustDo(h.t, h.s.AddMember(h.ctx, Everyone, "bob"))
	h.setUserStatus("bob", presence.Status{Mode: presence.ModeDND})
	sts := h.expectStatuses(time.Second, "bob=dnd:")
	if p := h.presence("bob"); p.State != presence.Offline || p.Version != sts[0].Version {
		t.Fatalf("presence = %+v, want offline at the status's v%d", p, sts[0].Version)
	}
	h.setUserStatus("bob", presence.Status{Mode: presence.ModeInvisible})
	h.connect("c1", "bob", "web")
	h.sweepFor(50 * time.Millisecond)
	h.expectHistory(0)
	if p := h.presence("bob"); p.State != presence.Offline || p.Actual != presence.Online || p.ConnectionCount != 1 {
		t.Fatalf("invisible: %+v", p)
	}
	h.setUserStatus("bob", presence.Status{})
	h.expectHistory(time.Second, "bob=online")
	h.expectStatuses(time.Second, "bob=dnd:", "bob=invisible:", "bob=auto:")
}

// lastChange is the last change recorded of user.
func (h *harness) lastChange(user string) presence.Change {
	h.mu.Lock()
	defer h.mu.Unlock()
	var last presence.Change
	for _, c := range h.changes {
		if c.UserID == user {
			last = c
		}
	}
	return last
}

func (h *harness) lastVersion(user string) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var v uint64
	for _, c := range h.changes {
		if c.UserID == user {
			v = c.Version
		}
	}
	return v
}

func repeat(n int, s ...string) []string {
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, s...)
	}
	return out
}

func expectList(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s = %q, want %q", what, got, want)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// checkFor polls f until it returns nil or d has passed.
var checkFor = testwait.For
