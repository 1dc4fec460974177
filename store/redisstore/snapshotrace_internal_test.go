package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// flushAfterFirst runs each pipeline's commands one at a time and, once,
// FLUSHALLs Redis right after the first of a snapshot read (one that
// checks a sweep record): a data loss landing between two of its commands,
// as a FLUSHALL can.
type flushAfterFirst struct {
	r    *redistest.Server
	once sync.Once
	on   atomic.Bool
}

func checksSweepRecord(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if c.Name() != "mget" {
			continue
		}
		for _, a := range c.Args()[1:] {
			if k, ok := a.(string); ok && strings.HasSuffix(k, "}:ls") {
				return true
			}
		}
	}
	return false
}

func (f *flushAfterFirst) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *flushAfterFirst) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (f *flushAfterFirst) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !f.on.Load() || !checksSweepRecord(cmds) {
			return next(ctx, cmds)
		}
		var first error
		for i, c := range cmds {
			if err := next(ctx, []redis.Cmder{c}); err != nil && first == nil && !errors.Is(err, redis.Nil) {
				first = err
			}
			if i == 0 {
				f.once.Do(func() { _, _ = f.r.Do("FLUSHALL") })
			}
		}
		return first
	}
}

// A snapshot read that a FLUSHALL lands in the middle of either shows the
// state from before it or is refused; it never shows users offline
// because their keys went between the check and the read (chaos, cluster:
// a snapshot at the moment of a FLUSHALL listed a live user offline).
func TestSnapshotReadAcrossAFlushIsWholeOrRefused(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", 25*time.Second, 300*time.Millisecond)
	must(t, s.AddMember(ctx, "t", "bob"))
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	must(t, s.Sweep(ctx)) // the sweep record a whole read checks
	hook := &flushAfterFirst{r: r}
	s.rdb.AddHook(hook)
	hook.on.Store(true)
	ps, err := s.WholeStates(ctx, []string{"bob"})
	hook.on.Store(false)
	switch {
	case errors.Is(err, ErrRecovering):
	case err != nil:
		t.Fatal(err)
	case ps[0].State != presence.Online:
		t.Fatalf("a read across a FLUSHALL answered bob %v without an error: a snapshot would show him offline", ps[0].State)
	}
}

