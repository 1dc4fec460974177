package server_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/server"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/memstore"
)

// frozen is a clock that never moves: the rate limit refills nothing, so a
// test can count the tokens each frame costs.
func frozen(c *server.Config) {
	t0 := time.Now()
	c.Now = func() time.Time { return t0 }
}

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprint("u", i)
	}
	return out
}

// A query costs one token per 10 ids: with a burst of 40 and no refill, a
// 400-id query spends the whole bucket, so the next frame is refused; a
// 500-id query is refused outright.
func TestQueryCostsOneTokenPerTenIDs(t *testing.T) {
	ts := startServer(t, frozen, func(c *server.Config) { c.RateBurst = 40 })
	c := ts.dialSilent(t, "alice")
	c.send(map[string]any{"type": "query", "id": "q", "user_ids": ids(400)})
	if r := c.next("query_result"); len(r["users"].([]any)) != 400 {
		t.Fatalf("400 ids: %v users", len(r["users"].([]any)))
	}
	c.send(`{"type":"heartbeat","id":"h"}`)
	c.expectError("rate_limited")

	d := ts.dialSilent(t, "dave")
	d.send(map[string]any{"type": "query", "id": "q", "user_ids": ids(500)})
	d.expectError("rate_limited")

	// A query of 10 ids or fewer costs one token, like any frame.
	e := ts.dialSilent(t, "erin")
	for range 40 {
		e.send(map[string]any{"type": "query", "id": "q", "user_ids": ids(10)})
		e.next("query_result")
	}
	e.send(map[string]any{"type": "query", "id": "q", "user_ids": ids(1)})
	e.expectError("rate_limited")
}

// countingStore counts TeamsOf calls.
type countingStore struct {
	store.Store
	teamsOf atomic.Int64
}

func (s *countingStore) TeamsOf(ctx context.Context, user string) ([]string, error) {
	s.teamsOf.Add(1)
	return s.Store.TeamsOf(ctx, user)
}

// batchingStore also reads many users' teams at once.
type batchingStore struct {
	countingStore
	batches atomic.Int64
}

