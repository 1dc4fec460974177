package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/memstore"
	"github.com/greendot/greendot/store/redisstore"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// seam runs afterRead once, after a catch-up's Presence read and before
// the caller sees the answer: a test routes a change while the read is in
// flight. beforeMembers runs before every read of a team's members (a
// resync reads them team by team).
type seam struct {
	afterRead     func()
	beforeMembers func(team string)
	afterMembers  func(team string)
}

func (s *seam) membersRead(team string) {
	if f := s.afterMembers; f != nil {
		f(team)
	}
}

func (s *seam) members(team string) {
	if f := s.beforeMembers; f != nil {
		f(team)
	}
}

func (s *seam) fire() {
	if f := s.afterRead; f != nil {
		s.afterRead = nil
		f()
	}
}

type hookedMem struct {
	*memstore.Store
	*seam
}

func (s hookedMem) Presence(ctx context.Context, users []string) ([]presence.Presence, error) {
	ps, err := s.Store.Presence(ctx, users)
	s.fire()
	return ps, err
}

// sharedHooked is hookedMem taken for a shared store: views on.
type sharedHooked struct{ hookedMem }

func (sharedHooked) Watch(context.Context, []string) error { return nil }
func (sharedHooked) Unwatch([]string)                      {}

func (s hookedMem) Members(ctx context.Context, team string) ([]string, error) {
	s.members(team)
	defer s.membersRead(team)
	return s.Store.Members(ctx, team)
}

type hookedRedis struct {
	*redisstore.Store
	*seam
}

func (s hookedRedis) Presence(ctx context.Context, users []string) ([]presence.Presence, error) {
	ps, err := s.Store.Presence(ctx, users)
	s.fire()
	return ps, err
}

// WholePresence is the catch-up's read on Redis (store.LossGuard).
func (s hookedRedis) WholePresence(ctx context.Context, users []string) ([]presence.Presence, error) {
	ps, err := s.Store.WholePresence(ctx, users)
	s.fire()
	return ps, err
}

func (s hookedRedis) Members(ctx context.Context, team string) ([]string, error) {
	s.members(team)
	defer s.membersRead(team)
	return s.Store.Members(ctx, team)
}

// catchUpHub is a hub on each store as the hub runs it: the memory store
// (no views), the memory store taken for a shared one (views on), and
// Redis (views on, its own redis-server). No events reach the hub by
// themselves and no worker runs: tests deliver the events and run the jobs.
func catchUpHub(t *testing.T, kind string, members [][2]string) (*hub, store.Store, *seam, func(user string) *client) {
	t.Helper()
	return catchUpHubWith(t, kind, members, memstore.Config{})
}

// catchUpHubWith is catchUpHub with the memory store configured by memCfg.
func catchUpHubWith(t *testing.T, kind string, members [][2]string, memCfg memstore.Config) (*hub, store.Store, *seam, func(user string) *client) {
	t.Helper()
	ctx := context.Background()
	sm := &seam{}
	s := socketlessServer()
	s.metrics = newMetrics(prometheus.NewRegistry())
	var st store.Store
	switch kind {
	case "memory", "shared":
		mem, err := memstore.New(memCfg)
		if err != nil {
			t.Fatal(err)
		}
		st, s.store = mem, hookedMem{mem, sm}
		if kind == "shared" {
			s.store = sharedHooked{hookedMem{mem, sm}}
		}
	case "redis":
		r := redistest.Start(t)
		rs, err := redisstore.New(ctx, redisstore.Config{URL: r.URL(), Node: "n1", TTL: time.Minute,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rs.Close() })
		st, s.store = rs, hookedRedis{rs, sm}
	}
	s.hub = newHub(s)
	for _, m := range members {
		if err := st.AddMember(ctx, m[0], m[1]); err != nil {
			t.Fatal(err)
		}
	}
	local := func(user string) *client {
		t.Helper()
		c, note := connectLocal(t, s.hub, st, user)
		note()
		return c
	}
	return s.hub, st, sm, local
}

