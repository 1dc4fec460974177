package redisstore

// Faults a shared store must survive, each against real redis-server
// processes: data loss, stalls, failed writes, lost script caches, races
// between re-assertion and closes, a node restarted under the same id.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

type rec struct {
	mu   sync.Mutex
	ch   []presence.Change
	lag  []time.Duration
	glag []time.Duration
	mem  []string
}

func (r *rec) OnPresence(ev store.PresenceEvent) {
	if ev.Via != "" && (len(ev.Teams) == 0 || ev.Via != ev.Teams[0]) {
		return
	}
	r.mu.Lock()
	r.ch = append(r.ch, ev.Change)
	r.mu.Unlock()
}
func (r *rec) OnMembership(ev store.MembershipEvent) {
	r.mu.Lock()
	r.mem = append(r.mem, fmt.Sprintf("%s %s %v", ev.Team, ev.UserID, ev.Joined))
	r.mu.Unlock()
}
func (r *rec) ObserveOutcome(_ string, out presence.Outcome, _ time.Duration) {
	r.mu.Lock()
	r.lag = append(r.lag, out.ExpiryLag...)
	r.glag = append(r.glag, out.GraceLag...)
	r.mu.Unlock()
}
func (r *rec) hist() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, c := range r.ch {
		out = append(out, fmt.Sprintf("%s=%s", c.UserID, c.State))
	}
	return out
}

