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
