package redisstore

import (
	"context"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// expectShared waits until the live nodes own every shard once between
// them.
func expectShared(t *testing.T, nodes ...*Store) {
	t.Helper()
	testwait.For(t, 10*time.Second, func() error {
		var union uint64
		total := 0
		for _, s := range nodes {
			o := s.owned.Load()
			union |= o
			total += bits.OnesCount64(o)
		}
		if union != allShards || total != numShards {
			return fmt.Errorf("%d nodes own %d shards, covering %032b; want each of the %d once", len(nodes), total, union, numShards)
		}
		return nil
	})
}

// The live nodes share the shards out for sweeping; when one stops, the
// others take its shards over, and until then they still sweep them: a
// connection of a node that died is released by the others' sweeps.
func TestSweepsSharedOutAmongLiveNodes(t *testing.T) {
	r := redistest.Start(t)
	// A fallback of half a second: two sweeps in a row never see it due.
	node := func(name string) (*Store, *rec) {
		return mkWith(t, Config{URL: r.URL(), Node: name, TTL: time.Second,
			NodeTTL: 1500 * time.Millisecond, HoldOff: 300 * time.Millisecond})
	}
	a, _ := node("a")
	b, hb := node("b")
	c, _ := node("c")
	expectShared(t, a, b, c)
	for _, s := range []*Store{a, b, c} {
		if n := bits.OnesCount64(s.owned.Load()); n < 10 || n > 11 {
			t.Fatalf("%s owns %d shards, want 10 or 11 of 32", s.cfg.Node, n)
		}
	}

	// Its own shards when their next claim falls due, and at least every
	// ownedSweepMax; the others once per fallback, which is longer. Idle
	// shards (the beats are the only thing due, a node ttl after each) are
	// not swept again at once, and all of a's own come round before any of
	// the others.
	ctx := context.Background()
	must(t, a.Sweep(ctx))
	for checked := false; !checked; {
		owned := a.owned.Load()
		var before [numShards]int64
		for sh := range before {
			before[sh] = a.lastSwept[sh].Load()
		}
		must(t, a.Sweep(ctx))
		if a.owned.Load() != owned {
			continue // a beat shared the shards out anew meanwhile: again
		}
		for sh := range numShards {
			if a.lastSwept[sh].Load() != before[sh] {
				t.Fatalf("shard %d (owned by a: %v) swept again at once with nothing due", sh, owned&(1<<sh) != 0)
			}
		}
		testwait.For(t, 5*time.Second, func() error {
			must(t, a.Sweep(ctx))
			var mine, others []int
			for sh := range numShards {
				if a.lastSwept[sh].Load() == before[sh] {
					continue
				}
				if owned&(1<<sh) != 0 {
					mine = append(mine, sh)
				} else {
					others = append(others, sh)
				}
			}
			if len(others) > 0 && a.owned.Load() == owned {
				t.Fatalf("shards %v not a's swept before a's own came round (%d of %d)", others, len(mine), bits.OnesCount64(owned))
			}
			if len(mine) < bits.OnesCount64(owned) {
				return fmt.Errorf("a's own shards swept again: %d of %d", len(mine), bits.OnesCount64(owned))
			}
			return nil
		})
		checked = true
	}

	// c dies without a word: until the beats leave it out, a and b sweep
	// its shards on the fallback, so its connection is released.
	must(t, c.AddMember(ctx, "t", "carol"))
	must(t, c.Connect(ctx, presence.Conn{ID: "c1", UserID: "carol", Device: "web"}))
	kill9(c)
	expectShared(t, a, b)
	testwait.For(t, 10*time.Second, func() error {
		_ = a.Sweep(ctx)
		_ = b.Sweep(ctx)
		for _, e := range hb.hist() {
			if e == "carol=offline" {
				return nil
			}
		}
		return fmt.Errorf("carol, on the dead node c, not offline yet: %v", hb.hist())
	})
}

// redisMS is Redis's clock, in ms.
func redisMS(t *testing.T, r *redistest.Server) int64 {
	t.Helper()
	v, err := r.DoList("TIME")
	if err != nil || len(v) != 2 {
		t.Fatalf("TIME: %v %v", v, err)
	}
	sec, _ := strconv.ParseInt(v[0], 10, 64)
	us, _ := strconv.ParseInt(v[1], 10, 64)
	return sec*1000 + us/1000
}

// A node killed without a word has its connections released within the
// node liveness of its last beat and one sweep tick, as when every node
// swept every shard: by the first sweep after its liveness lapsed, also in
// a shard that the sweeper owns neither before the death nor after, and
// whose last fallback sweep came just before the lapse. That sweep finds
// the node dead in the sweeper's own shards, ranks it out and sweeps every
// shard at once.
func TestDeadNodeReleasedWithinOneTick(t *testing.T) {
	r := redistest.Start(t)
	const tick = 100 * time.Millisecond // the server's sweep interval
	nodeTTL := 1500 * time.Millisecond  // a fallback of 500 ms
	node := func(name string) (*Store, *rec) {
		return mkWith(t, Config{URL: r.URL(), Node: name, TTL: 20 * time.Second,
			NodeTTL: nodeTTL, HoldOff: 300 * time.Millisecond})
	}
	a, ha := node("a")
	b, _ := node("b") // live, but never sweeps: a alone does
	c, _ := node("c")
	expectShared(t, a, b, c)
	// A user in a shard that c owns (rank 2 of 3) and that is b's once c
	// is gone (rank 1 of 2): never a's.
	sh, user := -1, ""
	for i := 0; sh < 0; i++ {
		if u := fmt.Sprintf("u%d", i); shardOf(u)%3 == 2 && shardOf(u)%2 == 1 {
			sh, user = shardOf(u), u
		}
	}
	if a.owned.Load()&(1<<sh) != 0 || b.owned.Load()&(1<<sh) != 0 {
		t.Fatalf("shard %d is not c's alone", sh)
	}
	ctx := context.Background()
	must(t, c.AddMember(ctx, "t", user))
	must(t, c.Connect(ctx, presence.Conn{ID: "c1", UserID: user, Device: "web"}))
	kill9(c)
	score, err := r.Do("ZSCORE", shardKeys(sh)[2], "c")
	if err != nil {
		t.Fatal(err)
	}
	last, _ := strconv.ParseInt(score, 10, 64)
	lapse := last + nodeTTL.Milliseconds()

	// a sweeps at the server's tick until c's connection is released (its
	// first sweeps hold off: nobody swept since the stores started). Just
	// before c's liveness lapses, a sweeps every shard once more: the worst
	// phase for the fallback, which is then not due for 500 ms.
	all := make([]int, numShards)
	for i := range all {
		all[i] = i
	}
	uc := prefix(sh) + "uc:" + user
	released := func() bool {
		n, err := r.Do("HLEN", uc)
		return err == nil && n == "0"
	}
	tk := time.NewTicker(tick)
	defer tk.Stop()
	deadline := time.Now().Add(5 * time.Second)
	for forced := false; ; {
		<-tk.C
		began := redisMS(t, r)
		must(t, a.Sweep(ctx))
		if !forced && began >= lapse-150 && !released() {
			forced = true
			if _, err := a.sweepShards(ctx, all, time.Now()); err != nil {
				t.Fatal(err)
			}
		}
		if released() {
			break
		}
		// Judged by the sweep's place, not by the clock: on a loaded
		// machine a tick may come late.
		if began >= lapse {
			t.Fatalf("a's sweep %d ms after c's liveness lapsed left c's connection in shard %d", began-lapse, sh)
		}
		if time.Now().After(deadline) {
			t.Fatalf("c's connection in shard %d not released after 5s", sh)
		}
	}
	ha.mu.Lock()
	lags := slices.Clone(ha.lag)
	ha.mu.Unlock()
	if len(lags) != 1 {
		t.Fatalf("releases reported with lags %v, want one", lags)
	}
	t.Logf("released %v after c's liveness lapsed (tick %v)", lags[0], tick)
}