// connectLocal indexes a socketless connection of user, and returns it and
// note, which reads its snapshot and notes it, as a connect does: calling
// note later makes connects that overlap.
func connectLocal(t *testing.T, h *hub, st store.Store, user string) (*client, func()) {
	t.Helper()
	c, teams := addLocal(t, h, user)
	return c, func() {
		t.Helper()
		members, ps := readSnapshot(t, st, teams)
		h.noteSnapshot(c, members, ps)
	}
}

// addLocal indexes a socketless connection of user, and returns it and its
// teams.
func addLocal(t *testing.T, h *hub, user string) (*client, []string) {
	t.Helper()
	c := &client{srv: h.srv, user: user}
	c.closed.Store(true) // no socket: writes are no-ops
	teams, err := h.add(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	return c, teams
}

// readSnapshot reads what a connection in teams is given: the members of
// each, and their presence.
func readSnapshot(t *testing.T, st store.Store, teams []string) (map[string][]string, []presence.Presence) {
	t.Helper()
	ctx := context.Background()
	members := make(map[string][]string)
	var all []string
	for _, team := range teams {
		ms, err := st.Members(ctx, team)
		if err != nil {
			t.Fatal(err)
		}
		members[team] = ms
		all = append(all, ms...)
	}
	ps, err := st.Presence(ctx, all)
	if err != nil {
		t.Fatal(err)
	}
	return members, ps
}

// online connects user on a device and returns their version.
func online(t *testing.T, st store.Store, user string) uint64 {
	t.Helper()
	ctx := context.Background()
	if err := st.Connect(ctx, presence.Conn{ID: "d-" + user, UserID: user, Device: "web"}); err != nil {
		t.Fatal(err)
	}
	ps, err := st.Presence(ctx, []string{user})
	if err != nil {
		t.Fatal(err)
	}
	return ps[0].Version
}

// wire is what a socketless connection was sent: write moves its outbox
// there, as a flush would.
type wire struct {
	c     *client
	sent  []string
	whole []protocol.Change // sent, field by field
}

func (w *wire) write() {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	for _, s := range w.c.order {
		ch := w.c.pending[s]
		w.sent = append(w.sent, fmt.Sprintf("%s=%s@%d", ch.UserID, ch.State, ch.Version))
		w.whole = append(w.whole, ch)
	}
	w.c.pending, w.c.order, w.c.bulk = nil, nil, 0
}

func (w *wire) String() string { return "[" + strings.Join(w.sent, " ") + "]" }

// runJobs runs the worker's queued jobs one at a time, writing the wire
// after each: what one job queued is on the socket before the next runs.
func runJobs(ctx context.Context, h *hub, ws ...*wire) {
	for {
		h.work.mu.Lock()
		jobs := h.work.jobs
		h.work.jobs = nil
		h.work.mu.Unlock()
		if len(jobs) == 0 {
			return
		}
		for _, job := range jobs {
			job(ctx)
			for _, w := range ws {
				w.write()
			}
		}
	}
}

func eachStore(t *testing.T, f func(t *testing.T, kind string)) {
	for _, kind := range []string{"memory", "shared", "redis"} {
		t.Run(kind, func(t *testing.T) { f(t, kind) })
	}
}

// Finding 8: u01, connected in no team, is put back in a and c, which u17
// (online) is in, one membership at a time. Redis's events can list both
// teams already (each read the user's teams when it was published): each
// join's catch-up must not take the other team for the one that showed
// u17. Whatever the events list and however far behind the worker is, u17
// reaches u01 once.
func TestJoinCatchUpOfTwoTeamsSharingATeammate(t *testing.T) {
	eachStore(t, func(t *testing.T, kind string) {
		for _, tc := range []struct {
			name   string
			lists  [2][]string // the teams the events of a and c list
			behind bool        // both events come before the worker runs a job
		}{
			{"restored, worker behind", [2][]string{{"a", "c"}, {"a", "c"}}, true},
			{"restored, worker keeping up", [2][]string{{"a", "c"}, {"a", "c"}}, false},
			{"one by one, worker behind", [2][]string{{"a"}, {"a", "c"}}, true},
			{"one by one, worker keeping up", [2][]string{{"a"}, {"a", "c"}}, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ctx := context.Background()
				h, st, _, local := catchUpHub(t, kind, [][2]string{{"a", "u17"}, {"c", "u17"}})
				v := online(t, st, "u17")
				w, w2 := &wire{c: local("u01")}, &wire{c: local("u01")} // two devices
				for i, team := range []string{"a", "c"} {
					// The store holds at least what the event lists.
					for _, in := range tc.lists[i] {
						if err := st.AddMember(ctx, in, "u01"); err != nil {
							t.Fatal(err)
						}
					}
					if !tc.behind {
						runJobs(ctx, h, w, w2)
					}
					h.OnMembership(store.MembershipEvent{Team: team, UserID: "u01", Joined: true, UserTeams: store.TeamList(tc.lists[i])})
				}
				runJobs(ctx, h, w, w2)
				for _, w := range []*wire{w, w2} {
					if got, want := w.String(), fmt.Sprintf("[u17=online@%d]", v); got != want {
						t.Fatalf("u01 was sent %s, want u17 online once", got)
					}
				}
			})
		}
	})
}

