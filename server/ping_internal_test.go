package server

import (
	"testing"
	"time"
)

// wheelAt is a wheel whose connections' silence is measured on a clock the
// test sets; the wheel's own ticks are turned by hand.
func wheelAt(t testing.TB, ttl, ping time.Duration) (*livenessWheel, *time.Time) {
	t.Helper()
	now := time.Unix(1_000_000, 0)
	s := &Server{cfg: Config{TTL: ttl, PingInterval: ping, Now: func() time.Time { return now }}}
	s.live = newLivenessWheel(s)
	return s.live, &now
}

func (w *livenessWheel) slotOf(c *client) (int, bool) {
	for i, sl := range w.slots {
		for _, x := range sl {
			if x == c {
				return i, true
			}
		}
	}
	return 0, false
}

func (w *livenessWheel) pending() int {
	n := 0
	for _, sl := range w.slots {
		n += len(sl)
	}
	return n
}

func TestWheelTick(t *testing.T) {
	for _, tc := range []struct{ span, want time.Duration }{
		{10 * time.Second, 100 * time.Millisecond}, // the defaults: lateness at most 100ms
		{time.Second, 50 * time.Millisecond},
		{10 * time.Millisecond, time.Millisecond},
	} {
		if got := wheelTick(tc.span); got != tc.want {
			t.Errorf("wheelTick(%v) = %v, want %v", tc.span, got, tc.want)
		}
	}
}

// A check waits in the slot of its due tick, is looked at then and not
// before, and goes again where its silence says.
func TestWheelChecksWhenDue(t *testing.T) {
	w, now := wheelAt(t, time.Second, 400*time.Millisecond) // tick 20ms
	c := &client{srv: w.srv}
	c.lastFrame.Store(now.UnixNano())
	w.addLocked(c, c.untilDue(0), 0) // the ping interval: tick 20
	if i, ok := w.slotOf(c); !ok || i != 20%len(w.slots) {
		t.Fatalf("check in slot %d (%v), want %d", i, ok, 20%len(w.slots))
	}
	w.turn(19, nil)
	if i, _ := w.slotOf(c); i != 20%len(w.slots) {
		t.Fatalf("check moved to slot %d before its tick", i)
	}
	// A frame 100ms before the check: the next one is 300ms (15 ticks) on.
	*now = now.Add(400 * time.Millisecond)
	c.lastFrame.Store(now.Add(-100 * time.Millisecond).UnixNano())
	w.turn(20, nil)
	if i, ok := w.slotOf(c); !ok || i != 35%len(w.slots) {
		t.Fatalf("after its check: slot %d (%v), want %d", i, ok, 35%len(w.slots))
	}
	if n := w.pending(); n != 1 {
		t.Fatalf("%d checks pending, want 1", n)
	}
}

// A closed connection leaves the wheel at its next check; a loop behind by
// many ticks catches up in one turn.
func TestWheelDropsClosedAndCatchesUp(t *testing.T) {
	w, now := wheelAt(t, time.Second, 400*time.Millisecond)
	live, gone := &client{srv: w.srv}, &client{srv: w.srv}
	for _, c := range []*client{live, gone} {
		c.lastFrame.Store(now.UnixNano())
		w.addLocked(c, c.untilDue(0), 0)
	}
	gone.closed.Store(true)
	*now = now.Add(390 * time.Millisecond)
	live.lastFrame.Store(now.UnixNano()) // heartbeats on
	w.turn(int64(3*len(w.slots)), nil)   // three laps late
	if _, ok := w.slotOf(gone); ok {
		t.Fatal("the closed connection is still in the wheel")
	}
	if _, ok := w.slotOf(live); !ok {
		t.Fatal("the live connection fell out of the wheel")
	}
	if w.at != int64(3*len(w.slots)) {
		t.Fatalf("wheel at tick %d, want %d", w.at, 3*len(w.slots))
	}
}

// BenchmarkLivenessWheel is the idle node's liveness work: 10,000
// connections that heartbeat, each checked once per ping interval.
// Reported per check.
func BenchmarkLivenessWheel(b *testing.B) {
	const conns = 10000
	w, now := wheelAt(b, 25*time.Second, 10*time.Second)
	cs := make([]*client, conns)
	for i := range cs {
		cs[i] = &client{srv: w.srv}
		cs[i].lastFrame.Store(now.UnixNano())
		w.addLocked(cs[i], cs[i].untilDue(0)*time.Duration(i)/conns, 0) // spread over the interval
	}
	var again []wheelCheck
	b.ReportAllocs()
	b.ResetTimer()
	checked := 0
	for checked < b.N {
		*now = now.Add(w.tick)
		for _, c := range w.slots[(w.at+1)%int64(len(w.slots))] {
			c.lastFrame.Store(now.Add(-time.Second).UnixNano()) // heard from a second ago
			checked++
		}
		again = w.turn(w.at+1, again)
	}
}
