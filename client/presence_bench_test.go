package client

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/greendot/greendot/protocol"
)

// teamSnapshot is a snapshot of n online team-mates, as a connect to a
// team of n+1 gets.
func teamSnapshot(n int) []protocol.UserState {
	users := make([]protocol.UserState, n)
	for i := range users {
		users[i] = protocol.UserState{UserID: fmt.Sprintf("user-%05d", i), State: protocol.StateOnline, Version: uint64(i + 1), Since: 1764500000000}
	}
	return users
}

// BenchmarkApplySnapshot is a connect's snapshot of 99 team-mates applied
// to a fresh map; B/held is what the map keeps per user, the figure a load
// process holding thousands of clients multiplies.
func BenchmarkApplySnapshot(b *testing.B) {
	users := teamSnapshot(99)
	now := time.Now()
	b.ReportAllocs()
	maps := make([]*presenceMap, 0, 1000)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; b.Loop(); i++ {
		m := newPresenceMap()
		m.applySnapshot(users, now)
		if len(maps) < cap(maps) {
			maps = append(maps, m)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(len(maps)*len(users)), "B/held")
	runtime.KeepAlive(maps)
}

// BenchmarkApplyChanges is one presence frame of one change, newer than
// what the map holds, applied to a map of 99 users.
func BenchmarkApplyChanges(b *testing.B) {
	m := newPresenceMap()
	m.applySnapshot(teamSnapshot(99), time.Now())
	ch := []protocol.Change{{UserID: "user-00042", State: protocol.StateAway, At: 1764500001000}}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		ch[0].Version = uint64(1000 + i)
		m.applyChanges(ch, time.Now())
	}
}