// Finding 9: a joiner's catch-up reads a teammate's state on the worker; a
// newer change of that teammate reaches the joiner (indexed under the team
// already) before the catch-up is queued. The older state must not follow
// the newer one.
func TestJoinCatchUpOlderThanAChangeRoutedMeanwhile(t *testing.T) {
	eachStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, st, sm, local := catchUpHub(t, kind, [][2]string{{"t", "u08"}})
		v := online(t, st, "u08")
		w := &wire{c: local("u14")}
		if err := st.AddMember(ctx, "t", "u14"); err != nil {
			t.Fatal(err)
		}
		sm.afterRead = func() {
			h.OnPresence(store.PresenceEvent{Change: change("u08", presence.Away, v+1), Teams: []string{"t"}, Via: "t"})
			w.write()
		}
		h.OnMembership(store.MembershipEvent{Team: "t", UserID: "u14", Joined: true, UserTeams: store.TeamList{"t"}})
		runJobs(ctx, h, w)
		if got, want := w.String(), fmt.Sprintf("[u08=away@%d]", v+1); got != want {
			t.Fatalf("u14 was sent %s, want only u08's newer change", got)
		}
	})
}

// The other side of finding 8: u17, connected in a and c, is shown u01
// joining both, one membership at a time. When Redis's events list both
// teams already, each event must not take the other team for the one that
// showed u01 to u17: the team's view says what its members were given.
func TestJoinOfATeammateInTwoTeamsReachesTheirViewer(t *testing.T) {
	eachStore(t, func(t *testing.T, kind string) {
		cases := []struct {
			name  string
			lists [2][]string
		}{{"one by one", [2][]string{{"a"}, {"a", "c"}}}}
		if kind != "memory" {
			// The memory store's events list the teams as of each change.
			cases = append(cases, struct {
				name  string
				lists [2][]string
			}{"restored", [2][]string{{"a", "c"}, {"a", "c"}}})
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				ctx := context.Background()
				h, st, _, local := catchUpHub(t, kind, [][2]string{{"a", "u17"}, {"c", "u17"}})
				v := online(t, st, "u01")
				w := &wire{c: local("u17")}
				for i, team := range []string{"a", "c"} {
					for _, in := range tc.lists[i] {
						if err := st.AddMember(ctx, in, "u01"); err != nil {
							t.Fatal(err)
						}
					}
					h.OnMembership(store.MembershipEvent{Team: team, UserID: "u01", Joined: true, State: presence.Online, Version: v,
						UserTeams: store.TeamList(tc.lists[i])})
					w.write()
				}
				runJobs(ctx, h, w)
				if got, want := w.String(), fmt.Sprintf("[u01=online@%d]", v); got != want {
					t.Fatalf("u17 was sent %s, want u01 online once", got)
				}
			})
		}
	})
}

