package redisstore

import (
	"context"
	"fmt"
	"math/bits"
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

	// Swept at each call: its own shards; the others once per fallback.
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
			own := owned&(1<<sh) != 0
			if again := a.lastSwept[sh].Load() != before[sh]; again != own {
				t.Fatalf("shard %d (owned by a: %v) swept again at once: %v", sh, own, again)
			}
		}
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

// A grace and a status that both ended before a sweep are taken in the
// order they fell due: here the grace first (a dead node's connection,
// released by a's sweep), so the user goes offline and the status's end
// after it changes nothing viewers see. Taken the other way round, the
// status's end would first show the user online again.
func TestSweepTakesGraceEndsAndStatusExpiriesInOrder(t *testing.T) {
	r := redistest.Start(t)
	// Sweeps may pause up to a second (two thirds of the node ttl) without
	// starting a hold-off.
	node := func(name string) (*Store, *rec) {
		return mkWith(t, Config{URL: r.URL(), Node: name, TTL: 10 * time.Second, Grace: 300 * time.Millisecond,
			NodeTTL: 1500 * time.Millisecond, HoldOff: 300 * time.Millisecond})
	}
	a, h := node("a")
	b, _ := node("b")
	ctx := context.Background()
	must(t, a.AddMember(ctx, "t", "bob"))
	must(t, b.Connect(ctx, presence.Conn{ID: "b1", UserID: "bob", Device: "web"}))
	kill9(b)
	var released time.Time
	testwait.For(t, 5*time.Second, func() error {
		must(t, a.Sweep(ctx))
		if n, err := r.Do("HLEN", prefix(shardOf("bob"))+"uc:bob"); err != nil || n != "0" {
			return fmt.Errorf("bob's connection on dead b not released yet (%s, %v)", n, err)
		}
		released = time.Now()
		return nil
	})
	// dnd, ending a little after the grace that the release started.
	until := released.Add(300*time.Millisecond + 150*time.Millisecond)
	must(t, a.SetUserStatus(ctx, "bob", presence.Status{Mode: presence.ModeDND, ExpiresAt: time.UnixMilli(until.UnixMilli())}))
	for time.Now().Before(until.Add(50 * time.Millisecond)) {
		time.Sleep(10 * time.Millisecond) // both deadlines pass with no sweep
	}
	must(t, a.Sweep(ctx))
	testwait.For(t, 2*time.Second, func() error {
		if got, want := fmt.Sprint(h.hist()), "[bob=online bob=dnd bob=offline]"; got != want {
			return fmt.Errorf("bob's changes %s, want %s", got, want)
		}
		return nil
	})
}
