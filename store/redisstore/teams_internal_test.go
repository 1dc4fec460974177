package redisstore

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/greendot/greendot/store/redisstore/redistest"
)

// tripCounter counts the round trips made with a context it tagged: single
// commands and pipelines, each one trip to one Redis.
type tripCounter struct {
	commands, pipelines, pipelined atomic.Int64
}

type tripKey struct{}

func (c *tripCounter) tag(ctx context.Context) context.Context {
	return context.WithValue(ctx, tripKey{}, c)
}

func (c *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if ctx.Value(tripKey{}) == c {
			c.commands.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (c *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if ctx.Value(tripKey{}) == c {
			c.pipelines.Add(1)
			c.pipelined.Add(int64(len(cmds)))
		}
		return next(ctx, cmds)
	}
}

// teamsOfManyTrips gives 500 users teams, reads them back with TeamsOfMany
// through a counter hooked where commands reach a Redis (each node's client
// on a cluster), checks the answers against TeamsOf and returns the count.
func teamsOfManyTrips(t *testing.T, s *Store) *tripCounter {
	t.Helper()
	ctx := context.Background()
	users := make([]string, 500)
	for i := range users {
		users[i] = fmt.Sprint("user-", i)
		if i%5 != 0 { // every fifth is in no team
			must(t, s.AddMember(ctx, fmt.Sprint("t", i%3), users[i]))
		}
	}
	c := &tripCounter{}
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		must(t, cc.ForEachShard(ctx, func(_ context.Context, node *redis.Client) error {
			node.AddHook(c)
			return nil
		}))
	} else {
		s.rdb.AddHook(c)
	}
	got, err := s.TeamsOfMany(c.tag(ctx), users)
	must(t, err)
	if len(got) != len(users) {
		t.Fatalf("%d users: %d answers", len(users), len(got))
	}
	for i, u := range users {
		want, err := s.TeamsOf(ctx, u)
		must(t, err)
		if !slices.Equal(got[i], want) || (i%5 == 0) != (got[i] == nil) {
			t.Fatalf("teams of %s: %q, TeamsOf says %q", u, got[i], want)
		}
	}
	return c
}

// The teams of the 500 ids of a query cost one round trip, not 500.
func TestTeamsOfManyIsOneRoundTrip(t *testing.T) {
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", time.Second, 0)
	c := teamsOfManyTrips(t, s)
	if c.commands.Load() != 0 || c.pipelines.Load() != 1 || c.pipelined.Load() != 500 {
		t.Fatalf("single commands %d, pipelines %d of %d commands; want 0, 1 of 500",
			c.commands.Load(), c.pipelines.Load(), c.pipelined.Load())
	}
}

// On a cluster, one round trip per node: the users' keys spread over every
// node's slots.
func TestTeamsOfManyIsOneRoundTripPerClusterNode(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	s, _ := mk(t, cl.URL(), "a", time.Second, 0)
	c := teamsOfManyTrips(t, s)
	if c.commands.Load() != 0 || c.pipelines.Load() != 3 || c.pipelined.Load() != 500 {
		t.Fatalf("single commands %d, pipelines %d of %d commands; want 0, 3 (one per node) of 500",
			c.commands.Load(), c.pipelines.Load(), c.pipelined.Load())
	}
}