// A join's catch-up leaves out whom the joiner sees through another team;
// the new team's view must still say the joiner holds them. Else, once the
// other team is gone, a teammate's later join elsewhere takes the new team
// for one that never showed them, and sends them again.
func TestJoinCatchUpRecordsWhomTheJoinerSeesAlready(t *testing.T) {
	eachStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, st, _, local := catchUpHub(t, kind, [][2]string{{"a", "u01"}, {"a", "u17"}, {"c", "u17"}, {"x", "u01"}})
		v := online(t, st, "u17")
		w := &wire{c: local("u01")} // its snapshot showed u17
		step := func(team, user string, joined bool, lists ...string) {
			t.Helper()
			var err error
			if joined {
				err = st.AddMember(ctx, team, user)
			} else {
				err = st.RemoveMember(ctx, team, user)
			}
			if err != nil {
				t.Fatal(err)
			}
			h.OnMembership(store.MembershipEvent{Team: team, UserID: user, Joined: joined, State: presence.Online, Version: v,
				UserTeams: store.TeamList(lists)})
			w.write()
			runJobs(ctx, h, w)
		}
		step("c", "u01", true, "a", "c", "x")
		step("a", "u01", false, "c", "x")
		step("x", "u17", true, "a", "c", "x")
		if got := w.String(); got != "[]" {
			t.Fatalf("u01 was sent %s, want nothing: it holds u17 since its snapshot", got)
		}
	})
}

// A viewer indexed under a team it joined, whose catch-up of it has not run
// yet, has not been shown that team's members: a teammate joining another
// team of the viewer's must be shown to it there, or the catch-up, which
// then leaves the teammate out as seen through that other team, never
// shows them.
func TestJoinOfATeammateWhileTheViewersCatchUpIsQueued(t *testing.T) {
	eachStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, st, _, local := catchUpHub(t, kind, [][2]string{{"t", "u01"}, {"o", "u17"}, {"o", "u05"}})
		v := online(t, st, "u17")
		local("u05") // o's view holds u17
		w := &wire{c: local("u01")}
		if err := st.AddMember(ctx, "o", "u01"); err != nil {
			t.Fatal(err)
		}
		h.OnMembership(store.MembershipEvent{Team: "o", UserID: "u01", Joined: true, UserTeams: store.TeamList{"o", "t"}})
		// The worker indexes u01 under o; its catch-up is still queued.
		h.work.mu.Lock()
		index := h.work.jobs[0]
		h.work.jobs = h.work.jobs[1:]
		h.work.mu.Unlock()
		index(ctx)
		if got := h.teamsOf("u01"); len(got) != 2 {
			t.Fatalf("u01 indexed under %v, want o and t", got)
		}
		if err := st.AddMember(ctx, "t", "u17"); err != nil {
			t.Fatal(err)
		}
		h.OnMembership(store.MembershipEvent{Team: "t", UserID: "u17", Joined: true, State: presence.Online, Version: v,
			UserTeams: store.TeamList{"o", "t"}})
		w.write()
		runJobs(ctx, h, w)
		if got, want := w.String(), fmt.Sprintf("[u17=online@%d]", v); got != want {
			t.Fatalf("u01 was sent %s, want u17 online once", got)
		}
	})
}