func logger() *slog.Logger {
	if os.Getenv("REVIEW_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func mk(t *testing.T, url, node string, ttl, grace time.Duration) (*Store, *rec) {
	t.Helper()
	return mkWith(t, Config{URL: url, Node: node, TTL: ttl, Grace: grace,
		NodeTTL: 600 * time.Millisecond, HoldOff: 300 * time.Millisecond})
}

// mkWith starts a store with cfg (its logger set here), recording what it
// publishes on team "t".
func mkWith(t *testing.T, cfg Config) (*Store, *rec) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg.Logger = logger()
	s, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &rec{}
	s.Subscribe(r)
	s.SetObserver(r)
	if err := s.Watch(ctx, []string{"t"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, r
}

// kill9 stops a store like kill -9 would: no leaving beat, no flush.
func kill9(s *Store) {
	s.closed.Store(true)
	close(s.stop)
	s.wg.Wait()
	s.subs.close()
	_ = s.rdb.Close()
}

func sweepFor(t *testing.T, s *Store, d time.Duration) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		_ = s.Sweep(context.Background())
		time.Sleep(50 * time.Millisecond)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func waitHist(t *testing.T, r *rec, d time.Duration, s *Store, want string) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if strings.Join(r.hist(), " ") == want {
			return
		}
		if s != nil {
			_ = s.Sweep(context.Background())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("history %v, want %q", r.hist(), want)
}

// flushKeepingMembership runs FLUSHALL but keeps team's membership of users,
// as Redis restarted from an AOF that holds the memberships and not the
// presence keys would: the membership comes back as data, with no join.
func flushKeepingMembership(t *testing.T, r *redistest.Server, team string, users ...string) {
	t.Helper()
	keys := []string{teamKey(team), teamMVKey(team)}
	for _, u := range users {
		keys = append(keys, userTeamsKey(u), userMVKey(u))
	}
	dumps := make([]string, len(keys))
	for i, k := range keys {
		d, err := r.Do("DUMP", k)
		if err != nil || d == "" {
			t.Fatalf("dump %s: %q, %v", k, d, err)
		}
		dumps[i] = d
	}
	if _, err := r.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if _, err := r.Do("RESTORE", k, "0", dumps[i]); err != nil {
			t.Fatalf("restore %s: %v", k, err)
		}
	}
}

func TestFaults(t *testing.T) {
	ctx := context.Background()
	const ttl, grace = 2 * time.Second, 300 * time.Millisecond

	// After FLUSHALL, a connection that closes before its next heartbeat is
	// unknown to Redis: no grace, no offline, ever. Viewers keep "online".
	t.Run("FlushAllThenCloseNeverOffline", func(t *testing.T) {
		r := redistest.Start(t)
		s, h := mk(t, r.URL(), "a", ttl, grace)
		must(t, s.AddMember(ctx, "t", "bob"))
		must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
		waitHist(t, h, 2*time.Second, s, "bob=online")
		flushKeepingMembership(t, r, "t", "bob")
		err := s.Disconnect(ctx, "c1", presence.Closed)
		t.Logf("disconnect after FLUSHALL: %v", err)
		sweepFor(t, s, 2*time.Second)
		if got := strings.Join(h.hist(), " "); got != "bob=online bob=offline" {
			t.Fatalf("GHOST: viewers got %q and nothing more; bob left at the FLUSHALL", got)
		}
	})

	// Docs: after a FLUSHALL each node writes its live connections back once
	// its next beat (or heartbeat batch) finds them missing. Only connections
	// that heartbeat are.
	t.Run("FlushAllIdleConnNotReasserted", func(t *testing.T) {
		r := redistest.Start(t)
		s, _ := mk(t, r.URL(), "a", 25*time.Second, grace)
		must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
		if _, err := r.Do("FLUSHALL"); err != nil {
			t.Fatal(err)
		}
		sweepFor(t, s, 2*time.Second) // 4 heartbeat batches, readyz stays 200
		ps, _ := s.Presence(ctx, []string{"bob"})
		if err := s.Ping(ctx); err == nil && ps[0].State != presence.Online {
			t.Fatalf("2s after FLUSHALL, node ready, bob (live, idle client) = %+v", ps[0])
		}
	})

	// A user in grace when Redis loses its data never gets an offline.

	// kill -9 of node b and a restart with the same --node-id (the docs ask
	// for a stable one): b's old connections are never released as a dead
	// node's, only by the 2×ttl safety net.
	t.Run("SameNodeIDRestartKeepsGhost", func(t *testing.T) {
		r := redistest.Start(t)
		a, h := mk(t, r.URL(), "a", ttl, grace)
		b1, _ := mk(t, r.URL(), "b", ttl, grace)
		must(t, a.AddMember(ctx, "t", "bob"))
		must(t, b1.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
		waitHist(t, h, 2*time.Second, a, "bob=online")
		kill9(b1)
		killed := time.Now()
		mk(t, r.URL(), "b", ttl, grace) // restarted at once, same id
		// Dead-node path would take NodeTTL (600ms) + grace (300ms).
		end := time.Now().Add(3 * ttl)
		for time.Now().Before(end) {
			_ = a.Sweep(ctx)
			if strings.Join(h.hist(), " ") == "bob=online bob=offline" {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		took := time.Since(killed)
		// Loose for a loaded CI machine; the bug this guards took 2×ttl+grace = 4.3s.
		if took > 3*time.Second {
			t.Fatalf("bob offline only after %v (hist %v); want ~NodeTTL+grace = 0.9s", took.Round(100*time.Millisecond), h.hist())
		}
	})

	// A node that left (Close: leaving beat, score 0) with connections still
	// held: the survivor reports an expiry lag of ~56 years.
	t.Run("LeavingNodeLag", func(t *testing.T) {
		r := redistest.Start(t)
		a, h := mk(t, r.URL(), "a", ttl, grace)
		b, _ := mk(t, r.URL(), "b", ttl, grace)
		must(t, b.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
		_ = b.Close()
		sweepFor(t, a, time.Second)
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, l := range h.lag {
			if l > time.Hour {
				t.Fatalf("offline-detection lag observed: %v", l)
			}
		}
	})

	// The change is computed and stored by the script, but published later
	// by Go: a lost reply (timeout, reset, kill -9 between the two) loses the
	// change for good. Here the reply of the sweep that ends bob's grace is
	// lost to a timeout while Redis is busy.
	t.Run("LostReplyLosesOffline", func(t *testing.T) {
		r := redistest.Start(t, "--enable-debug-command", "yes")
		const g = time.Second
		s, h := mk(t, r.URL(), "a", ttl, g)
		must(t, s.AddMember(ctx, "t", "bob"))
		must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
		sweepFor(t, s, 500*time.Millisecond) // past the first hold-off
		must(t, s.Disconnect(ctx, "c1", presence.Closed))
		sweepFor(t, s, g-200*time.Millisecond)
		go func() { _, _ = r.Do("DEBUG", "SLEEP", "0.6") }()
		time.Sleep(50 * time.Millisecond)
		tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := s.Sweep(tctx)
		cancel()
		t.Logf("sweep during the stall: %v (at %v)", err, time.Now().Format("15:04:05.000"))
		sweepFor(t, s, 2*time.Second)
		ps, _ := s.Presence(ctx, []string{"bob"})
		if got := strings.Join(h.hist(), " "); got != "bob=online bob=offline" {
			t.Fatalf("GHOST: viewers got %q while Redis says %v v%d", got, ps[0].State, ps[0].Version)
		}
	})

	// A Disconnect that fails on a short blip (here: its context) leaves the
	// connection in Redis; nothing retries or reconciles it while the node
	// stays healthy: online until the 2×ttl safety net.
	t.Run("FailedDisconnectGhost", func(t *testing.T) {
		r := redistest.Start(t)
		s, h := mk(t, r.URL(), "a", ttl, grace)
		must(t, s.AddMember(ctx, "t", "bob"))
		must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
		waitHist(t, h, 2*time.Second, s, "bob=online")
		dctx, cancel := context.WithCancel(ctx)
		cancel()
		t.Logf("disconnect: %v", s.Disconnect(dctx, "c1", presence.Closed))
		closed := time.Now()
		end := time.Now().Add(3 * ttl)
		for time.Now().Before(end) && len(h.hist()) < 2 {
			_ = s.Sweep(ctx)
			time.Sleep(50 * time.Millisecond)
		}
		if took := time.Since(closed); took > 2500*time.Millisecond { // the bug: 2×ttl+grace = 4.3s
			t.Fatalf("offline %v after the close (hist %v, ping %v); want ~grace", took.Round(100*time.Millisecond), h.hist(), s.Ping(ctx))
		}
	})

	// AddMember after a partial failure (user set written, team set not) is
	// a silent no-op: the two sets stay inconsistent and no event is sent.
	t.Run("AddMemberPartialFailure", func(t *testing.T) {
		r := redistest.Start(t)
		if _, err := r.Do("ACL", "SETUSER", "partial", "on", ">pw", "~gd:{gd*", "&*", "+@all"); err != nil {
			t.Fatal(err)
		}
		url := "redis://partial:pw@" + r.Addr()
		s, h := mk(t, url, "a", ttl, grace)
		err := s.AddMember(ctx, "t1", "bob")
		t.Logf("first AddMember (second write refused): %v", err)
		if _, err := r.Do("ACL", "SETUSER", "partial", "allkeys"); err != nil {
			t.Fatal(err)
		}
		t.Logf("retry AddMember: %v", s.AddMember(ctx, "t1", "bob"))
		teams, _ := s.TeamsOf(ctx, "bob")
		members, _ := s.Members(ctx, "t1")
		time.Sleep(300 * time.Millisecond)
		h.mu.Lock()
		mem := h.mem
		h.mu.Unlock()
		if len(members) != 1 || len(mem) != 1 {
			t.Fatalf("after a successful retry: TeamsOf(bob)=%v Members(t1)=%v membership events %q", teams, members, mem)
		}
	})

	// flushHeartbeats re-asserts ids missing in Redis one by one; a
	// connection that closes meanwhile is written back into Redis AND into
	// s.conns: a ghost and a leak.
	t.Run("ReassertDisconnectRace", func(t *testing.T) {
		r := redistest.Start(t)
		s, _ := mk(t, r.URL(), "a", 10*time.Second, grace)
		const n = 300
		for round := 0; round < 3; round++ {
			for i := 0; i < n; i++ {
				must(t, s.Connect(ctx, presence.Conn{ID: fmt.Sprint("r", round, "-", i), UserID: fmt.Sprint("u", i), Device: "web"}))
			}
			if _, err := r.Do("FLUSHALL"); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < n; i++ {
				must(t, s.Heartbeat(ctx, fmt.Sprint("r", round, "-", i)))
			}
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { defer wg.Done(); s.flushHeartbeats(ctx) }()
			time.Sleep(2 * time.Millisecond)
			for w := 0; w < 4; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					for i := n - 1 - w; i >= 0; i -= 4 {
						err := s.Disconnect(ctx, fmt.Sprint("r", round, "-", i), presence.Closed)
						if err != nil && !errors.Is(err, ErrUnknownConn) {
							t.Error(err)
						}
					}
				}(w)
			}
			wg.Wait()
		}
		time.Sleep(600 * time.Millisecond) // let flushLoop finish
		s.mu.Lock()
		leaked := len(s.conns)
		s.mu.Unlock()
		inRedis := 0
		for sh := 0; sh < numShards; sh++ {
			v, _ := r.Do("HLEN", prefix(sh)+"c")
			var k int
			fmt.Sscan(v, &k)
			inRedis += k
		}
		if leaked > 0 || inRedis > 0 {
			t.Fatalf("every connection was closed, yet s.conns holds %d and Redis holds %d", leaked, inRedis)
		}
	})
}

// evalMany re-runs EVERY call when any of them got NOSCRIPT (one cluster
// master restarted, failed over or had SCRIPT FLUSH), and keeps only the
// second replies: what the first run of the other shards claimed (ended
// graces, expiries) is never published.
func TestPartialNoScriptDropsSweep(t *testing.T) {
	ctx := context.Background()
	c := redistest.StartCluster(t, 3)
	const grace = 300 * time.Millisecond
	s, h := mk(t, c.URL(), "a", 2*time.Second, grace)
	must(t, s.AddMember(ctx, "t", "bob"))
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	sweepFor(t, s, 600*time.Millisecond)
	waitHist(t, h, time.Second, s, "bob=online")
	must(t, s.Disconnect(ctx, "c1", presence.Closed))
	time.Sleep(grace + 100*time.Millisecond)
	key := dlKey(shardOf("bob"))
	flushed := 0
	for _, n := range c.Nodes {
		if _, err := n.Do("EXISTS", key); err != nil && strings.Contains(err.Error(), "MOVED") {
			if _, err := n.Do("SCRIPT", "FLUSH"); err != nil {
				t.Fatal(err)
			}
			flushed++
		}
	}
	t.Logf("flushed the script cache of %d masters that do not hold bob's shard", flushed)
	t.Logf("sweep: %v", s.Sweep(ctx))
	sweepFor(t, s, time.Second)
	ps, _ := s.Presence(ctx, []string{"bob"})
	if got := strings.Join(h.hist(), " "); got != "bob=online bob=offline" {
		t.Fatalf("GHOST: viewers got %q while Redis says %v", got, ps[0].State)
	}
}

// After a FLUSHALL, a viewer that connects before bob's next heartbeat gets a
// snapshot without bob (offline, v0). Bob's re-assertion is silent, so that
// viewer never hears bob is online.
func TestSilentReassertHidesFromNewViewers(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, h := mk(t, r.URL(), "a", 25*time.Second, 300*time.Millisecond)
	must(t, s.AddMember(ctx, "t", "bob"))
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	waitHist(t, h, 2*time.Second, s, "bob=online")
	flushKeepingMembership(t, r, "t", "bob")
	time.Sleep(time.Second)
	snap, _ := s.Presence(ctx, []string{"bob"}) // a new viewer's snapshot
	h.mu.Lock()
	seenBefore := len(h.ch)
	h.mu.Unlock()
	t.Logf("snapshot of a viewer connecting now: %v v%d", snap[0].State, snap[0].Version)
	must(t, s.Heartbeat(ctx, "c1")) // bob's next heartbeat: re-asserted
	time.Sleep(time.Second)
	now, _ := s.Presence(ctx, []string{"bob"})
	h.mu.Lock()
	defer h.mu.Unlock()
	var after []presence.Change
	after = append(after, h.ch[seenBefore:]...)
	t.Logf("now %v v%d; events after the snapshot: %+v", now[0].State, now[0].Version, after)
	if now[0].State != snap[0].State && len(after) == 0 {
		t.Fatalf("bob went %v -> %v (v%d) with no event newer than the snapshot: the new viewer shows bob offline",
			snap[0].State, now[0].State, now[0].Version)
	}
}

// recover() snapshots s.conns, re-asserts them, then reconciles each shard
// against that snapshot: a connection made in between (clients retrying
// right as Redis returns) is ended in Redis as "lost" although it is live.
func TestRecoverEndsNewConnections(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", 25*time.Second, 300*time.Millisecond)
	for i := 0; i < 3000; i++ {
		must(t, s.Connect(ctx, presence.Conn{ID: fmt.Sprint("old", i), UserID: fmt.Sprint("o", i), Device: "web"}))
	}
	done := make(chan error, 1)
	go func() { done <- s.recover(ctx) }()
	var fresh []string
loop:
	for i := 0; ; i++ {
		select {
		case err := <-done:
			must(t, err)
			break loop
		default:
		}
		id := fmt.Sprint("new", i)
		must(t, s.Connect(ctx, presence.Conn{ID: id, UserID: fmt.Sprint("n", i), Device: "web"}))
		fresh = append(fresh, id)
	}
	var ended []string
	for i, id := range fresh {
		sh := shardOf(fmt.Sprint("n", i))
		if v, _ := r.Do("HEXISTS", prefix(sh)+"c", id); v == "0" {
			ended = append(ended, id)
		}
	}
	if len(ended) > 0 {
		ps, _ := s.Presence(ctx, []string{"n0"})
		t.Fatalf("%d of %d live connections made during recover were ended in Redis (e.g. %s; n0 = %v, %d conns)",
			len(ended), len(fresh), ended[0], ps[0].State, ps[0].ConnectionCount)
	}
}

func crcShard(team string) int {
	var ch = teamChannel(team)
	var n int
	fmt.Sscanf(ch[strings.Index(ch, "{ev")+3:], "%d", &n)
	return n
}

// A shard nobody swept before (a fresh Redis, a first deploy, a Redis
// emptied while no node ran) holds nothing stale: a user who closes right
// after the start goes offline after the grace, not after an outage's
// hold-off (the contract: at most 1 s of detection delay).
func TestFreshShardEndsGraceOnTime(t *testing.T) {
	ctx := context.Background()
	const grace = 300 * time.Millisecond
	cfg := func(url string) Config {
		return Config{URL: url, Node: "a", TTL: 2 * time.Second, Grace: grace,
			NodeTTL: 600 * time.Millisecond, HoldOff: 3 * time.Second}
	}
	closeAndExpectOffline := func(t *testing.T, url string) {
		t.Helper()
		s, h := mkWith(t, cfg(url))
		must(t, s.AddMember(ctx, "t", "bob"))
		must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
		waitHist(t, h, 2*time.Second, s, "bob=online")
		must(t, s.Disconnect(ctx, "c1", presence.Closed))
		waitHist(t, h, grace+time.Second, s, "bob=online bob=offline")
	}
	t.Run("FreshRedis", func(t *testing.T) {
		closeAndExpectOffline(t, redistest.Start(t).URL())
	})
	t.Run("FlushedWhileNoNodeRan", func(t *testing.T) {
		r := redistest.Start(t)
		old, _ := mkWith(t, cfg(r.URL()))
		sweepFor(t, old, 200*time.Millisecond) // its sweep records stay behind
		must(t, old.Close())
		if _, err := r.Do("FLUSHALL"); err != nil {
			t.Fatal(err)
		}
		closeAndExpectOffline(t, r.URL())
	})
}

// A FLUSHALL under live nodes: bob has a connection on a and one on b.
// Until b writes its connection back, Redis knows bob only through a, so
// the end of a's connection must not bring viewers an offline while b's
// lives, whether a had written its connection back first or not, and
// whether a's beat noticed the loss before the first sweep or not.
func TestFlushUnderLiveNodesNoFalseOffline(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		beatFirst bool // a beats (and finds itself missing) before the first sweep
		reassert  bool // a writes c1 back (its heartbeat) before it closes
	}{
		{"UnknownConnCloses", false, false},
		{"ReassertedConnCloses", false, true},
		{"SweeperBeatFirst", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := redistest.Start(t)
			cfg := func(node string) Config {
				return Config{URL: r.URL(), Node: node, TTL: 10 * time.Second, Grace: 100 * time.Millisecond,
					NodeTTL: 1500 * time.Millisecond, HoldOff: 3500 * time.Millisecond}
			}
			a, h := mkWith(t, cfg("a"))
			b, _ := mkWith(t, cfg("b"))
			must(t, a.AddMember(ctx, "t", "bob"))
			must(t, a.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
			must(t, b.Connect(ctx, presence.Conn{ID: "c2", UserID: "bob", Device: "ios"}))
			waitHist(t, h, 2*time.Second, a, "bob=online")
			flushKeepingMembership(t, r, "t", "bob")
			if tc.beatFirst {
				a.beat(ctx, false)
			}
			must(t, a.Sweep(ctx)) // nodes sweep every 100 ms
			if tc.reassert {
				must(t, a.Heartbeat(ctx, "c1"))
				a.flushHeartbeats(ctx)
			}
			must(t, a.Disconnect(ctx, "c1", presence.Closed))
			c2Key := prefix(shardOf("bob")) + "c"
			testwait.For(t, 5*time.Second, func() error {
				_ = a.Sweep(ctx)
				if v, _ := r.Do("HEXISTS", c2Key, "c2"); v != "1" {
					return errors.New("b has not written c2 back yet")
				}
				return nil
			})
			sweepFor(t, a, 200*time.Millisecond)
			for _, c := range h.hist() {
				if c == "bob=offline" {
					t.Fatalf("FALSE OFFLINE: viewers got %v while b held bob's connection", h.hist())
				}
			}
			ps, err := a.Presence(ctx, []string{"bob"})
			must(t, err)
			if ps[0].State != presence.Online || ps[0].ConnectionCount != 1 {
				t.Fatalf("bob = %+v, want online with b's connection", ps[0])
			}
		})
	}
}

// A sweep record that is there but stale (Redis restarted with its data
// from disk, every node paused) still holds off: the deadlines and node
// beats it holds are old, and live nodes must re-assert first.
func TestStaleSweepRecordHoldsOff(t *testing.T) {
	ctx := context.Background()
	const grace, holdOff = 300 * time.Millisecond, 2 * time.Second
	r := redistest.Start(t)
	s, h := mkWith(t, Config{URL: r.URL(), Node: "a", TTL: 2 * time.Second, Grace: grace,
		NodeTTL: 600 * time.Millisecond, HoldOff: holdOff})
	must(t, s.AddMember(ctx, "t", "bob"))
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	waitHist(t, h, 2*time.Second, s, "bob=online")
	must(t, s.Disconnect(ctx, "c1", presence.Closed))
	if _, err := r.Do("SET", prefix(shardOf("bob"))+"ls", "1"); err != nil { // last swept long ago
		t.Fatal(err)
	}
	sweepFor(t, s, grace+500*time.Millisecond)
	if got := strings.Join(h.hist(), " "); got != "bob=online" {
		t.Fatalf("during the hold-off viewers got %q", got)
	}
	waitHist(t, h, holdOff+time.Second, s, "bob=online bob=offline")
}

// A node that finds Redis emptied can write its connections back before it
// sweeps again; its next sweep then finds no sweep record and itself in
// NODES, as in a fresh Redis. It must still mark the shard emptied: the
// other nodes have not written theirs back yet, and a snapshot read then
// (on any node) shows their users offline. Found by the chaos test: a
// connect right after an empty restart listed three live users offline.
func TestRecoveredSweeperStillMarksEmptied(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	a, _ := mkWith(t, Config{URL: r.URL(), Node: "a", TTL: 10 * time.Second, Grace: 100 * time.Millisecond,
		NodeTTL: 1500 * time.Millisecond, HoldOff: 3500 * time.Millisecond})
	// b beats seldom: it has not noticed the loss when the read comes.
	b, _ := mkWith(t, Config{URL: r.URL(), Node: "b", TTL: 10 * time.Second, Grace: 100 * time.Millisecond,
		NodeTTL: time.Minute, HoldOff: 3500 * time.Millisecond})
	must(t, a.AddMember(ctx, "t", "bob"))
	must(t, a.AddMember(ctx, "t", "carol"))
	must(t, a.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	must(t, b.Connect(ctx, presence.Conn{ID: "c2", UserID: "carol", Device: "web"}))
	must(t, a.Sweep(ctx))
	must(t, b.Sweep(ctx))
	if _, err := r.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	// a's beat finds it missing, and its health check writes c1 back.
	testwait.For(t, 5*time.Second, func() error {
		if !a.awaitingResync.Load() {
			return errors.New("a has not recovered yet")
		}
		return nil
	})
	must(t, a.Sweep(ctx))
	if _, err := b.WholeStates(ctx, []string{"bob", "carol"}); !errors.Is(err, ErrRecovering) {
		ps, _ := b.States(ctx, []string{"bob", "carol"})
		t.Fatalf("a snapshot read on b after the loss: err %v, states %+v; want ErrRecovering (carol is not written back)", err, ps)
	}
}

// A node restarted under its id after kill -9 finds its old entry in NODES
// at its first beat. The first data loss after that must still be noticed:
// it was not, because only a beat that found the node missing counted as
// its first, so that loss was taken for the first beat. Its connections
// came back one by one with their heartbeats, but its viewers were never
// resynced: a grace lost with the data left a ghost (chaos test: each
// restarted node missed one FLUSHALL).
func TestRestartedNodeNoticesTheNextLoss(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	// The hold-off is long so that the resync it delays is still awaited
	// when the test looks.
	cfg := Config{URL: r.URL(), Node: "a", TTL: 10 * time.Second, Grace: 100 * time.Millisecond,
		NodeTTL: 1500 * time.Millisecond, HoldOff: 10 * time.Second}
	first, _ := mkWith(t, cfg)
	must(t, first.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	kill9(first)
	a, _ := mkWith(t, cfg) // its first beat finds a's entry
	must(t, a.Connect(ctx, presence.Conn{ID: "c2", UserID: "bob", Device: "web"}))
	if _, err := r.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, func() error {
		if !a.lostData.Load() && !a.awaitingResync.Load() {
			return errors.New("the restarted node has not noticed that Redis lost its data")
		}
		return nil
	})
}

// A node's beat lands in an emptied Redis and writes the node back; its
// sweep runs before the beat's reply is handled (or the reply is lost to
// a timeout). That sweep finds the node in NODES and no sweep record, as in
// a fresh Redis: the beat itself must have marked the shard emptied, or
// snapshots read meanwhile list the other nodes' users offline. The sweep
// that sees the mark makes the node recover too.
func TestBeatIntoEmptiedRedisMarksIt(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	a, _ := mkWith(t, Config{URL: r.URL(), Node: "a", TTL: 10 * time.Second, Grace: 100 * time.Millisecond,
		NodeTTL: time.Minute, HoldOff: 10 * time.Second})
	b, _ := mkWith(t, Config{URL: r.URL(), Node: "b", TTL: 10 * time.Second, Grace: 100 * time.Millisecond,
		NodeTTL: time.Minute, HoldOff: 10 * time.Second})
	must(t, a.AddMember(ctx, "t", "carol"))
	must(t, b.Connect(ctx, presence.Conn{ID: "c2", UserID: "carol", Device: "web"}))
	must(t, a.Sweep(ctx))
	if _, err := r.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	// a's beat script, its reply not handled yet.
	_, err := a.evalShards(ctx, a.sc.beat, func(sh int) call {
		return call{keys: shardKeys(sh), args: []any{"a", "0", "1", a.cfg.HoldOff.Milliseconds(), a.cfg.NodeTTL.Milliseconds()}}
	})
	must(t, err)
	must(t, a.Sweep(ctx))
	if _, err := b.WholeStates(ctx, []string{"carol"}); !errors.Is(err, ErrRecovering) {
		t.Fatalf("a snapshot read on b after the loss: err %v; want ErrRecovering (carol is not written back)", err)
	}
	// Its own shards' next sweep sees it (within ownedSweepMax: a's last
	// sweep found nothing due before the node ttl).
	testwait.For(t, 5*time.Second, func() error {
		if !a.lostData.Load() && !a.awaitingResync.Load() {
			_ = a.Sweep(ctx)
			return errors.New("a has not started recovering from the loss its sweep saw")
		}
		return nil
	})
}

// A disconnect that starts a grace sweeps the user's shard again when the
// grace is over, so its offline comes on time rather than at the next tick.
// (The test keeps sweeping too, slower than the server's tick but within
// the sweep gap that would hold graces off, so that whichever sweep ends
// it, the grace-end sweep must have run.)
func TestGraceEndIsSwept(t *testing.T) {
	srv := redistest.Start(t)
	s, r := mk(t, srv.URL(), "a", 2*time.Second, 300*time.Millisecond)
	ctx := context.Background()
	must(t, s.AddMember(ctx, "t", "bob"))
	sweepFor(t, s, 500*time.Millisecond) // past the hold-off of a fresh Redis
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web", Node: "a"}))
	waitHist(t, r, 5*time.Second, s, "bob=online")
	before := s.graceSweeps.Load()
	must(t, s.Disconnect(ctx, "c1", presence.Closed))
	waitHist(t, r, 5*time.Second, s, "bob=online bob=offline")
	testwait.For(t, 5*time.Second, func() error {
		if n := s.graceSweeps.Load() - before; n != 1 {
			return fmt.Errorf("%d grace-end sweeps, want 1", n)
		}
		return nil
	})
}

// A disconnect that starts no grace (the user keeps another connection)
// schedules no grace-end sweep: here the first device's would run at 305
// ms, before the offline that the second device's grace ends in at ~455.
func TestNoGraceEndSweepWithoutAGrace(t *testing.T) {
	srv := redistest.Start(t)
	// A node ttl long enough that ~0.5 s without a sweep holds no grace off.
	s, r := mkWith(t, Config{URL: srv.URL(), Node: "a", TTL: 2 * time.Second, Grace: 300 * time.Millisecond,
		NodeTTL: 3 * time.Second, HoldOff: 300 * time.Millisecond})
	ctx := context.Background()
	must(t, s.AddMember(ctx, "t", "bob"))
	sweepFor(t, s, 500*time.Millisecond) // past the hold-off of a fresh Redis
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web", Node: "a"}))
	must(t, s.Connect(ctx, presence.Conn{ID: "c2", UserID: "bob", Device: "ios", Node: "a"}))
	waitHist(t, r, 5*time.Second, s, "bob=online")
	before := s.graceSweeps.Load()
	must(t, s.Disconnect(ctx, "c1", presence.Closed))
	time.Sleep(150 * time.Millisecond) // the second device leaves later
	must(t, s.Disconnect(ctx, "c2", presence.Closed))
	testwait.For(t, 5*time.Second, func() error {
		if got := fmt.Sprint(r.hist()); got != "[bob=online bob=offline]" {
			return fmt.Errorf("bob's changes %s", got)
		}
		return nil
	})
	if n := s.graceSweeps.Load() - before; n != 1 {
		t.Fatalf("%d grace-end sweeps by the offline, want 1 (the second device's)", n)
	}
}

// A single script call (run) on a Redis that lost its scripts (a restart,
// SCRIPT FLUSH) runs it by EVAL: the call succeeds.
func TestScriptCallAfterScriptFlushSucceeds(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", 10*time.Second, 300*time.Millisecond)
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	if _, err := r.Do("SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	must(t, s.Connect(ctx, presence.Conn{ID: "c2", UserID: "carol", Device: "web"}))
	ps, err := s.Presence(ctx, []string{"bob", "carol"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.State == presence.Offline {
			t.Fatalf("%s offline after connecting across a SCRIPT FLUSH", p.UserID)
		}
	}
}
