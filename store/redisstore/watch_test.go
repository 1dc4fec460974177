package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/greendot/greendot/store/redisstore/redistest"
	"github.com/greendot/greendot/store/storetest"
)

// A node subscribes to a team's channel while it watches the team, and
// unsubscribes when the last watch ends.
func TestWatchSubscribesOnlyWhatIsNeeded(t *testing.T) {
	r := redistest.Start(t)
	s := newStore(t, r.URL(), storetest.Config{TTL: time.Second, Grace: time.Second, Node: "n1"})
	ctx := context.Background()
	subscribed := func(want bool) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for {
			list, err := r.DoList("PUBSUB", "SHARDCHANNELS", "*:t:red")
			if err != nil {
				t.Fatal(err)
			}
			if (len(list) == 1) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("shard channels for team red: %v, want subscribed=%v", list, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	subscribed(false)
	if err := s.Watch(ctx, []string{"red", "blue"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Watch(ctx, []string{"red"}); err != nil {
		t.Fatal(err)
	}
	subscribed(true)
	s.Unwatch([]string{"red"})
	subscribed(true) // one watch is left
	s.Unwatch([]string{"red"})
	subscribed(false)
	// An unwatch that overtakes its watch cancels it.
	s.Unwatch([]string{"red"})
	if err := s.Watch(ctx, []string{"red"}); err != nil {
		t.Fatal(err)
	}
	subscribed(false)
}
