package server

import (
	"sync"
	"time"

	"github.com/lesismal/nbio/nbhttp/websocket"
)

// Each connection's silence is checked when it is due, and nothing scans
// them all: at PingInterval of silence the server pings it, and at the ttl
// it closes the socket. Server-sent pings make liveness independent of the
// client's timers. A browser answers a WebSocket ping from its network
// stack, without running page code, so a tab whose timers it throttles (a
// hidden tab's chained timers run once a minute after five minutes) still
// shows a sign of life within the ttl: the pong handler counts a pong like
// any frame. Only a connection silent for PingInterval is pinged, so one
// that heartbeats costs nothing but its check.
//
// The checks wait in a timing wheel, one slot per tick, turned by one
// goroutine. A runtime timer per connection fired about once per heartbeat
// interval each, and every firing started a goroutine and woke an idle
// core: at 10,000 idle connections that was a thousand wake-ups a second.
// A check runs up to one tick late (wheelTick), so a ping or a close comes
// at most that much after its due time.

// maxWheelTick bounds the lateness of a check at the defaults (10 s
// interval, 25 s ttl); shorter intervals get a finer tick (wheelTick).
const maxWheelTick = 100 * time.Millisecond

// wheelTick is the wheel's tick for a longest wait of span: a twentieth of
// it, at most maxWheelTick, at least a millisecond.
func wheelTick(span time.Duration) time.Duration {
	return min(max(span/20, time.Millisecond), maxWheelTick)
}

// livenessWheel holds each live connection's next silence check, in the
// slot of the tick it is due at. Its loop runs on a goroutine owned by the
// Server and stopped by Shutdown.
type livenessWheel struct {
	srv  *Server
	tick time.Duration

	mu    sync.Mutex
	start time.Time   // tick 0; monotonic
	at    int64       // the last tick whose slot was taken; guarded by mu
	slots [][]*client // slot of tick n: slots[n%len]; guarded by mu
	spare []*client   // the slot taken before, emptied, for reuse; guarded by mu
}

func newLivenessWheel(s *Server) *livenessWheel {
	span := s.cfg.TTL
	if d := s.cfg.PingInterval; d > 0 {
		span = min(span, d)
	}
	tick := wheelTick(span)
	// untilDue never exceeds span: a check lands at most span/tick + 1
	// ticks ahead, and one more slot keeps it off the slot being taken.
	n := int(span/tick) + 3
	return &livenessWheel{srv: s, tick: tick, start: time.Now(), slots: make([][]*client, n)}
}

// add schedules c's check after d (rounded up to whole ticks, at least one).
func (w *livenessWheel) add(c *client, d time.Duration) {
	w.mu.Lock()
	// From now, not from w.at: the loop may be a tick or two behind.
	w.addLocked(c, d, int64(time.Since(w.start)/w.tick))
	w.mu.Unlock()
}

// addLocked schedules c's check after d from tick from.
func (w *livenessWheel) addLocked(c *client, d time.Duration, from int64) {
	due := from + int64((d+w.tick-1)/w.tick)
	due = max(due, w.at+1)
	// Never onto the slot being taken: a wait longer than the wheel, which
	// untilDue never asks for, would come early, and be checked again.
	due = min(due, w.at+int64(len(w.slots))-1)
	i := due % int64(len(w.slots))
	w.slots[i] = append(w.slots[i], c)
}

// loop turns the wheel at each tick; its buffer of checks is reused.
func (w *livenessWheel) loop() {
	defer w.srv.wg.Done()
	t := time.NewTicker(w.tick)
	defer t.Stop()
	var again []wheelCheck
	for {
		select {
		case <-w.srv.stop:
			return
		case <-t.C:
		}
		again = w.turn(int64(time.Since(w.start)/w.tick), again)
	}
}

type wheelCheck struct {
	c    *client
	next time.Duration
}

// turn checks the connections due up to tick now, and schedules again
// those still live. A loop behind by a few ticks catches up here.
func (w *livenessWheel) turn(now int64, again []wheelCheck) []wheelCheck {
	for {
		w.mu.Lock()
		if w.at >= now {
			w.mu.Unlock()
			return again
		}
		w.at++
		i := w.at % int64(len(w.slots))
		due := w.slots[i]
		w.slots[i] = w.spare[:0]
		w.mu.Unlock()
		for _, c := range due {
			if next, live := c.checkSilence(); live {
				again = append(again, wheelCheck{c, next})
			}
		}
		w.mu.Lock()
		for _, a := range again {
			// From the tick taken: when the loop lags, a check comes
			// early rather than late, and is checked again.
			w.addLocked(a.c, a.next, w.at)
		}
		clear(due) // the closed ones go to the collector
		w.spare = due[:0]
		w.mu.Unlock()
		clear(again)
		again = again[:0]
	}
}

// startLiveness schedules c's first silence check.
func (c *client) startLiveness() { c.srv.live.add(c, c.untilDue(0)) }

// untilDue is how long c may stay quiet, after quiet already, before its
// check must look again: the next ping or the ttl.
func (c *client) untilDue(quiet time.Duration) time.Duration {
	cfg := &c.srv.cfg
	next := cfg.TTL - quiet
	if d := cfg.PingInterval; d > 0 && quiet < d {
		next = min(next, d-quiet)
	}
	return next
}

// checkSilence closes c's socket once it sent nothing for the ttl: its
// presence is the store's business (it expires it on its own clock), this
// frees the socket of a hung client or a half-open connection. Before
// that, it pings c at each PingInterval of silence. It returns when to
// check again, and false once c is closed.
func (c *client) checkSilence() (time.Duration, bool) {
	if c.closed.Load() {
		return 0, false
	}
	cfg := &c.srv.cfg
	quiet := time.Duration(cfg.Now().UnixNano() - c.lastFrame.Load())
	if quiet >= cfg.TTL {
		if !c.closed.Swap(true) {
			closeWS(c.ws)
		}
		return 0, false
	}
	next, ping := c.nextCheck(quiet, c.dropStaleRecent())
	if ping {
		if err := c.send(websocket.PingMessage, nil); err != nil {
			return 0, false // closed or closing: onClose follows
		}
	}
	return next, true
}

// nextCheck is when to check c again, quiet for quiet now, and whether to
// ping it now; left is how long its snapshot's recent versions are still
// kept (0: none are).
func (c *client) nextCheck(quiet, left time.Duration) (time.Duration, bool) {
	next := c.untilDue(quiet)
	if d := c.srv.cfg.PingInterval; d > 0 && quiet >= d {
		// Not back before a ping interval: a check for the window's end
		// would ping again before the answer could come.
		return min(next, d), true
	}
	if left > 0 {
		// Back when the window ends: in a mass connect each connection
		// holds its whole snapshot's versions until then, and a check a
		// ping interval later would hold them twice as long.
		next = min(next, left)
	}
	return next, false
}
