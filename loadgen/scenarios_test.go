package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/server"
	"github.com/greendot/greendot/store/memstore"
)

// Short deadlines keep every scenario to a few seconds.
const (
	testTTL       = 1200 * time.Millisecond
	testHeartbeat = 300 * time.Millisecond
	testGrace     = 400 * time.Millisecond
)

// startServer runs a memory-store greendot node on a free port of
// 127.0.0.1 until the test ends, and returns its ws:// base URL.
func startServer(t *testing.T, mutate ...func(*server.Config)) string {
	t.Helper()
	st, err := memstore.New(memstore.Config{TTL: testTTL, Grace: testGrace})
	if err != nil {
		t.Fatal(err)
	}
	cfg := server.Config{
		Addr:              "127.0.0.1:0",
		Store:             st,
		TTL:               testTTL,
		HeartbeatInterval: testHeartbeat,
		Grace:             testGrace,
		DrainSpread:       100 * time.Millisecond,
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for _, f := range mutate {
		f(&cfg)
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return "ws://" + srv.Addr()
}

// runScenario runs one scenario at a tiny size against a fresh server and
// returns its result, failing the test on error.
func runScenario(t *testing.T, scenario string, o Options) *Result {
	t.Helper()
	if len(o.Targets) == 0 {
		o.Targets = []string{startServer(t)}
	}
	o.TeamSize = 10
	o.Grace = testGrace
	o.Samplers = 2
	o.MaxTime = time.Minute
	var progress bytes.Buffer
	o.Progress = &progress
	res, err := Run(context.Background(), scenario, o)
	if err != nil {
		t.Fatalf("%s: %v\nprogress:\n%s", scenario, err, progress.String())
	}
	var table bytes.Buffer
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", table.String())
	if err := res.WriteJSON(io.Discard); err != nil {
		t.Fatal(err)
	}
	if got := fig(t, res, "connected"); got != float64(o.N) {
		t.Errorf("connected %v of %d", got, o.N)
	}
	return res
}

// fig returns a figure's value; it must exist and be a number.
func fig(t *testing.T, r *Result, key string) float64 {
	t.Helper()
	f, ok := r.Figure(key)
	if !ok {
		t.Fatalf("%s: no figure %q", r.Scenario, key)
	}
	if math.IsNaN(f.Value) || math.IsInf(f.Value, 0) {
		t.Fatalf("%s: %s = %v", r.Scenario, key, f.Value)
	}
	return f.Value
}

func expectPositive(t *testing.T, r *Result, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if v := fig(t, r, k); v <= 0 {
			t.Errorf("%s: %s = %v, want > 0", r.Scenario, k, v)
		}
	}
}

func expectZero(t *testing.T, r *Result, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if v := fig(t, r, k); v != 0 {
			t.Errorf("%s: %s = %v, want 0", r.Scenario, k, v)
		}
	}
}

// Each scenario runs once, at a tiny size, so that the tool cannot rot. No
// figure is held to a timing target here: only to being measured, and the
// correctness ones to zero.

func TestScenarioIdle(t *testing.T) {
	r := runScenario(t, "idle", Options{N: 20, Duration: time.Second})
	expectPositive(t, r, "connect_rate", "connect_p99_ms", "heartbeats_per_s", "server_goroutines", "server_rss_mib")
	fig(t, r, "rss_per_conn_kib")
	fig(t, r, "cpu_us_per_conn_minute")
	expectZero(t, r, "hold_changes", "hold_expirations", "hold_changes_received")
}

// With --sample-every, most users are light sockets: their heartbeats keep
// them alive through a hold of several ttls, and the sampled viewers' dots
// of them are checked and right.
func TestScenarioIdleSampled(t *testing.T) {
	r := runScenario(t, "idle", Options{N: 30, SampleEvery: 5, Duration: 3 * testTTL})
	expectPositive(t, r, "connect_rate", "heartbeats_per_s", "dots_checked")
	expectZero(t, r, "hold_changes", "hold_expirations", "hold_changes_received", "dots_wrong", "light_dropped")
	// 6 viewers (users 0, 5, …, 25) in teams of 10, each checking its 9 team-mates.
	if got := fig(t, r, "dots_checked"); got != 54 {
		t.Errorf("dots_checked %v, want 54", got)
	}
}