func (s *batchingStore) TeamsOfMany(ctx context.Context, users []string) ([][]string, error) {
	s.batches.Add(1)
	out := make([][]string, len(users))
	for i, u := range users {
		var err error
		if out[i], err = s.Store.TeamsOf(ctx, u); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func queryStates(t *testing.T, c *wsClient, ids ...string) map[string]string {
	t.Helper()
	c.send(map[string]any{"type": "query", "id": "q", "user_ids": ids})
	r := c.next("query_result")
	out := map[string]string{}
	for _, u := range r["users"].([]any) {
		m := u.(map[string]any)
		out[m["user_id"].(string)] = m["state"].(string)
	}
	return out
}

// The ids of users connected here are checked against the hub's index, and
// each distinct other id costs one store read at most.
func TestQueryVisibilityReadsTheStoreOncePerRemoteID(t *testing.T) {
	cs := &countingStore{}
	ts := startServer(t, func(c *server.Config) { cs.Store = c.Store; c.Store = cs })
	ts.join("t1", "alice", "bob", "carol", "dave")
	ts.join("t2", "zed")
	alice := ts.dial(t, "alice")
	ts.dial(t, "bob")
	ts.dial(t, "carol")
	ts.dial(t, "zed")
	// Their online changes come first: the query's answer is the next frame.
	alice.expectChanges(time.Second, "bob=online", "carol=online")
	before := cs.teamsOf.Load()
	got := queryStates(t, alice, "bob", "carol", "zed", "dave", "dave", "dave", "nobody", "alice")
	if n := cs.teamsOf.Load() - before; n != 2 { // dave and nobody
		t.Fatalf("TeamsOf calls for one query: %d, want 2", n)
	}
	want := map[string]string{"bob": "online", "carol": "online", "zed": "unknown", "dave": "offline", "nobody": "unknown", "alice": "online"}
	for id, st := range want {
		if got[id] != st {
			t.Errorf("%s: %q, want %q (all: %v)", id, got[id], st, got)
		}
	}
}

// A store that reads teams in batches gets one call per query.
func TestQueryVisibilityUsesABatchRead(t *testing.T) {
	bs := &batchingStore{}
	ts := startServer(t, func(c *server.Config) { bs.Store = c.Store; c.Store = bs })
	ts.join("t1", "alice", "dave", "erin")
	alice := ts.dial(t, "alice")
	before, batches := bs.teamsOf.Load(), bs.batches.Load()
	got := queryStates(t, alice, "dave", "erin", "nobody")
	if n, b := bs.teamsOf.Load()-before, bs.batches.Load()-batches; n != 0 || b != 1 {
		t.Fatalf("TeamsOf calls %d, batches %d; want 0 and 1", n, b)
	}
	if got["dave"] != "offline" || got["erin"] != "offline" || got["nobody"] != "unknown" {
		t.Fatalf("states: %v", got)
	}
}

// memCounting is the memory store, TeamsOfMany included, with its team reads
// counted.
type memCounting struct {
	*memstore.Store
	teamsOf, batches, batched atomic.Int64
}

func (s *memCounting) TeamsOf(ctx context.Context, user string) ([]string, error) {
	s.teamsOf.Add(1)
	return s.Store.TeamsOf(ctx, user)
}

func (s *memCounting) TeamsOfMany(ctx context.Context, users []string) ([][]string, error) {
	s.batches.Add(1)
	s.batched.Add(int64(len(users)))
	return s.Store.TeamsOfMany(ctx, users)
}

// A query of 500 ids none of whom is connected here reads their teams in one
// batched store call, not 500 TeamsOf (500 round trips on Redis; the Redis
// store's batch is one pipeline, see redisstore's TestTeamsOfManyIsOneRoundTrip).
func TestQueryOf500IDsReadsTeamsInOneCall(t *testing.T) {
	ms := &memCounting{}
	ts := startServer(t, func(c *server.Config) {
		ms.Store = c.Store.(*memstore.Store)
		c.Store = ms
		c.RateBurst = 100 // the query costs 50 tokens
	})
	q := ids(500)
	ts.join("t1", "alice", q[7], q[499])
	alice := ts.dialSilent(t, "alice")
	before := ms.teamsOf.Load()
	got := queryStates(t, alice, q...)
	if n, b, k := ms.teamsOf.Load()-before, ms.batches.Load(), ms.batched.Load(); n != 0 || b != 1 || k != 500 {
		t.Fatalf("TeamsOf calls %d, batches %d of %d ids; want 0, 1 of 500", n, b, k)
	}
	for i, id := range q {
		want := "unknown"
		if i == 7 || i == 499 {
			want = "offline"
		}
		if got[id] != want {
			t.Fatalf("%s: %q, want %q", id, got[id], want)
		}
	}
}

// A client's WebSocket ping costs a token: with a burst of 5 and no refill,
// 5 pings get pongs, the 6th gets rate_limited and no pong, and a flood is
// closed with 1008.
func TestClientPingsAreRateLimited(t *testing.T) {
	ts := startServer(t, frozen, func(c *server.Config) { c.RateBurst = 5 })
	c := ts.dialSilent(t, "alice")
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := c.conn.Ping(ctx)
		cancel()
		if err != nil {
			t.Fatalf("ping %d: %v", i, err)
		}
	}
	pinged := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { pinged <- c.conn.Ping(ctx) }()
	c.expectError("rate_limited")
	select {
	case err := <-pinged:
		t.Fatalf("6th ping answered: %v", err)
	default:
	}
	for range 20 { // 2×burst refusals in a row close the connection
		go func() { _ = c.conn.Ping(ctx) }()
	}
	c.expectClosed(websocket.StatusPolicyViolation)
}

// A flood of queries too big for the bucket is closed like any flood
// (1008), though each one's first token passes: 81 refused in a row.
func TestQueryFloodIsClosed(t *testing.T) {
	ts := startServer(t) // a real clock: 20 tokens/s, burst 40, a 500-id query costs 50
	c := ts.dialSilent(t, "alice")
	q := map[string]any{"type": "query", "id": "q", "user_ids": ids(500)}
	for range 81 {
		c.send(q)
	}
	c.expectError("rate_limited") // once, at the start of the streak
	c.expectClosed(websocket.StatusPolicyViolation)
}
