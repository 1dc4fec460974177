package redisstore

// Recovering from a data loss or a refusal: how long a loss's hold-off
// lasts, and what a node writes again once Redis takes writes.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// A data loss's hold-off lasts while a node that found the loss has not
// written its connections back yet, not only its fixed time: reads stay
// refused meanwhile. Found by the chaos test (seed 829158268, cluster, two
// busy loops beside it): a master restarted empty, then killed again within
// the hold-off and back with its data; the nodes' re-assertions kept
// failing, the loss mark expired, and a snapshot listed a live user offline.
// Here b stands for such a node: it beats, and cannot write c2 back.
func TestLossHoldOffLastsWhileANodeRestores(t *testing.T) {
	ctx := context.Background()
	r, a, b := lossPair(t, func(b *Store) {
		must(t, b.Connect(ctx, presence.Conn{ID: "c2", UserID: "bob", Device: "ios"}))
	})
	flushKeepingMembership(t, r, "t", "bob")
	b.beat(ctx, false)
	if !b.lostData.Load() {
		t.Fatal("b's beat did not find the loss")
	}
	for end := time.Now().Add(3 * pairHoldOff); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		b.beat(ctx, false)
		_ = a.Sweep(ctx)
		ps, err := a.WholeStates(ctx, []string{"bob"})
		if !errors.Is(err, ErrRecovering) {
			t.Fatalf("a read bob as %+v (err %v) while b had not written c2 back", ps, err)
		}
	}

	must(t, b.recover(ctx))
	// As the health check does once recover succeeds: b resyncs a hold-off
	// later (not this test's), and sweeps every shard until then.
	b.healthy.Store(true)
	b.lostData.Store(false)
	b.awaitingResync.Store(true)
	// a marked b's shards emptied while it swept them all; it must not
	// refuse connects (Intact) for ever after, though b keeps them swept and
	// a has no cause to sweep them as stale.
	testwait.For(t, 3*pairHoldOff, func() error {
		b.beat(ctx, false)
		_ = b.Sweep(ctx)
		_ = a.Sweep(ctx)
		ps, err := a.WholeStates(ctx, []string{"bob"})
		if err != nil {
			return err
		}
		if ps[0].State != presence.Online {
			return fmt.Errorf("bob = %+v, want online", ps[0])
		}
		if err := a.Intact(); err != nil {
			return fmt.Errorf("a: %w (shards marked emptied %032b)", err, a.emptied.Load())
		}
		return nil
	})
}

// A node that held no connection when it found a loss (a process started
// during the hold-off) has nothing to write back: its beats must not keep
// the hold-off going (chaos seed 409074510, one Redis: node c, restarted
// during the hold-off of an empty restart, kept reads refused 4.4 s longer,
// and a join's deferred event gave up meanwhile).
func TestLossHoldOffNotKeptByANodeWithNothingToRestore(t *testing.T) {
	ctx := context.Background()
	r, a, c := lossPair(t, func(*Store) {})
	flushKeepingMembership(t, r, "t", "bob")
	c.beat(ctx, false)
	if !c.lostData.Load() {
		t.Fatal("c's beat did not find the loss")
	}
	if c.restoring() {
		t.Fatal("c holds no connection, yet its beats would hold the hold-off open")
	}
	// c beats on and never recovers; the hold-off still ends on its own.
	testwait.For(t, 3*pairHoldOff, func() error {
		c.beat(ctx, false)
		_ = a.Sweep(ctx)
		_, err := a.WholeStates(ctx, []string{"bob"})
		return err
	})
}

// A reply that refuses every call for now ran nothing: a status write so
// refused must be made again once Redis takes writes. A demoted master
// answers READONLY as a cluster that lost a master answers CLUSTERDOWN
// (chaos seed 239783446, cluster: the write was taken for the script's
// answer, the node stayed healthy, and a viewer showed the user away for
// 14 s after they went online).
func TestStatusRefusedForNowIsWrittenOnceRedisTakesWrites(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mkWith(t, Config{URL: r.URL(), Node: "n1", TTL: 10 * time.Second, Grace: 100 * time.Millisecond,
		NodeTTL: 1500 * time.Millisecond, HoldOff: time.Second})
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web", Idle: true}))
	readOnly(t, r, func() {
		if err := s.SetStatus(ctx, "c1", true); err == nil || !strings.Contains(err.Error(), "READONLY") {
			t.Fatalf("status write to a read-only Redis: %v, want READONLY", err)
		}
	})
	testwait.For(t, 10*time.Second, func() error {
		ps, err := s.Presence(ctx, []string{"bob"})
		if err != nil {
			return err
		}
		if ps[0].State != presence.Online {
			return fmt.Errorf("bob is %v: the refused status write was never made", ps[0].State)
		}
		return nil
	})
}

// A connection closed while it was being re-asserted is ended in Redis
// again; when Redis refuses that end, it is tried again, not left to keep
// its user online until its deadline.
func TestEndOfAConnectionClosedWhileReassertedIsRetried(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mkWith(t, Config{URL: r.URL(), Node: "n1", TTL: time.Minute, Grace: 100 * time.Millisecond,
		NodeTTL: 1500 * time.Millisecond, HoldOff: time.Second})
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	s.mu.Lock()
	delete(s.conns, "c1") // closed here: the re-assertion's check ends it in Redis
	s.mu.Unlock()
	readOnly(t, r, func() { s.endInRedis(ctx, "c1", "bob", "n1") })
	testwait.For(t, 10*time.Second, func() error {
		_ = s.Sweep(ctx) // as the server's sweeper does: it ends the grace
		ps, err := s.Presence(ctx, []string{"bob"})
		if err != nil {
			return err
		}
		if ps[0].State != presence.Offline {
			return fmt.Errorf("bob is %v: the refused end was not tried again", ps[0].State)
		}
		return nil
	})
}

// pairHoldOff is lossPair's hold-off.
const pairHoldOff = time.Second

// lossPair starts a Redis with team t holding bob, and two nodes on it: a,
// whose loops run, and b, set up by setup, whose loops are then stopped: it
// beats, and re-asserts, only when the test says.
func lossPair(t *testing.T, setup func(b *Store)) (*redistest.Server, *Store, *Store) {
	t.Helper()
	r := redistest.Start(t)
	cfg := func(node string) Config {
		return Config{URL: r.URL(), Node: node, TTL: 10 * time.Second, Grace: 100 * time.Millisecond,
			NodeTTL: 1500 * time.Millisecond, HoldOff: pairHoldOff}
	}
	a, _ := mkWith(t, cfg("a"))
	b, _ := mkWith(t, cfg("b"))
	must(t, a.AddMember(context.Background(), "t", "bob"))
	setup(b)
	close(b.stop)
	b.wg.Wait()
	b.stop = make(chan struct{}) // for Close
	return r, a, b
}

// readOnly runs f while r is a replica of nobody: it keeps its data and
// refuses every write with READONLY, as a demoted master does.
func readOnly(t *testing.T, r *redistest.Server, f func()) {
	t.Helper()
	if _, err := r.Do("REPLICAOF", "127.0.0.1", "1"); err != nil {
		t.Fatal(err)
	}
	f()
	if _, err := r.Do("REPLICAOF", "NO", "ONE"); err != nil {
		t.Fatal(err)
	}
}