// The check finds a viewer's dot that does not match a team-mate's socket,
// and a light socket the run closes is down without counting as dropped.
// (That light sockets' heartbeats keep them alive is TestScenarioIdleSampled's
// hold of three ttls.)
func TestLightSocket(t *testing.T) {
	target := startServer(t)
	o, err := Options{Targets: []string{target}, RunID: "lt", N: 2, SampleEvery: 1}.withDefaults("idle")
	if err != nil {
		t.Fatal(err)
	}
	o.Grace = testGrace
	env := newEnv(&o, 0, 1)
	defer env.dial.closeIdle()
	ctx := context.Background()
	// Users in no team: the viewer must see nobody, whatever the sockets do.
	light := &member{idx: 1, user: "lt-light", device: "web"}
	viewer := &member{idx: 0, user: "lt-viewer", device: "web"}
	s, err := env.dial.dialLight(ctx, light)
	if err != nil {
		t.Fatal(err)
	}
	light.lt = s
	c, err := env.dial.dial(ctx, viewer, env.dial.options(viewer))
	if err != nil {
		t.Fatal(err)
	}
	viewer.c = c
	w := &idleWorker{env: env, ms: []*member{viewer, light}}
	defer closeAll(w.ms)
	testwait.For(t, 5*time.Second, func() error {
		if !viewer.up.Load() || !light.up.Load() {
			return errors.New("not both up")
		}
		return nil
	})
	// A team-mate of the light socket comes online: the socket counts one
	// change from the presence frame it does not decode.
	for _, u := range []string{"lt-light", "lt-mate"} {
		req, _ := http.NewRequest("PUT", strings.Replace(target, "ws://", "http://", 1)+"/v1/teams/lt-t/members/"+u, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("PUT member %s: %s", u, resp.Status)
		}
	}
	mate := &member{idx: 2, user: "lt-mate", device: "web"}
	if mate.c, err = env.dial.dial(ctx, mate, env.dial.options(mate)); err != nil {
		t.Fatal(err)
	}
	defer closeAll([]*member{mate})
	testwait.For(t, 5*time.Second, func() error {
		if n := env.ctr.changes.Load(); n != 1 {
			return fmt.Errorf("the light socket counted %d changes, want 1", n)
		}
		return nil
	})
	if r := w.check(); r.Checked != 1 || r.Wrong != 1 || !strings.Contains(r.First, "lt-viewer shows lt-light offline, want online") {
		t.Errorf("check of a viewer who cannot see its team-mate: %+v, want 1 wrong", r)
	}
	if err := s.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	light.lt = nil
	if up, at := s.up(); up || at.IsZero() || env.ctr.progress().Drops != 0 {
		t.Errorf("after Close: up %v at %v, %+v; want down, and no drop (the run closed it)", up, at, env.ctr.progress())
	}
}

func TestScenarioHeartbeat(t *testing.T) {
	r := runScenario(t, "heartbeat", Options{N: 20, Rate: 100, Duration: time.Second})
	expectPositive(t, r, "heartbeats_per_s", "ack_p50_ms", "ack_max_ms")
	fig(t, r, "cpu_us_per_heartbeat")
	expectZero(t, r, "ack_timeouts")
}

func TestScenarioFanout(t *testing.T) {
	r := runScenario(t, "fanout", Options{N: 10, Rounds: 2})
	if got := fig(t, r, "rounds"); got != 2 {
		t.Errorf("rounds = %v", got)
	}
	if got, want := fig(t, r, "deliveries_received"), fig(t, r, "deliveries_expected"); got != want || want != 40 {
		t.Errorf("received %v of %v subject changes, want 40", got, want)
	}
	// The grace lag is measured only if the server counted each offline.
	expectPositive(t, r, "online_p50_ms", "online_max_ms", "offline_max_ms", "server_grace_lag_p99_ms")
	expectZero(t, r, "deliveries_missing", "deliveries_spurious")
}

