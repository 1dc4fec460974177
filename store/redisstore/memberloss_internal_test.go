package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// joins records the state each membership event carries.
type joins struct {
	rec
	mu  sync.Mutex
	evs []store.MembershipEvent
}

func (j *joins) OnMembership(ev store.MembershipEvent) {
	j.mu.Lock()
	ev.UserTeams = nil // valid only while the handler runs
	j.evs = append(j.evs, ev)
	j.mu.Unlock()
}

func (j *joins) of(team, user string) []store.MembershipEvent {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []store.MembershipEvent
	for _, ev := range j.evs {
		if ev.Team == team && ev.UserID == user {
			out = append(out, ev)
		}
	}
	return out
}

// A join published while Redis has lost the user's keys, before their
// node writes them back, carried "offline at version 0": every viewer
// seeing the user again through the join was pushed it, below the version
// it held (chaos, cluster: u17=offline v0 after a join during a FLUSHALL).
// The event waits (off the caller) for a whole read, and carries the state
// written back.
func TestJoinDuringALossCarriesTheStateWrittenBack(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	cfg := func(node string) Config {
		return Config{URL: r.URL(), Node: node, TTL: 10 * time.Second, Grace: 100 * time.Millisecond,
			NodeTTL: 600 * time.Millisecond, HoldOff: 1500 * time.Millisecond, Logger: logger()}
	}
	a, _ := mkWith(t, cfg("a"))
	b, _ := mkWith(t, cfg("b"))
	j := &joins{}
	b.Subscribe(j)
	must(t, a.AddMember(ctx, "t", "bob"))
	must(t, b.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	ps, err := b.Presence(ctx, []string{"bob"})
	must(t, err)
	before := ps[0].Version
	if ps[0].State != presence.Online || before == 0 {
		t.Fatalf("bob = %+v before the loss, want online", ps[0])
	}
	if _, err := r.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	// The call returns once the membership is written; its event follows
	// when bob's state reads whole again.
	must(t, a.AddMember(ctx, "t2", "bob"))
	var evs []store.MembershipEvent
	testwait.For(t, 10*time.Second, func() error {
		_ = a.Sweep(ctx) // as the nodes' loops do every 100 ms
		_ = b.Sweep(ctx)
		if evs = j.of("t2", "bob"); len(evs) == 0 {
			return errors.New("no event of the join reached b")
		}
		return nil
	})
	for _, ev := range evs {
		if ev.State != presence.Online || ev.Version <= before {
			t.Fatalf("the join of t2 carried bob %v v%d; b holds his connection at v%d or later", ev.State, ev.Version, before)
		}
	}
}

// A join written during a loss and undone before the loss's hold-off ended
// was published late as a join, after the removal's event: the deferred
// event read the membership before waiting out the hold-off, and every node
// showed the user to the team they had left (chaos, one Redis: u06 was sent
// u17=offline 1.8 s after u17 left their only shared team, FLUSHALL seed
// 75115219). The membership is read once the state reads whole.
func TestJoinUndoneDuringALossIsNotPublishedAfterTheRemoval(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	cfg := func(node string) Config {
		return Config{URL: r.URL(), Node: node, TTL: 10 * time.Second, Grace: 100 * time.Millisecond,
			NodeTTL: 600 * time.Millisecond, HoldOff: 1500 * time.Millisecond, Logger: logger()}
	}
	a, _ := mkWith(t, cfg("a"))
	b, _ := mkWith(t, cfg("b"))
	j := &joins{}
	b.Subscribe(j)
	must(t, a.AddMember(ctx, "t", "bob"))
	must(t, b.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	if _, err := r.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{}, 1)
	a.deferWaiting = func(team, user string) { waiting <- struct{}{} }
	must(t, a.AddMember(ctx, "t2", "bob")) // its event waits for the loss to be written back
	select {
	case <-waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the join's event was not deferred: the loss was not noticed")
	}
	must(t, a.RemoveMember(ctx, "t2", "bob"))
	leaves := func(evs []store.MembershipEvent) int {
		n := 0
		for _, ev := range evs {
			if !ev.Joined {
				n++
			}
		}
		return n
	}
	var evs []store.MembershipEvent
	// The removal's own event, then the deferred one's, which tells the
	// membership as it is once it is published.
	testwait.For(t, 10*time.Second, func() error {
		_ = a.Sweep(ctx) // as the nodes' loops do every 100 ms
		_ = b.Sweep(ctx)
		if evs = j.of("t2", "bob"); leaves(evs) < 2 {
			return fmt.Errorf("events of t2/bob at b: %+v, want two leaves", evs)
		}
		return nil
	})
	left := false
	for _, ev := range evs {
		if left && ev.Joined {
			t.Fatalf("b was told bob joined t2 after his removal: %+v", evs)
		}
		left = left || !ev.Joined
	}
}