// A join handled while Redis has lost its data and the nodes have not
// written their connections back: the catch-up read u17, live, as offline
// at version 0 and sent nothing, and the team's view then counted u01 as
// holding what t's other viewer held, so no resync would send it either.
// The catch-up waits out the recovery and sends u17 online.
func TestJoinCatchUpDuringADataLossWaitsForTheStateWrittenBack(t *testing.T) {
	ctx := context.Background()
	url, flush := redistest.StartTopology(t, "redis")
	rs, err := redisstore.New(ctx, redisstore.Config{URL: url, Node: "n1", TTL: time.Minute,
		NodeTTL: 600 * time.Millisecond, HoldOff: 1500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Close() })
	s := socketlessServer()
	s.metrics = newMetrics(prometheus.NewRegistry())
	s.stop = make(chan struct{})
	s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	s.store = rs
	s.hub = newHub(s)
	// The sweeps a server runs (its sweeper): they find the loss, and end
	// its hold-off.
	var sweeps sync.WaitGroup
	sweeps.Add(1)
	go func() {
		defer sweeps.Done()
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(50 * time.Millisecond):
				_ = rs.Sweep(ctx)
			}
		}
	}()
	t.Cleanup(func() { close(s.stop); sweeps.Wait() })
	for _, m := range [][2]string{{"t", "u17"}, {"t", "viewer"}, {"x", "u01"}} {
		if err := rs.AddMember(ctx, m[0], m[1]); err != nil {
			t.Fatal(err)
		}
	}
	online(t, rs, "u17")
	local := func(user string) *wire {
		c := &client{srv: s, user: user}
		c.closed.Store(true)
		teams, err := s.hub.add(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		members := make(map[string][]string)
		var all []string
		for _, team := range teams {
			ms, err := rs.Members(ctx, team)
			if err != nil {
				t.Fatal(err)
			}
			members[team], all = ms, append(all, ms...)
		}
		ps, err := rs.Presence(ctx, all)
		if err != nil {
			t.Fatal(err)
		}
		s.hub.noteSnapshot(c, members, ps)
		return &wire{c: c}
	}
	viewer, w := local("viewer"), local("u01")

	flush()
	// The memberships come back (from an AOF in production) and u01 joins
	// t; the join's own event waits for the recovery, so it is cut short
	// here and delivered by hand below.
	for _, m := range [][2]string{{"t", "u17"}, {"t", "viewer"}, {"x", "u01"}, {"t", "u01"}} {
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_ = rs.AddMember(short, m[0], m[1])
		cancel()
	}
	if got, err := rs.Members(ctx, "t"); err != nil || len(got) != 3 {
		t.Fatalf("members of t after the restore: %v %v", got, err)
	}
	s.hub.OnMembership(store.MembershipEvent{Team: "t", UserID: "u01", Joined: true, UserTeams: store.TeamList([]string{"t", "x"})})
	runJobs(ctx, s.hub, viewer, w)
	if len(w.sent) != 1 || !strings.HasPrefix(w.sent[0], "u17=online@") {
		t.Fatalf("u01 was sent %s, want u17 online: u17's device never left", w)
	}
}

// Chaos seed 786074653 (one Redis): after an empty restart a viewer saw
// u04 again through a second team and was told offline above what it held
// (the store read u04 as never seen, version 0). u04 left that team too and
// came back to the first: the second team's view held version 0, so the
// removal hid u04 at 0, and the next catch-up sent offline at version 0,
// below what the client held.
func TestSeenAgainTwiceAfterADataLossStaysNewer(t *testing.T) {
	for _, kind := range []string{"shared", "redis"} {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			h, st, _, local := catchUpHub(t, kind, [][2]string{{"t0", "viewer"}, {"t0", "u04"}, {"t3", "viewer"}})
			v := online(t, st, "u04")
			w := &wire{c: local("viewer")}
			move := func(team string, joined bool, teams ...string) {
				t.Helper()
				var err error
				if joined {
					err = st.AddMember(ctx, team, "u04")
				} else {
					err = st.RemoveMember(ctx, team, "u04")
				}
				if err != nil {
					t.Fatal(err)
				}
				// Read as the store reads a user after losing its data.
				h.OnMembership(store.MembershipEvent{Team: team, UserID: "u04", Joined: joined,
					State: presence.Offline, Version: 0, UserTeams: store.TeamList(teams)})
				w.write()
				runJobs(ctx, h, w)
			}
			move("t0", false)
			move("t3", true, "t3")
			move("t3", false)
			move("t0", true, "t0")
			want := fmt.Sprintf("[u04=offline@%d u04=offline@%d]", v+1, v+2)
			if got := w.String(); got != want {
				t.Fatalf("viewer was sent %s, want %s: each newer than the last", got, want)
			}
		})
	}
}

// Chaos seed 245067116 (one Redis): u21 connected while u13's join to t1
// was written and not yet heard; its snapshot read u13. The join's event
// then pushed u13 to every t1 member who could not see u13 before, u21 too:
// the same version twice. It goes to those whose hold differs.
func TestJoinEventSkipsAViewerWhoseSnapshotHoldsTheJoiner(t *testing.T) {
	for _, kind := range []string{"shared", "redis"} {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			h, st, _, local := catchUpHub(t, kind, [][2]string{{"t1", "u21"}, {"t1", "u30"}, {"t0", "u13"}})
			v := online(t, st, "u13")
			before := &wire{c: local("u30")} // connected before the join: sees no u13
			if err := st.AddMember(ctx, "t1", "u13"); err != nil {
				t.Fatal(err)
			}
			after := &wire{c: local("u21")} // its snapshot reads u13
			h.OnMembership(store.MembershipEvent{Team: "t1", UserID: "u13", Joined: true,
				State: presence.Online, Version: v, UserTeams: store.TeamList([]string{"t0", "t1"})})
			before.write()
			after.write()
			runJobs(ctx, h, before, after)
			want := fmt.Sprintf("[u13=online@%d]", v)
			if got := before.String(); got != want {
				t.Errorf("u30 was sent %s, want %s", got, want)
			}
			if got := after.String(); got != "[]" {
				t.Errorf("u21, whose snapshot holds u13 at v%d, was sent %s, want nothing", v, got)
			}
		})
	}
}

