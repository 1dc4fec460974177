package redisstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// resyncRec records resyncs and what each change's floor was.
type resyncRec struct {
	rec
	mu     sync.Mutex
	floors []func(string) uint64
}

func (r *resyncRec) OnResync(floor func(string) uint64) {
	r.mu.Lock()
	r.floors = append(r.floors, floor)
	r.mu.Unlock()
}

func (r *resyncRec) resyncs() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.floors)
}

func mkResync(t *testing.T, url, node string) (*Store, *resyncRec) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := New(ctx, Config{URL: url, Node: node, TTL: 5 * time.Second, Grace: time.Second,
		NodeTTL: 600 * time.Millisecond, HoldOff: 300 * time.Millisecond, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	r := &resyncRec{}
	s.Subscribe(r)
	s.SetObserver(r)
	if err := s.Watch(ctx, []string{"t", "u", "v"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, r
}

// A Redis outage ends in one resync of the viewers. go-redis subscribes
// again by itself when Redis is back, which asks for a resync too; recovery
// used to resync, then the health check resynced again for those
// subscriptions, a few milliseconds later: the heaviest fan-out there is,
// twice, just as every node comes back.
func TestOutageEndsInOneResync(t *testing.T) {
	for round := 0; round < 3; round++ {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			r := redistest.Start(t)
			s, h := mkResync(t, r.URL(), "a")
			must(t, s.AddMember(context.Background(), "t", "bob"))
			must(t, s.Connect(context.Background(), presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
			r.Stop()
			testwait.For(t, 5*time.Second, func() error {
				if s.Ping(context.Background()) == nil {
					return fmt.Errorf("still ready with Redis stopped")
				}
				return nil
			})
			r.Restart()
			testwait.For(t, 10*time.Second, func() error {
				if err := s.Ping(context.Background()); err != nil {
					return err
				}
				if h.resyncs() == 0 {
					return fmt.Errorf("no resync yet")
				}
				return nil
			})
			// Long enough for go-redis's own re-subscriptions (it retries
			// every 100 ms) and a few health checks (every 250 ms).
			time.Sleep(1500 * time.Millisecond)
			if n := h.resyncs(); n != 1 {
				t.Fatalf("%d resyncs after one outage, want 1", n)
			}
		})
	}
}

// Every change published after a resync's floor was taken carries a version
// above it, on every shard, so a state sent at the floor never hides a
// later change.
func TestVersionsAfterAResyncExceedItsFloor(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	s, h := mkResync(t, c.URL(), "a")
	ctx := context.Background()
	users := make([]string, 0, 64)
	for i := 0; len(users) < cap(users); i++ {
		users = append(users, fmt.Sprint("user", i)) // spread over every shard
	}
	s.resync()
	testwait.For(t, 5*time.Second, func() error {
		if h.resyncs() != 1 {
			return fmt.Errorf("%d resyncs", h.resyncs())
		}
		return nil
	})
	h.mu.Lock()
	floor := h.floors[0]
	h.mu.Unlock()
	for i, u := range users {
		must(t, s.Connect(ctx, presence.Conn{ID: fmt.Sprint("c", i), UserID: u, Device: "web"}))
	}
	ps, err := s.States(ctx, users)
	must(t, err)
	for _, p := range ps {
		if p.Version <= floor(p.UserID) {
			t.Errorf("%s online at version %d, not above the floor %d its viewers may hold", p.UserID, p.Version, floor(p.UserID))
		}
	}
}

var _ store.Resyncer = (*resyncRec)(nil)

// A user whose devices all go at once (their node is lost, or the node
// reaps them in one tick) stays as they were through the grace, then goes
// offline: never away in between because the active device happened to be
// ended first (the sweep took a dead node's connections one by one).
func TestDevicesEndedTogetherPublishNoStateBetween(t *testing.T) {
	ctx := context.Background()
	for _, how := range []string{"node lost", "expired together"} {
		t.Run(how, func(t *testing.T) {
			for round := 0; round < 5; round++ {
				r := redistest.Start(t)
				a, h := mk(t, r.URL(), "a", time.Second, 300*time.Millisecond)
				b, _ := mk(t, r.URL(), "b", time.Second, 300*time.Millisecond)
				must(t, a.AddMember(ctx, "t", "bob"))
				for _, id := range []string{"c1", "c2", "c3"} {
					must(t, b.Connect(ctx, presence.Conn{ID: id, UserID: "bob", Device: id}))
				}
				must(t, b.SetStatus(ctx, "c2", false))
				must(t, b.SetStatus(ctx, "c3", false))
				waitHist(t, h, 2*time.Second, a, "bob=online")
				if how == "node lost" {
					kill9(b)
				} else {
					time.Sleep(1100 * time.Millisecond) // past the ttl: Redis's clock must pass it
					must(t, b.Disconnect(ctx, "c1", presence.Expired))
				}
				waitHist(t, h, 5*time.Second, a, "bob=online bob=offline")
			}
		})
	}
}

// After Redis lost its data, the first node to notice must not resync its
// viewers before the others have written their connections back: it would
// read their users as gone and tell its viewers they went offline (the
// chaos test saw it after every FLUSHALL and empty restart).
func TestResyncAfterDataLossWaitsForTheOtherNodes(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	// a notices the loss within a beat of 200 ms; b only within 1 s.
	a, err := New(ctx, Config{URL: r.URL(), Node: "a", TTL: 10 * time.Second, Grace: time.Second,
		NodeTTL: 600 * time.Millisecond, HoldOff: 2 * time.Second, Logger: logger()})
	must(t, err)
	t.Cleanup(func() { _ = a.Close() })
	b, _ := mkWith(t, Config{URL: r.URL(), Node: "b", TTL: 10 * time.Second, Grace: time.Second,
		NodeTTL: 3 * time.Second, HoldOff: 5 * time.Second})
	seenAt := make(chan presence.State, 4)
	a.Subscribe(resyncProbe{rec: &rec{}, probe: func() {
		ps, err := a.States(ctx, []string{"bob"})
		if err == nil {
			seenAt <- ps[0].State
		}
	}})
	must(t, a.Watch(ctx, []string{"t"}))
	must(t, b.AddMember(ctx, "t", "bob"))
	must(t, b.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	must(t, b.Heartbeat(ctx, "c1")) // b writes it back at its next batch after the loss
	if _, err := r.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { // b's client keeps heartbeating, as a live one does
		defer close(done)
		for {
			_ = b.Heartbeat(ctx, "c1")
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	defer func() { close(stop); <-done }()
	select {
	case s := <-seenAt:
		if s != presence.Online {
			t.Fatalf("a resynced while Redis still had bob %v: its viewers would be told bob went offline", s)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("a never resynced after the FLUSHALL")
	}
}

// resyncProbe runs probe at each resync.
type resyncProbe struct {
	*rec
	probe func()
}

func (p resyncProbe) OnResync(func(string) uint64) { p.probe() }

// After Redis lost its data the node's reads stay refused (Intact) until
// its own resync has been asked for, not only until the shards' hold-off
// mark expires: the node waits out a hold-off of its own from when it
// recovered, and until it resyncs, what the server holds of the
// membership may be the one from before the loss.
func TestIntactOnlyAfterTheResyncOfALoss(t *testing.T) {
	r := redistest.Start(t)
	s, h := mkResync(t, r.URL(), "a")
	must(t, s.Connect(context.Background(), presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	testwait.For(t, 5*time.Second, func() error { return s.Intact() })
	before := h.resyncs()
	r.Stop()
	r.Restart() // empty: no persistence
	testwait.For(t, 10*time.Second, func() error {
		_ = s.Sweep(context.Background()) // marks the emptied shards
		if s.Intact() == nil {
			return fmt.Errorf("the loss is not seen yet")
		}
		return nil
	})
	// The node finds itself missing at its next beat, recovers, waits out
	// its hold-off and resyncs; the shards' mark expires meanwhile.
	testwait.For(t, 10*time.Second, func() error {
		_ = s.Sweep(context.Background()) // the server sweeps; here the test does
		if s.Intact() == nil {
			if h.resyncs() == before {
				t.Fatalf("reads were allowed again before the node's resync after the loss")
			}
			return nil
		}
		return fmt.Errorf("still recovering")
	})
}
