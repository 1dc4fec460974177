package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// Heartbeats of connections Redis no longer knows re-assert them in one
// pipeline. A node taken for dead under load (a 100,000-connection run on
// a starved machine) had every id of a flush come back missing and wrote
// them back one round trip each, thousands per flush, which kept Redis
// and the flush loop behind.
func TestMissingHeartbeatsReassertInOnePipeline(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", 10*time.Second, 300*time.Millisecond)
	const n = 200
	for i := range n {
		must(t, s.Connect(ctx, presence.Conn{ID: fmt.Sprint("c", i), UserID: fmt.Sprint("u", i), Device: "web"}))
	}
	// Redis forgets the deadlines only: the node stays healthy, so the
	// flush is what writes them back.
	for sh := range numShards {
		if _, err := r.Do("DEL", shardKeys(sh)[0]); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		must(t, s.Heartbeat(ctx, fmt.Sprint("c", i)))
	}
	trips := &roundTrips{}
	s.rdb.AddHook(trips)
	s.flushHeartbeats(counted(ctx)) // the store's own loops use the client meanwhile
	got := trips.n.Load()
	known := 0
	for sh := range numShards {
		v, err := r.Do("ZCARD", shardKeys(sh)[0])
		if err != nil {
			t.Fatal(err)
		}
		var k int
		fmt.Sscan(v, &k)
		known += k
	}
	if known != n {
		t.Fatalf("after the flush Redis knows %d of the %d live connections", known, n)
	}
	// The heartbeats' pipeline and the re-assertions' (each may be sent
	// twice if Redis lost the script).
	if got > 4 {
		t.Fatalf("re-asserting %d missing connections took %d round trips (%v); want the heartbeats' pipeline and one more", n, got, trips)
	}
}