// A fan-out team over the server's --large-team reaches no viewer: the run
// says so instead of reporting every change missing.
func TestScenarioFanoutRefusesALargeTeam(t *testing.T) {
	o := Options{N: 10, Rounds: 2, Targets: []string{startServer(t, func(c *server.Config) { c.LargeTeam = 5 })},
		TeamSize: 10, Grace: testGrace, Samplers: 2, MaxTime: time.Minute, Progress: io.Discard}
	_, err := Run(context.Background(), "fanout", o)
	if err == nil || !strings.Contains(err.Error(), "--large-team 11") {
		t.Fatalf("err = %v, want one naming --large-team 11", err)
	}
}

func TestScenarioChurn(t *testing.T) {
	r := runScenario(t, "churn", Options{N: 40, Rate: 25, Duration: 2 * time.Second})
	expectPositive(t, r, "actions_flap", "actions_bounce", "actions_leave", "deliveries_per_s",
		"server_deliveries_per_s", "real_transitions", "grace_cancellations")
	fig(t, r, "cpu_ms_per_1000_deliveries")
	expectZero(t, r, "spurious_deliveries", "spurious_transitions", "missing_transitions")
	if real, pub := fig(t, r, "real_transitions"), fig(t, r, "published_transitions"); pub < real {
		t.Errorf("published %v transitions, fewer than the %v caused", pub, real)
	}
}

func TestScenarioExpiry(t *testing.T) {
	r := runScenario(t, "expiry", Options{N: 20, Window: 300 * time.Millisecond})
	if got := fig(t, r, "subjects_frozen"); got != 10 {
		t.Errorf("frozen %v subjects, want 10", got)
	}
	if got := fig(t, r, "offlines_expected"); got != 50 { // 2 teams × 5 viewers × 5 subjects
		t.Errorf("expected %v offline deliveries, want 50", got)
	}
	if got := fig(t, r, "ttl_ms"); got != float64(testTTL.Milliseconds()) {
		t.Errorf("ttl = %v", got)
	}
	fig(t, r, "lag_p99_ms")
	expectPositive(t, r, "lag_max_ms")
	expectZero(t, r, "offlines_missing", "offlines_unexpected", "offlines_early", "offlines_duplicate", "viewer_drops", "offlines_from_snapshot")
}

func TestScenarioStorm(t *testing.T) {
	r := runScenario(t, "storm", Options{N: 20, Window: 300 * time.Millisecond})
	if got := fig(t, r, "reconnected"); got != 20 {
		t.Errorf("%v back, want 20", got)
	}
	expectPositive(t, r, "back_max_ms", "settle_ms", "ack_max_ms", "back_within_grace", "grace_cancellations")
	expectZero(t, r, "not_back", "changes_within_grace", "ack_timeouts")
}

// Several worker processes, here goroutines speaking the same protocol
// over pipes, hold whole teams each and add up to the same figures.
func TestScenarioAcrossWorkers(t *testing.T) {
	r := runScenario(t, "churn", Options{N: 60, Rate: 25, Duration: 2 * time.Second, Procs: 3, pipeWorkers: true})
	expectPositive(t, r, "actions_leave", "deliveries_per_s", "real_transitions")
	expectZero(t, r, "spurious_deliveries", "spurious_transitions", "missing_transitions")
}

func TestScenarioLargeTeam(t *testing.T) {
	target := startServer(t, func(c *server.Config) { c.LargeTeam = 50 })
	r := runScenario(t, "largeteam", Options{Targets: []string{target}, N: 20, Rounds: 5, OfflineMembers: 30})
	if got := fig(t, r, "team_size"); got != 20+2*largeWatched+1+30 {
		t.Errorf("team_size = %v", got)
	}
	if got := fig(t, r, "team_online"); got != 20+2*largeWatched+1 {
		t.Errorf("team_online = %v, want the %d connected, the viewer included (the offline members are not)", got, 20+2*largeWatched+1)
	}
	if got := fig(t, r, "watch_online"); got != largeWatched {
		t.Errorf("watch_online = %v", got)
	}
	// Each change goes to its watcher alone: the unwatched one to nobody.
	if got := fig(t, r, "fanout_per_change"); got > 1 {
		t.Errorf("fanout_per_change = %v, want at most 1", got)
	}
	expectPositive(t, r, "change_p50_ms", "viewer_connect_ms", "watch_result_ms")
	// Heap deltas are reported but not signed: at 20 members a GC between
	// the two scrapes frees more garbage than the members hold, so the
	// delta can go below zero (it did once in CI: -5,224 B).
	fig(t, r, "heap_per_member_b")
	fig(t, r, "heap_per_membership_b")
	expectZero(t, r, "viewer_snapshot_users", "missing", "spurious")
}