// masterOf is the address of the master serving key's slot.
func masterOf(t *testing.T, s *Store, key string) string {
	t.Helper()
	c, err := s.rdb.(*redis.ClusterClient).MasterForKey(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return c.Options().Addr
}

// A snapshot reads the viewer's teams, then their members, then the
// members' states, each from its own slot. A FLUSHALL of a cluster goes
// master by master: between two of them, a team's members read from a
// master flushed already are none, and the states read from the others
// pass their check, so the snapshot leaves a live teammate out, as
// offline (chaos, cluster, seed 7120261: a snapshot 30 ms into a FLUSHALL
// listed u19 offline). The read of the states must be refused.
func TestSnapshotBetweenTheFlushesOfTwoMastersIsRefused(t *testing.T) {
	ctx := context.Background()
	c := redistest.StartCluster(t, 3)
	// A hold-off longer than the test: the loss stays marked while it reads.
	s, _ := mkWith(t, Config{URL: c.URL(), Node: "a", TTL: 25 * time.Second, Grace: 300 * time.Millisecond,
		NodeTTL: 600 * time.Millisecond, HoldOff: time.Minute})
	// alice in team a, bob in team b; team b's members on a master that
	// holds neither's state.
	ma, mb := masterOf(t, s, prefix(shardOf("alice"))), masterOf(t, s, prefix(shardOf("bob")))
	var teamA, teamB string
	for i := 0; teamA == "" || teamB == ""; i++ {
		name := fmt.Sprintf("t%d", i)
		switch m := masterOf(t, s, teamKey(name)); {
		case teamB == "" && m != ma && m != mb:
			teamB = name
		case teamA == "" && m == ma:
			teamA = name
		}
	}
	for _, m := range [][2]string{{teamA, "viewer"}, {teamA, "alice"}, {teamB, "viewer"}, {teamB, "bob"}} {
		must(t, s.AddMember(ctx, m[0], m[1]))
	}
	must(t, s.Connect(ctx, presence.Conn{ID: "ca", UserID: "alice", Device: "web"}))
	must(t, s.Connect(ctx, presence.Conn{ID: "cb", UserID: "bob", Device: "web"}))
	must(t, s.Sweep(ctx)) // the sweep records a whole read checks

	// The snapshot of a viewer connecting as the FLUSHALL begins: its
	// teams read before, the first master (team b's) flushed, then the
	// members and the states, as the server reads them.
	teams, err := s.TeamsOf(ctx, "viewer")
	must(t, err)
	var flushed *redistest.Server
	for _, n := range c.Nodes {
		if n.Addr() == masterOf(t, s, teamKey(teamB)) {
			flushed = n
		}
	}
	if _, err := flushed.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	read, _, err := s.ConnectRead(ctx, presence.Conn{ID: "cv", UserID: "viewer", Device: "web"}, teams)
	must(t, err)
	members := read.Members
	var union []string
	for _, ms := range members {
		for _, m := range ms {
			if m != "viewer" && !slices.Contains(union, m) {
				union = append(union, m)
			}
		}
	}
	ps, err := s.WholeStates(ctx, union)
	switch {
	case errors.Is(err, ErrRecovering):
		return
	case err != nil:
		t.Fatal(err)
	}
	for i, u := range union {
		if u == "bob" && ps[i].State == presence.Online {
			return
		}
	}
	t.Fatalf("the snapshot read %v (members %v) without an error: it shows bob, live, offline", ps, members)
}

// With no users to read (the viewer's teammates all lost with the data),
// a whole read still checks: the members read before it may be none
// because of the loss.
func TestWholeReadOfNobodyAfterAFlushIsRefused(t *testing.T) {
	ctx := context.Background()
	for _, topo := range []string{"redis", "cluster"} {
		t.Run(topo, func(t *testing.T) {
			url, flush := redistest.StartTopology(t, topo)
			s, _ := mkWith(t, Config{URL: url, Node: "a", TTL: 25 * time.Second, Grace: 300 * time.Millisecond,
				NodeTTL: 600 * time.Millisecond, HoldOff: time.Minute})
			must(t, s.Sweep(ctx))
			if _, err := s.WholeStates(ctx, nil); err != nil {
				t.Fatalf("before the flush: %v", err)
			}
			flush()
			if _, err := s.WholeStates(ctx, nil); !errors.Is(err, ErrRecovering) {
				t.Fatalf("after a FLUSHALL a whole read of nobody answered %v, want ErrRecovering", err)
			}
		})
	}
}

// A shard swept after a loss is in its hold-off (EM) until the nodes have
// written their connections back: its sweep record is there again, and a
// user written back has her state copy, so only the loss mark tells a
// whole read that it would miss the others.
func TestWholeReadOfAShardInItsHoldOffIsRefused(t *testing.T) {
	ctx := context.Background()
	url, flush := redistest.StartTopology(t, "redis")
	s, _ := mkWith(t, Config{URL: url, Node: "a", TTL: 25 * time.Second, Grace: 300 * time.Millisecond,
		NodeTTL: 600 * time.Millisecond, HoldOff: time.Minute})
	must(t, s.Sweep(ctx))
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "alice", Device: "web"}))
	for _, read := range []func() ([]presence.Presence, error){
		func() ([]presence.Presence, error) { return s.WholeStates(ctx, []string{"alice"}) },
		func() ([]presence.Presence, error) { return s.WholePresence(ctx, []string{"alice"}) },
	} {
		if ps, err := read(); err != nil || ps[0].State == presence.Offline {
			t.Fatalf("before the flush: %v, %v", ps, err)
		}
	}
	flush()
	if _, err := s.sweepShards(ctx, []int{shardOf("alice")}, time.Now()); err != nil {
		t.Fatal(err)
	}
	sh := prefix(shardOf("alice"))
	if n, err := s.rdb.Exists(ctx, sh+"ls").Result(); err != nil || n != 1 {
		t.Fatalf("alice's shard has no sweep record after the sweep (%d, %v): the test needs one", n, err)
	}
	if n, err := s.rdb.Exists(ctx, sh+"em").Result(); err != nil || n != 1 {
		t.Fatalf("alice's shard has no loss mark after the flush and the sweep (%d, %v)", n, err)
	}
	// Alice written back (her state copy is there again), others of the
	// shard perhaps not yet.
	must(t, s.Connect(ctx, presence.Conn{ID: "c2", UserID: "alice", Device: "web"}))
	if n, err := s.rdb.Exists(ctx, sh+"sv:alice").Result(); err != nil || n != 1 {
		t.Fatalf("alice has no state copy after her connect (%d, %v): the test needs one", n, err)
	}
	for name, read := range map[string]func() ([]presence.Presence, error){
		"WholeStates":   func() ([]presence.Presence, error) { return s.WholeStates(ctx, []string{"alice"}) },
		"WholePresence": func() ([]presence.Presence, error) { return s.WholePresence(ctx, []string{"alice"}) },
	} {
		if ps, err := read(); !errors.Is(err, ErrRecovering) {
			t.Errorf("%s of a shard in its hold-off answered %v, %v; want ErrRecovering", name, ps, err)
		}
	}
}

// flushAfterRead FLUSHALLs Redis once, right after the first pipeline of a
// whole read (one that checks a sweep record) has run: a loss between a
// snapshot's two round trips.
type flushAfterRead struct {
	r    *redistest.Server
	once sync.Once
	on   atomic.Bool
}

func (f *flushAfterRead) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (f *flushAfterRead) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (f *flushAfterRead) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if f.on.Load() && checksSweepRecord(cmds) {
			f.once.Do(func() { _, _ = f.r.Do("FLUSHALL") })
		}
		return err
	}
}

// A user whose state has no copy (sv:, written before the copy existed) is
// read from its hash in a second round trip. A FLUSHALL between the two
// must not let that read answer offline: it is checked after it, too.
func TestSnapshotReadOfAUserWithoutACopyAcrossAFlush(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mkWith(t, Config{URL: r.URL(), Node: "a", TTL: 25 * time.Second, Grace: 300 * time.Millisecond,
		NodeTTL: 600 * time.Millisecond, HoldOff: time.Minute})
	must(t, s.AddMember(ctx, "t", "bob"))
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	must(t, s.Sweep(ctx))
	must(t, s.rdb.Del(ctx, prefix(shardOf("bob"))+"sv:bob").Err())
	hook := &flushAfterRead{r: r}
	s.rdb.AddHook(hook)
	hook.on.Store(true)
	ps, err := s.WholeStates(ctx, []string{"bob"})
	hook.on.Store(false)
	switch {
	case errors.Is(err, ErrRecovering):
	case err != nil:
		t.Fatal(err)
	case ps[0].State != presence.Online:
		t.Fatalf("a read across a FLUSHALL answered bob %v without an error: a snapshot would show him offline", ps[0].State)
	}
}
