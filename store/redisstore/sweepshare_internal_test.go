package redisstore

import (
	"context"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"sync"
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
// others take its shards over: a connection of a node that died is
// released by the others' sweeps (TestDeadOwnersShardsSweptBeforeAHoldOff
// has them sweep its shards meanwhile).
func TestSweepsSharedOutAmongLiveNodes(t *testing.T) {
	r := redistest.Start(t)
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

	// c dies without a word: once the beats leave it out, a and b sweep
	// its shards, so its connection is released.
	ctx := context.Background()
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

// A node sweeps its own shards when due and at least every ownedSweepMax,
// and another node's shard only when its sweep record stood still for
// staleSweep as this node saw it (or there is none): the sweeps do not
// grow with the nodes. The test moves the records and this node's view of
// their age itself (a node ttl of a minute: a look every 5 s, stale after
// 20 s).
func TestSweepsAnotherNodesShardOnlyWhenStale(t *testing.T) {
	r := redistest.Start(t)
	node := func(name string) *Store {
		s, _ := mkWith(t, Config{URL: r.URL(), Node: name, TTL: 10 * time.Second,
			NodeTTL: time.Minute, HoldOff: 300 * time.Millisecond})
		return s
	}
	a, b := node("a"), node("b")
	ctx := context.Background()
	a.beat(ctx, false) // a counts b now
	expectShared(t, a, b)
	owned := a.owned.Load()
	theirs := ownedList(allShards &^ owned)
	look := func() uint64 {
		a.staleChecked.Store(0)
		return a.staleShards(ctx, owned)
	}
	// A first look: a knows every record (it swept them all at its start,
	// alone; b's start swept them again since), so none is stale.
	if got := look(); got != 0 {
		t.Fatalf("a's first look found shards %032b stale, want none", got)
	}
	// Then, a staleSweep later by a's clock: b swept one of its shards
	// meanwhile (its record moved), one has no record (emptied), and the
	// rest stood still.
	moved, gone := theirs[0], theirs[1]
	if _, err := r.Do("SET", shardKeys(moved)[5], strconv.FormatInt(redisMS(t, r)+1, 10)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Do("DEL", shardKeys(gone)[5]); err != nil {
		t.Fatal(err)
	}
	a.recordsMu.Lock()
	for sh := range a.records {
		a.records[sh].since -= a.staleSweep() + time.Second
	}
	a.recordsMu.Unlock()
	want := uint64(allShards&^owned) &^ (1 << moved)
	if got := look(); got != want {
		t.Fatalf("a's look found shards %032b stale, want %032b (all of b's but %d, whose record moved)", got, want, moved)
	}
	// The moved record is stale only a staleSweep after a's look saw it move.
	if got := look(); got&(1<<moved) != 0 {
		t.Fatalf("shard %d stale right after its record moved", moved)
	}

	// lookAs looks with a's records edited first, and puts them back after.
	lookAs := func(edit func(*[numShards]sweepRecord)) uint64 {
		a.recordsMu.Lock()
		saved := a.records
		edit(&a.records)
		a.recordsMu.Unlock()
		defer func() {
			a.recordsMu.Lock()
			a.records = saved
			a.recordsMu.Unlock()
		}()
		return look()
	}
	// Records a node never saw (it just started) are stale at first sight:
	// their owner may have died long ago.
	if got, want := lookAs(func(r *[numShards]sweepRecord) { *r = [numShards]sweepRecord{} }), uint64(allShards&^owned); got != want {
		t.Fatalf("a's first look found shards %032b stale, want all of b's, %032b", got, want)
	}

	// A sweep takes the stale shards, and only them: a's own were swept
	// just now and are not due.
	refreshed := time.Now()
	if _, err := a.sweepShards(ctx, ownedList(owned), refreshed); err != nil {
		t.Fatal(err)
	}
	var before [numShards]int64
	for sh := range before {
		before[sh] = a.lastSwept[sh].Load()
	}
	a.recordsMu.Lock()
	a.records[moved].since -= a.staleSweep() + time.Second // stale too now
	a.recordsMu.Unlock()
	a.staleChecked.Store(0)
	must(t, a.Sweep(ctx))
	for sh := range numShards {
		swept := a.lastSwept[sh].Load() != before[sh]
		switch {
		case owned&(1<<sh) == 0 && !swept:
			t.Fatalf("b's stale shard %d not swept by a", sh)
		case owned&(1<<sh) != 0 && swept && time.Since(refreshed) < a.ownedSweepMax():
			t.Fatalf("a's shard %d swept again at once with nothing due", sh)
		}
	}
	// Their records are a's sweep's now, as old as that sweep: a staleSweep
	// after it they are stale, even at the first look that reads them.
	aged := lookAs(func(r *[numShards]sweepRecord) {
		for _, sh := range theirs {
			r[sh].since -= a.staleSweep() + time.Second
		}
	})
	if want := uint64(allShards &^ owned); aged != want {
		t.Fatalf("a's look a staleSweep after its own sweep found shards %032b stale, want %032b", aged, want)
	}
	// Just after it, none is, and the next Sweep leaves b's shards alone.
	if got := look(); got != 0 {
		t.Fatalf("a's look after its sweep found shards %032b stale, want none", got)
	}
	for sh := range before {
		before[sh] = a.lastSwept[sh].Load()
	}
	a.staleChecked.Store(0)
	must(t, a.Sweep(ctx))
	for _, sh := range theirs {
		if a.lastSwept[sh].Load() != before[sh] {
			t.Fatalf("b's shard %d swept again by a", sh)
		}
	}

	// A look Redis does not answer finds nothing stale (the records stay
	// as they were) and is counted.
	a.recordsMu.Lock()
	kept := a.records
	a.recordsMu.Unlock()
	failed := counterValue(t, a.m.errors.WithLabelValues(opLook))
	r.Stop()
	if got := look(); got != 0 {
		t.Fatalf("a look with Redis down found shards %032b stale, want none", got)
	}
	if got := counterValue(t, a.m.errors.WithLabelValues(opLook)) - failed; got != 1 {
		t.Fatalf("a failed look counted %v times, want once", got)
	}
	a.recordsMu.Lock()
	defer a.recordsMu.Unlock()
	if a.records != kept {
		t.Fatal("a failed look changed the records")
	}
}

// A node killed without a word owned shards that nobody sweeps until a
// sweep finds it dead, a node ttl after its last beat. The others find
// their sweep records standing still and sweep them meanwhile, within the
// gap that would start a hold-off: no shard holds off.
func TestDeadOwnersShardsSweptBeforeAHoldOff(t *testing.T) {
	r := redistest.Start(t)
	node := func(name string) *Store {
		s, _ := mkWith(t, Config{URL: r.URL(), Node: name, TTL: 20 * time.Second,
			NodeTTL: 3 * time.Second, HoldOff: 5 * time.Second})
		return s
	}
	a, b, c := node("a"), node("b"), node("c")
	expectShared(t, a, b, c)
	ctx := context.Background()
	// The server's sweep tick, on each node; c's stops when it dies.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	tick := func(s *Store, done <-chan struct{}) {
		defer wg.Done()
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-done:
				return
			case <-tk.C:
				_ = s.Sweep(ctx)
			}
		}
	}
	cDone := make(chan struct{})
	wg.Add(3)
	go tick(a, nil)
	go tick(b, nil)
	go tick(c, cDone)
	t.Cleanup(func() { close(stop); wg.Wait() })

	// Once every shard was swept on the tick, kill c.
	began := redisMS(t, r)
	testwait.For(t, 5*time.Second, func() error {
		for sh := range numShards {
			v, err := r.Do("GET", shardKeys(sh)[5])
			if err != nil {
				return err
			}
			if at, _ := strconv.ParseInt(v, 10, 64); at <= began {
				return fmt.Errorf("shard %d not swept on the tick yet", sh)
			}
		}
		return nil
	})
	cOwned := c.owned.Load()
	close(cDone)
	kill9(c)
	killed := redisMS(t, r)
	expectShared(t, a, b)
	// Once a and b own c's shards, each is swept at once and then by its
	// new owner.
	testwait.For(t, 5*time.Second, func() error {
		for _, sh := range ownedList(cOwned) {
			v, err := r.Do("GET", shardKeys(sh)[5])
			if err != nil {
				return err
			}
			if at, _ := strconv.ParseInt(v, 10, 64); at < killed+3000 {
				return fmt.Errorf("shard %d last swept at %d, not yet a node ttl after c died at %d", sh, at, killed)
			}
		}
		return nil
	})
	// A hold-off sets its end, a hold-off from its start.
	for sh := range numShards {
		v, err := r.Do("GET", shardKeys(sh)[6])
		if err != nil {
			t.Fatal(err)
		}
		if end, _ := strconv.ParseInt(v, 10, 64); end >= killed+a.cfg.HoldOff.Milliseconds() {
			t.Errorf("shard %d (c's: %v) held off until %d, after c was killed at %d", sh, cOwned&(1<<sh) != 0, end, killed)
		}
	}
}

// ownedList lists the shards of a bit set.
func ownedList(set uint64) []int {
	var shards []int
	for sh := range numShards {
		if set&(1<<sh) != 0 {
			shards = append(shards, sh)
		}
	}
	return shards
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
// that it swept (found stale) just before the lapse. That sweep finds
// the node dead in the sweeper's own shards, ranks it out and sweeps every
// shard at once.
func TestDeadNodeReleasedWithinOneTick(t *testing.T) {
	r := redistest.Start(t)
	const tick = 100 * time.Millisecond // the server's sweep interval
	nodeTTL := 1500 * time.Millisecond  // stale after 500 ms
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
	// phase, as none is stale again for 500 ms.
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