// The Pusher side: the same scenarios over Pusher protocol 7 sockets.

const (
	testPusherKey    = "bench-key"
	testPusherSecret = "bench-secret"
)

func startPusherServer(t *testing.T) string {
	t.Helper()
	return startServer(t, func(c *server.Config) {
		c.Pusher = server.PusherConfig{AppID: "1", Key: testPusherKey, Secret: testPusherSecret}
	})
}

func pusherOptions(o Options) Options {
	o.Protocol, o.PusherKey, o.PusherSecret = protoPusher, testPusherKey, testPusherSecret
	return o
}

func TestScenarioIdlePusher(t *testing.T) {
	r := runScenario(t, "idle", pusherOptions(Options{Targets: []string{startPusherServer(t)}, N: 20, Duration: time.Second}))
	expectPositive(t, r, "connect_rate", "connect_p99_ms", "heartbeats_per_s", "server_goroutines", "server_rss_mib")
	fig(t, r, "rss_per_conn_kib")
	fig(t, r, "cpu_us_per_conn_minute")
	expectZero(t, r, "pusher_dropped")
	if p := r.Params["protocol"]; p != protoPusher {
		t.Errorf("protocol = %v", p)
	}
}

func TestScenarioFanoutPusher(t *testing.T) {
	r := runScenario(t, "fanout", pusherOptions(Options{Targets: []string{startPusherServer(t)}, N: 10, Rounds: 2}))
	if got := fig(t, r, "rounds"); got != 2 {
		t.Errorf("rounds = %v", got)
	}
	// One member_added and one member_removed per viewer per round.
	if got, want := fig(t, r, "deliveries_received"), fig(t, r, "deliveries_expected"); got != want || want != 40 {
		t.Errorf("received %v of %v member events of the subject, want 40", got, want)
	}
	expectPositive(t, r, "online_p50_ms", "online_max_ms", "offline_max_ms")
	expectZero(t, r, "deliveries_missing", "deliveries_spurious", "pusher_errors", "pusher_subscription_errors", "pusher_dropped")
	if _, ok := r.Figure("online_from_transition_p50_ms"); ok {
		t.Error("a Pusher run reports a server-time figure its frames do not carry")
	}
}

// A Pusher socket of the run reads the subscription's member list and
// each member event of its channel, and a refused subscription is an error
// that no retry hides.
func TestPusherSocket(t *testing.T) {
	target := startPusherServer(t)
	o, err := pusherOptions(Options{Targets: []string{target}, RunID: "px"}).withDefaults("idle")
	if err != nil {
		t.Fatal(err)
	}
	ctr := &counters{}
	dl := newDialer(&o, ctr)
	defer dl.closeIdle()
	ctx := context.Background()
	events := make(chan pxMemberEvent, 16)
	a, err := dl.dialPusher(ctx, &member{user: "alice"}, "presence-t", pxEvents{onMember: func(e pxMemberEvent) { events <- e }})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.members != 1 || a.socketID == "" {
		t.Fatalf("alice's subscription: %d members, socket %q", a.members, a.socketID)
	}
	b, err := dl.dialPusher(ctx, &member{user: "bob"}, "presence-t", pxEvents{})
	if err != nil {
		t.Fatal(err)
	}
	if b.members != 2 {
		t.Errorf("bob's subscription lists %d members, want 2", b.members)
	}
	expectMemberEvent(t, events, true, "bob")
	if err := b.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	expectMemberEvent(t, events, false, "bob") // after the grace
	if got := ctr.conns.Load(); got != 1 {
		t.Errorf("%d sockets counted up, want 1", got)
	}
	if p := ctr.progress(); p.Drops != 0 {
		t.Errorf("a socket the run closed counts as dropped: %+v", p)
	}

	bad := o
	bad.PusherSecret = "wrong"
	_, err = newDialer(&bad, ctr).dialPusher(ctx, &member{user: "mallory"}, "presence-t", pxEvents{})
	var refused *pxRefusedError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "AuthError") {
		t.Fatalf("a wrong secret: err = %v, want a refused AuthError", err)
	}
	if got, want := ctr.dials.Load(), int64(2); got != want {
		t.Errorf("%d dials counted, want %d", got, want)
	}
	if got := ctr.dialErrs.Load(); got != 1 {
		t.Errorf("%d dial errors counted, want 1", got)
	}
}