// Chaos seed 4120 (one Redis): after a FLUSHALL the memberships were
// written back, and Redis published each as a join. alice, in t here since
// her snapshot showed bob, must not be sent bob again by that join.
func TestJoinOfATeamTheJoinerIsInAlreadySendsNothing(t *testing.T) {
	eachStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, st, _, local := catchUpHub(t, kind, [][2]string{{"t", "alice"}, {"t", "bob"}})
		online(t, st, "bob")
		w := &wire{c: local("alice")}
		h.OnMembership(store.MembershipEvent{Team: "t", UserID: "alice", Joined: true, UserTeams: store.TeamList{"t"}})
		runJobs(ctx, h, w)
		if got := w.String(); got != "[]" {
			t.Fatalf("alice was sent %s, want nothing: her snapshot showed bob", got)
		}
	})
}

// The other side: a Pusher subscription indexes alice under t before its
// join event comes (ensureIndexed). Her native connection was not given
// t's members: the event must still send her bob, once.
func TestJoinIndexedBeforeItsEventStillCatchesUp(t *testing.T) {
	eachStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, st, _, local := catchUpHub(t, kind, [][2]string{{"t", "bob"}})
		v := online(t, st, "bob")
		w := &wire{c: local("alice")}
		if err := st.AddMember(ctx, "t", "alice"); err != nil {
			t.Fatal(err)
		}
		h.ensureIndexed(ctx, "alice", "t")
		h.OnMembership(store.MembershipEvent{Team: "t", UserID: "alice", Joined: true, UserTeams: store.TeamList{"t"}})
		runJobs(ctx, h, w)
		// A second join of t (written back after a FLUSHALL) is no news.
		h.OnMembership(store.MembershipEvent{Team: "t", UserID: "alice", Joined: true, UserTeams: store.TeamList{"t"}})
		runJobs(ctx, h, w)
		if got, want := w.String(), fmt.Sprintf("[bob=online@%d]", v); got != want {
			t.Fatalf("alice was sent %s, want bob online once", got)
		}
	})
}

// A connection whose snapshot lacks a teammate the team's view holds (Redis
// lost bob's membership of t, and alice's second device connected before it
// was written back) must be sent bob when his membership is back: the view
// says t's members hold him, but this one does not.
func TestSnapshotLackingATeammateTheViewHoldsGetsThemOnTheirJoin(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		h, st, _, local := catchUpHub(t, kind, [][2]string{{"t", "alice"}, {"t", "bob"}})
		v := online(t, st, "bob")
		w1 := &wire{c: local("alice")}
		if err := st.RemoveMember(ctx, "t", "bob"); err != nil { // lost: no event
			t.Fatal(err)
		}
		w2 := &wire{c: local("alice")}
		if err := st.AddMember(ctx, "t", "bob"); err != nil {
			t.Fatal(err)
		}
		h.OnMembership(store.MembershipEvent{Team: "t", UserID: "bob", Joined: true, UserTeams: store.TeamList{"t"},
			State: presence.Online, Version: v})
		runJobs(ctx, h, w1, w2)
		w1.write()
		w2.write()
		if got := w1.String(); got != "[]" {
			t.Errorf("alice's first device was sent %s, want nothing: its snapshot showed bob", got)
		}
		if got, want := w2.String(), fmt.Sprintf("[bob=online@%d]", v); got != want {
			t.Errorf("alice's second device was sent %s, want bob online", got)
		}
	})
}
