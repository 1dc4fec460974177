package server

import (
	"time"

	"github.com/lesismal/nbio/nbhttp/websocket"
)

// Each connection has one liveness timer, which fires when its silence is
// due and nothing scans them all: at PingInterval of silence it pings, and
// at the ttl it closes the socket. Server-sent pings make liveness
// independent of the client's timers. A browser answers a WebSocket ping
// from its network stack, without running page code, so a tab whose timers
// it throttles (a hidden tab's chained timers run once a minute after five
// minutes) still shows a sign of life within the ttl: the pong handler
// counts a pong like any frame. Only a connection silent for PingInterval
// is pinged, so one that heartbeats costs nothing.

// startLiveness arms c's liveness timer. It re-arms itself until c is
// closed, then ends at its next firing.
func (c *client) startLiveness() {
	var t *time.Timer
	// Armed far off, then set: the callback must not run before t is assigned.
	t = time.AfterFunc(time.Duration(1<<62), func() { c.checkSilence(t) })
	t.Reset(c.untilDue(0))
}

// untilDue is how long c may stay quiet, after quiet already, before its
// timer must look again: the next ping or the ttl.
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
// that, it pings c at each PingInterval of silence.
func (c *client) checkSilence(t *time.Timer) {
	if c.closed.Load() {
		return
	}
	cfg := &c.srv.cfg
	quiet := time.Duration(cfg.Now().UnixNano() - c.lastFrame.Load())
	if quiet >= cfg.TTL {
		if !c.closed.Swap(true) {
			_ = c.ws.Close()
		}
		return
	}
	next := c.untilDue(quiet)
	if d := cfg.PingInterval; d > 0 && quiet >= d {
		if err := c.send(websocket.PingMessage, nil); err != nil {
			return // closed or closing: onClose follows
		}
		next = min(next, d)
	}
	t.Reset(next)
}