// A socket the server ends is a drop, with the server's reason; one the
// run closes is not.
func TestPusherSocketDropped(t *testing.T) {
	st, err := memstore.New(memstore.Config{TTL: testTTL, Grace: testGrace})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Addr: "127.0.0.1:0", Store: st, TTL: testTTL, HeartbeatInterval: testHeartbeat,
		Grace: testGrace, DrainSpread: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Pusher: server.PusherConfig{AppID: "1", Key: testPusherKey, Secret: testPusherSecret}})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	o, err := pusherOptions(Options{Targets: []string{"ws://" + srv.Addr()}, RunID: "px"}).withDefaults("idle")
	if err != nil {
		t.Fatal(err)
	}
	ctr := &counters{}
	dl := newDialer(&o, ctr)
	defer dl.closeIdle()
	down := make(chan struct{})
	s, err := dl.dialPusher(context.Background(), &member{user: "alice"}, "presence-t", pxEvents{onDown: func() { close(down) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	select {
	case <-down:
	case <-ctx.Done():
		t.Fatal("the socket did not end when its server shut down")
	}
	_ = s.Close()
	p := ctr.progress()
	if p.Drops != 1 || !strings.Contains(p.DropReason, "close frame") || p.Conns != 0 {
		t.Errorf("after the server's shutdown: %+v, want 1 drop with the server's close frame and no socket up", p)
	}
}

func expectMemberEvent(t *testing.T, events <-chan pxMemberEvent, added bool, user string) {
	t.Helper()
	select {
	case e := <-events:
		if e.Added != added || e.UserID != user || e.Received.IsZero() {
			t.Fatalf("member event %+v, want added=%v of %s", e, added, user)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no member event (added=%v) of %s", added, user)
	}
}

// --peer drives a Pusher server as if it were not greendot: no team setup,
// no /metrics; CPU and RSS come from /proc (here the test process, which
// holds the server), and the figures only greendot's metrics give are
// absent rather than 0.
func TestScenarioIdlePeer(t *testing.T) {
	o := pusherOptions(Options{Targets: []string{startPusherServer(t)}, N: 20, Duration: time.Second, Peer: true, ServerPIDs: []int{os.Getpid()}})
	r := runScenario(t, "idle", o)
	expectPositive(t, r, "connect_rate", "server_rss_mib")
	fig(t, r, "rss_per_conn_kib")
	fig(t, r, "cpu_us_per_conn_minute")
	expectZero(t, r, "pusher_dropped")
	for _, k := range []string{"heap_per_conn_kib", "server_goroutines", "heartbeats_per_s", "hold_changes", "server_heap_mib", "rss_per_conn_with_teams_kib"} {
		if _, ok := r.Figure(k); ok {
			t.Errorf("a peer run reports %s, which only greendot's /metrics gives", k)
		}
	}
	if r.Params["peer"] != true {
		t.Errorf("params = %v, want peer", r.Params)
	}
}

func TestScenarioFanoutPeer(t *testing.T) {
	o := pusherOptions(Options{Targets: []string{startPusherServer(t)}, N: 10, Rounds: 2, Peer: true})
	r := runScenario(t, "fanout", o)
	if got, want := fig(t, r, "deliveries_received"), fig(t, r, "deliveries_expected"); got != want || want != 40 {
		t.Errorf("received %v of %v member events of the subject, want 40", got, want)
	}
	expectZero(t, r, "deliveries_missing", "deliveries_spurious", "pusher_errors", "pusher_dropped")
	for _, k := range []string{"pusher_subscription_errors", "server_cpu_s", "server_rss_mib"} {
		if _, ok := r.Figure(k); ok {
			t.Errorf("a peer run without --server-pid reports %s", k)
		}
	}
}
