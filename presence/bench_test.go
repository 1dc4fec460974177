package presence_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/greendot/greendot/presence"
)

// Benchmarks of the core transitions, each amid 10,000 present users so
// that maps and heaps have a realistic size.

var start = time.Unix(1_764_500_000, 0)

func crowd(b *testing.B, grace time.Duration) *presence.Tracker {
	b.Helper()
	return crowdWith(b, presence.Config{Grace: grace})
}

func crowdWith(b *testing.B, cfg presence.Config) *presence.Tracker {
	b.Helper()
	// A ttl no iteration reaches: the crowd stays present throughout.
	cfg.TTL = 10000 * time.Hour
	tr := presence.NewTracker(cfg)
	for i := range 10000 {
		id := "u" + strconv.Itoa(i)
		if _, err := tr.Connect(start, presence.Conn{ID: "c" + id, UserID: id, Device: "web"}); err != nil {
			b.Fatal(err)
		}
	}
	return tr
}

// A device reconnects within the grace: the grace is cancelled, nothing
// is published.
func BenchmarkReconnectWithinGrace(b *testing.B) {
	tr := crowd(b, 5*time.Second)
	now := start
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now = now.Add(time.Microsecond)
		id := "x" + strconv.Itoa(i&1)
		if _, err := tr.Connect(now, presence.Conn{ID: id, UserID: "bob", Device: "web"}); err != nil {
			b.Fatal(err)
		}
		if _, err := tr.Disconnect(now, id, presence.Closed); err != nil {
			b.Fatal(err)
		}
		tr.Advance(now)
	}
}

// A user comes (online) and goes (offline once the grace is over): two
// published changes per iteration.
func BenchmarkOnlineOffline(b *testing.B) {
	const grace = time.Second
	tr := crowd(b, grace)
	now := start
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		out, _ := tr.Connect(now, presence.Conn{ID: "c", UserID: "bob", Device: "web"})
		_, _ = tr.Disconnect(now, "c", presence.Closed)
		now = now.Add(grace)
		off := tr.Advance(now)
		if len(out.Changes) != 1 || len(off.Changes) != 1 {
			b.Fatalf("%d changes, then %d; want 1 and 1", len(out.Changes), len(off.Changes))
		}
	}
}

// As BenchmarkOnlineOffline, with forgetting on (the default 720h): each
// offline queues the user to be forgotten, each comeback takes it out.
func BenchmarkOnlineOfflineForgetting(b *testing.B) {
	const grace = time.Second
	tr := crowdWith(b, presence.Config{Grace: grace, ForgetAfter: 720 * time.Hour})
	now := start
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		out, _ := tr.Connect(now, presence.Conn{ID: "c", UserID: "bob", Device: "web"})
		_, _ = tr.Disconnect(now, "c", presence.Closed)
		now = now.Add(grace)
		off := tr.Advance(now)
		if len(out.Changes) != 1 || len(off.Changes) != 1 {
			b.Fatalf("%d changes, then %d; want 1 and 1", len(out.Changes), len(off.Changes))
		}
	}
}

// A device switches between active and idle: one change each time.
func BenchmarkStatusFlip(b *testing.B) {
	tr := crowd(b, time.Second)
	now := start
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now = now.Add(time.Microsecond)
		if _, err := tr.SetStatus(now, "cu42", i&1 == 1); err != nil {
			b.Fatal(err)
		}
	}
}

// Connections expire in bulk in one Advance; the figure is per connection.
func BenchmarkExpire(b *testing.B) {
	tr := presence.NewTracker(presence.Config{TTL: time.Second, Grace: 0})
	for i := range b.N {
		id := strconv.Itoa(i)
		_, _ = tr.Connect(start, presence.Conn{ID: id, UserID: id, Device: "web"})
	}
	b.ReportAllocs()
	b.ResetTimer()
	out := tr.Advance(start.Add(2 * time.Second))
	if len(out.Expired) != b.N {
		b.Fatalf("expired %d of %d", len(out.Expired), b.N)
	}
}

// An idle crowd's ttl, one op a round of 1,000 connections: each is heard
// from, then Advance finds its old deadline due and pushes it again (the
// lazy refresh every idle connection costs once per ttl).
func BenchmarkAdvanceRefresh(b *testing.B) {
	const n, ttl = 1000, 10 * time.Second
	tr := presence.NewTracker(presence.Config{TTL: ttl})
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "c" + strconv.Itoa(i)
		if _, err := tr.Connect(start, presence.Conn{ID: ids[i], UserID: "u" + strconv.Itoa(i), Device: "web"}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	round := 0
	for b.Loop() {
		round++
		due := start.Add(time.Duration(round) * ttl)
		// Heard from at different moments, as a crowd is: the deadlines
		// differ, so the heap's steps are not the one comparison of ties.
		for i, id := range ids {
			if err := tr.Heartbeat(due.Add(-time.Second-time.Duration(i)*time.Millisecond), id); err != nil {
				b.Fatal(err)
			}
		}
		if out := tr.Advance(due); len(out.Expired) != 0 {
			b.Fatalf("round %d expired %d connections heard from", round, len(out.Expired))
		}
	}
}
