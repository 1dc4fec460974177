package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// A grace and a status that both ended before a sweep are taken in the
// order they fell due: here the grace first (a dead node's connection,
// released by a's sweep), so the user goes offline and the status's end
// after it changes nothing viewers see. Taken the other way round, the
// status's end would first show the user online again.
func TestSweepTakesGraceEndsAndStatusExpiriesInOrder(t *testing.T) {
	r := redistest.Start(t)
	// Sweeps may pause up to a second (two thirds of the node ttl) without
	// starting a hold-off.
	a, h, b := twoGraceNodes(t, r.URL(), 300*time.Millisecond, 1500*time.Millisecond)
	ctx := context.Background()
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

// An offline that a sweep decides past the grace end reports how late it
// came, on Redis's clock: here the node that disconnected bob dies before
// its own sweep at the grace end, and a sweeps late on purpose.
func TestSweepReportsHowLateAGraceEndedOffline(t *testing.T) {
	r := redistest.Start(t)
	// A sweep more than two thirds of the node ttl after the shard's last
	// one holds graces off; one within ownedSweepMax of a's last sweep
	// skips the shard: the wait is between the two, with margin.
	const grace, late = 300 * time.Millisecond, 600 * time.Millisecond
	a, h, b := twoGraceNodes(t, r.URL(), grace, 3*time.Second)
	ctx := context.Background()
	must(t, b.Connect(ctx, presence.Conn{ID: "b1", UserID: "bob", Device: "web"}))
	before := time.Now()
	must(t, b.Disconnect(ctx, "b1", presence.Closed))
	after := time.Now()
	kill9(b) // its sweep at the grace end finds it closed and does nothing
	for time.Now().Before(after.Add(grace + late)) {
		time.Sleep(10 * time.Millisecond) // the grace ends with no sweep
	}
	must(t, a.Sweep(ctx))
	upper := time.Since(before) - grace
	testwait.For(t, 2*time.Second, func() error {
		if got, want := fmt.Sprint(h.hist()), "[bob=online bob=offline]"; got != want {
			return fmt.Errorf("bob's changes %s, want %s", got, want)
		}
		return nil
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	// Redis counts in whole milliseconds.
	if lags := h.glag; len(lags) != 1 || lags[0] < late-time.Millisecond || lags[0] > upper+time.Millisecond {
		t.Fatalf("grace lags %v, want one in [%v, %v]", lags, late, upper)
	}
}

// With no grace, the disconnecting node's own sweep publishes the offline:
// it does not wait for the shard's next regular sweep (nothing sweeps here
// but the stores themselves).
func TestZeroGraceOfflineComesWithoutARegularSweep(t *testing.T) {
	r := redistest.Start(t)
	a, h := mk(t, r.URL(), "a", 10*time.Second, 0)
	ctx := context.Background()
	must(t, a.AddMember(ctx, "t", "bob"))
	must(t, a.Connect(ctx, presence.Conn{ID: "b1", UserID: "bob", Device: "web"}))
	must(t, a.Disconnect(ctx, "b1", presence.Closed))
	testwait.For(t, 2*time.Second, func() error {
		if got, want := fmt.Sprint(h.hist()), "[bob=online bob=offline]"; got != want {
			return fmt.Errorf("bob's changes %s, want %s", got, want)
		}
		return nil
	})
}

// twoGraceNodes starts nodes a (recording) and b on url with grace and
// nodeTTL, bob a member of team t.
func twoGraceNodes(t *testing.T, url string, grace, nodeTTL time.Duration) (a *Store, h *rec, b *Store) {
	t.Helper()
	node := func(name string) (*Store, *rec) {
		return mkWith(t, Config{URL: url, Node: name, TTL: 10 * time.Second, Grace: grace,
			NodeTTL: nodeTTL, HoldOff: 300 * time.Millisecond})
	}
	a, h = node("a")
	b, _ = node("b")
	must(t, a.AddMember(context.Background(), "t", "bob"))
	return a, h, b
}
