package redisstore_test

import (
	"context"
	"fmt"
	"hash/crc32"
	"testing"
	"time"

	"github.com/greendot/greendot/presence"
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

// States (the snapshot read) agrees with Presence on state and version.
func TestStatesAgreeWithPresence(t *testing.T) {
	r := redistest.Start(t)
	s := newStore(t, r.URL(), storetest.Config{TTL: time.Second, Grace: time.Second, Node: "n1"})
	ctx := context.Background()
	if err := s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Connect(ctx, presence.Conn{ID: "c2", UserID: "amy", Device: "web"}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetStatus(ctx, "c2", false); err != nil {
		t.Fatal(err)
	}
	// Enough users to spread over most shards; every third one left.
	ids := []string{"bob", "amy", "nobody"}
	for i := range 60 {
		u := fmt.Sprint("user-", i)
		ids = append(ids, u)
		if err := s.Connect(ctx, presence.Conn{ID: "k" + u, UserID: u, Device: "web"}); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			if err := s.Disconnect(ctx, "k"+u, presence.Closed); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Data written before the shards' copies existed: read from the user's own hash.
	if n, err := r.Do("DEL", fmt.Sprintf("gd:{gd%d}:sv:bob", crc32.ChecksumIEEE([]byte("bob"))%32)); err != nil || n != "1" {
		t.Fatalf("HDEL bob's copy: %q, %v", n, err)
	}
	full, err := s.Presence(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	light, err := s.States(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ids {
		if full[i].State != light[i].State || full[i].Version != light[i].Version || light[i].UserID != ids[i] {
			t.Errorf("%s: presence %v v%d, states %v v%d", ids[i], full[i].State, full[i].Version, light[i].State, light[i].Version)
		}
	}
	if light[0].State != presence.Online || light[1].State != presence.Away || light[2].State != presence.Offline {
		t.Fatalf("states = %+v", light)
	}
}
