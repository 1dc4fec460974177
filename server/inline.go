package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"time"
	"unicode/utf8"

	"github.com/lesismal/nbio"
	"github.com/lesismal/nbio/nbhttp/websocket"

	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/pusher"
	"github.com/greendot/greendot/store"
)

// An idle node's work is a heartbeat now and then from each connection,
// and each arrives alone in its read. Handing it to a worker goroutine
// woke a parked worker and an idle core for a few microseconds of work,
// and parked them again: at 10,000 idle connections that handoff and the
// scheduler cost more than the heartbeats. A read that is exactly one
// small heartbeat frame, of a connection with no job queued or running,
// is therefore handled on the poller goroutine: it needs nothing that
// waits (the stores' Heartbeat only records or queues, an ack is a
// non-blocking write) and, with nothing queued, it is still handled in
// order and alone, as nbio's executor would. Anything else, or a
// heartbeat behind another frame, takes the usual way.

// heartbeatOnPoller handles data, one read of cl's socket that the walker
// found to begin at a frame boundary and to hold no broken or empty frame,
// when it is one whole heartbeat frame. It reports whether it did;
// false leaves data untouched for nbio's parser.
func (s *Server) heartbeatOnPoller(nbc *nbio.Conn, ws *websocket.Conn, cl *client, data []byte) bool {
	if ws.Execute == nil || cl.px != nil || cl.closed.Load() || !cl.registered.Load() {
		return false
	}
	id, ok := heartbeatFrame(data, s.cfg.MaxMessageSize)
	if !ok || nbc.ExecuteLen() != 0 {
		return false
	}
	now := s.cfg.Now()
	s.heardOnPoller(ws, cl, cl, now)
	if !cl.allow(now, 1) {
		return true
	}
	cl.badStreak = 0
	s.answerHeartbeat(cl, id)
	return true
}

// heardOnPoller notes a sign of life of conn, the connection of socket
// sock (itself, or a Pusher socket's user), on the poller.
func (s *Server) heardOnPoller(ws *websocket.Conn, sock, conn *client, now time.Time) {
	switch err := s.heard(conn, now); {
	case errors.Is(err, store.ErrUnknownConn):
		// Asserting it again waits on the store: in the socket's executor,
		// where the frames after this one then wait for it.
		ws.Execute(func() {
			if sock.closed.Load() {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.reassert(ctx, conn); err != nil {
				s.log.Warn("heartbeat", "err", err)
			}
		})
	case err != nil:
		s.log.Warn("heartbeat", "err", err)
	}
}

// answerHeartbeat counts an accepted heartbeat and acks it when it has an
// id (the heartbeat's, as the client spelled it).
func (s *Server) answerHeartbeat(c *client, id json.RawMessage) {
	s.metrics.heartbeatFrames.Inc()
	s.metrics.heartbeats.Inc()
	if len(id) == 0 || string(id) == "null" {
		return
	}
	if b := ackFrame(id); b != nil {
		c.mu.Lock()
		if c.px == nil {
			c.writeLocked(b)
		}
		c.mu.Unlock()
		return
	}
	c.writeJSON(protocol.HeartbeatAck{Type: protocol.TypeHeartbeatAck, ID: id})
}

// ackFrame is the heartbeat_ack of id as json.Marshal encodes it, built
// without reflection (a fifth of an idle node's time outside system calls
// was the ack's encoding), for an id of plain characters only: a number, or
// a string of letters, digits and ._+-. Nil for any other id, which Marshal
// may compact or escape.
func ackFrame(id []byte) []byte {
	const head, tail = `{"type":"` + protocol.TypeHeartbeatAck + `","id":`, `}`
	for _, ch := range id {
		switch {
		case '0' <= ch && ch <= '9', 'a' <= ch && ch <= 'z', 'A' <= ch && ch <= 'Z':
		case ch == '"' || ch == '.' || ch == '_' || ch == '+' || ch == '-':
		default:
			return nil
		}
	}
	b := make([]byte, 0, len(head)+len(id)+len(tail))
	b = append(b, head...)
	b = append(b, id...)
	return append(b, tail...)
}

// heartbeatFrame returns the id of the heartbeat data holds when data is
// exactly one whole client frame holding a heartbeat (see smallTextFrame);
// nil when it has none. The heartbeats clients send are read in place, so
// that buf stays on the stack: a plain one allocates nothing.
func heartbeatFrame(data []byte, max int) (json.RawMessage, bool) {
	var buf [125]byte
	p, ok := smallTextFrame(data, max, &buf)
	if !ok {
		return nil, false
	}
	if id, ok := protocol.SimpleHeartbeat(p); ok {
		return bytes.Clone(id), true
	}
	f, err := protocol.DecodeClientFrame(bytes.Clone(p)) // a copy: buf stays on the stack
	if err != nil || f.Heartbeat == nil {
		return nil, false
	}
	return f.Heartbeat.ID, true
}

// smallTextFrame unmasks into buf the payload of data when data is exactly
// one whole client frame: FIN and opcode text, masked, a payload of 1-125
// valid UTF-8 bytes (nbio closes with 1007 otherwise), at most max.
func smallTextFrame(data []byte, max int, buf *[125]byte) ([]byte, bool) {
	if len(data) < 7 || data[0] != 0x81 || data[1]&0x80 == 0 {
		return nil, false
	}
	n := int(data[1] & 0x7f)
	if n > 125 || len(data) != 6+n || n > max {
		return nil, false
	}
	p := buf[:n]
	mask := data[2:6]
	for i := range p {
		p[i] = data[6+i] ^ mask[i&3]
	}
	if !utf8.Valid(p) {
		return nil, false
	}
	return p, true
}

// pusherPingFrame reports whether data is exactly one whole client frame
// holding a pusher:ping event (see smallTextFrame).
func pusherPingFrame(data []byte, max int) bool {
	var buf [125]byte
	p, ok := smallTextFrame(data, max, &buf)
	if !ok || !bytes.Contains(p, []byte("pusher:ping")) {
		return false
	}
	if string(p) == `{"event":"pusher:ping","data":{}}` {
		return true // as pusher-js sends it: no decode needed
	}
	in, err := pusher.Decode(bytes.Clone(p)) // a copy: buf stays on the stack
	return err == nil && in.Event == "pusher:ping"
}

// pusherPong is the answer to every pusher:ping.
var pusherPong = pusher.Frame("pusher:pong", "", struct{}{})

// pusherPingOnPoller is heartbeatOnPoller for a Pusher socket: a read that
// is one whole pusher:ping, the keep-alive pusher-js sends after
// activity_timeout of quiet, is answered on the poller as onMessage would
// answer it.
func (s *Server) pusherPingOnPoller(nbc *nbio.Conn, ws *websocket.Conn, cl *client, data []byte) bool {
	pc := cl.px
	if ws.Execute == nil || pc == nil || s.px == nil || cl.closed.Load() {
		return false
	}
	if !pusherPingFrame(data, s.cfg.MaxMessageSize) || nbc.ExecuteLen() != 0 {
		return false
	}
	now := s.cfg.Now()
	cl.lastFrame.Store(now.UnixNano())
	if gc := pc.gc.Load(); gc != nil {
		s.heardOnPoller(ws, cl, gc, now)
	}
	if !cl.allow(now, 1) {
		if cl.limited == 1 {
			pc.write(pusher.ErrorFrame(0, "too many frames; slow down or be disconnected"))
		}
		return true
	}
	s.metrics.pusherFrames.WithLabelValues("pusher:ping").Inc()
	pc.write(pusherPong)
	return true
}
