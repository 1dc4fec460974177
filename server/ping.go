package server

import (
	"time"

	"github.com/lesismal/nbio/nbhttp/websocket"
)

// Server-sent pings make liveness independent of the client's timers. A
// browser answers a WebSocket ping from its network stack, without running
// page code, so a tab whose timers it throttles (a hidden tab's chained
// timers run once a minute after five minutes) still shows a sign of life
// within the ttl: the pong handler counts a pong like any frame. Only a
// connection silent for PingInterval is pinged, so one that heartbeats costs
// nothing, and each connection's timer fires when its silence is due, not on
// a sweep of them all.

// startPings arms c's ping timer. It re-arms itself until c is closed, then
// ends at its next firing.
func (c *client) startPings() {
	d := c.srv.cfg.PingInterval
	if d <= 0 {
		return
	}
	var t *time.Timer
	// Armed far off, then set: the callback must not run before t is assigned.
	t = time.AfterFunc(time.Duration(1<<62), func() { c.pingIfSilent(t) })
	t.Reset(d)
}

// pingIfSilent pings c if it sent nothing for PingInterval, and re-arms t for
// when its silence next reaches the interval.
func (c *client) pingIfSilent(t *time.Timer) {
	if c.closed.Load() {
		return
	}
	d := c.srv.cfg.PingInterval
	next := d
	if quiet := time.Duration(c.srv.cfg.Now().UnixNano() - c.lastFrame.Load()); quiet < d {
		next = d - quiet
	} else if err := c.send(websocket.PingMessage, nil); err != nil {
		return // closed or closing: onClose follows
	}
	t.Reset(next)
}
