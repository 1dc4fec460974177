package server

import (
	"encoding/binary"
	"math"
	"sync"
	"sync/atomic"

	"github.com/lesismal/nbio"
	"github.com/lesismal/nbio/nbhttp/websocket"

	"github.com/greendot/greendot/protocol"
)

// nbio drops a text frame with no payload before any handler sees it, yet
// any frame is a sign of life (docs/protocol.md); and it answers a frame
// that breaks RFC 6455 (reserved bits or opcodes, a fragmented or long
// control frame) with a bare TCP close, and takes unmasked client frames
// as if masked. onFrames walks the client's frame headers ahead of nbio's
// parser to do both right: each empty text frame is a sign of life and
// costs a rate token, in the connection's serial executor where onMessage
// runs; at the first broken frame the frames before it are parsed and the
// connection is closed with 1002.
//
// The walker also cuts a flood short on the poller. nbio's one poller
// goroutine parses everything a socket holds into that connection's job
// list before any job runs, and the jobs already queued run even after a
// job closed the socket: a ping flood had ~4,000 pings per connection
// parsed and rate-limited where 121 decide its fate, and every other
// connection's frames waited behind them. Frames read together arrived at
// once, and at one instant the bucket holds at most RateBurst tokens, so a
// run of more than 3 × RateBurst frames of one token each (pings, empty
// text frames; pongs are free) in one read ends in more than 2 × RateBurst
// refused in a row: the 1008 the rate limit would send. The walker hands
// the parser the frames before that run's last one, queues the 1008 behind
// them and drops whatever the socket sends after.
//
// The walk begins with the first read after the upgrade, where nbio has
// just made the socket's session a *websocket.Conn (before it writes the
// 101): a client that waits for the 101, as RFC 6455 4.1 says it must,
// is walked from its first frame.
//
// The walkers, one per socket and deleted at close, are kept in plain maps
// under a lock per shard: a sync.Map's trie cost ~300 B per socket (heap
// profile of 10,000 idle connections), a tenth of a connection's heap.
type frameWalkers struct{ shards [64]walkerShard }

type walkerShard struct {
	mu sync.Mutex
	m  map[*nbio.Conn]*frameWalker
}

func (ws *frameWalkers) shard(c *nbio.Conn) *walkerShard {
	return &ws.shards[uint(c.Hash())%uint(len(ws.shards))] // the fd: fixed for the socket's life
}

func (ws *frameWalkers) load(c *nbio.Conn) *frameWalker {
	sh := ws.shard(c)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.m[c]
}

func (ws *frameWalkers) loadOrStore(c *nbio.Conn, mk func() *frameWalker) *frameWalker {
	sh := ws.shard(c)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	w, ok := sh.m[c]
	if !ok {
		if sh.m == nil {
			sh.m = make(map[*nbio.Conn]*frameWalker)
		}
		w = mk()
		sh.m[c] = w
	}
	return w
}

func (ws *frameWalkers) delete(c *nbio.Conn) {
	sh := ws.shard(c)
	sh.mu.Lock()
	delete(sh.m, c)
	sh.mu.Unlock()
}

// len counts the walkers (tests: none is left after the sockets close).
func (ws *frameWalkers) len() int {
	n := 0
	for i := range ws.shards {
		sh := &ws.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// bindWalker gives the walker of c's socket its client (handleConnect).
func (s *Server) bindWalker(nbc *nbio.Conn, c *client) {
	s.walkers.loadOrStore(nbc, s.newWalker).cl.Store(c)
	if closed, _ := nbc.IsClosed(); closed {
		s.walkers.delete(nbc) // closed before this: OnClose has deleted it already
	}
}

// newWalker's run limit is the frames of one token that a read may hold
// before the rate limit must close the connection (see above).
func (s *Server) newWalker() *frameWalker {
	return &frameWalker{maxRun: int32(min(3*s.cfg.RateBurst+1, math.MaxInt32))}
}

func (s *Server) onFrames(c *nbio.Conn, ws *websocket.Conn, data []byte) {
	w := s.walkers.loadOrStore(c, s.newWalker) // only this connection's reads touch it, one at a time
	wasFlood := w.flood
	// nbio's parser holds nothing of an earlier read: no part of a frame,
	// no fragment of a message.
	fresh := w.skip == 0 && len(w.head) == 0 && !w.frag
	empty, bad, at := w.walk(data)
	cl := w.cl.Load() // nil for a moment after the upgrade
	if fresh && cl != nil && empty == 0 && bad == "" && !w.flood && (s.heartbeatOnPoller(c, ws, cl, data) || s.pusherPingOnPoller(c, ws, cl, data)) {
		return
	}
	if cl != nil && ws.Execute != nil {
		// Queued before the parse queues the read's other frames, so a
		// frame answered after an empty one sees its effect.
		for range empty {
			ws.Execute(func() {
				if cl.closed.Load() {
					return // as in onMessage
				}
				now := s.cfg.Now()
				s.signOfLife(cl, now)
				cl.allow(now, 1)
			})
		}
	}
	if w.flood {
		if wasFlood {
			return // the 1008 is queued: nothing more is parsed
		}
		if at > 0 {
			c.DataHandler()(c, data[:at])
		}
		// The run's last frame, refused here rather than in the handler.
		s.metrics.framesRejected.WithLabelValues(reasonRateLimited).Inc()
		if cl != nil && ws.Execute != nil {
			// Behind the frames just parsed, so their pongs and the
			// rate_limited error go out before the close, as without the cut.
			ws.Execute(func() { cl.closeWith(protocol.ClosePolicy, "rate limit exceeded") })
			return
		}
		_ = ws.WriteClose(protocol.ClosePolicy, "rate limit exceeded")
		_ = ws.Close()
		return
	}
	if bad == "" {
		c.DataHandler()(c, data)
		return
	}
	if at > 0 {
		c.DataHandler()(c, data[:at])
	}
	s.metrics.framesRejected.WithLabelValues(reasonProtocol).Inc()
	if cl != nil {
		cl.closeWith(protocol.CloseProtocolError, bad)
		return
	}
	_ = ws.WriteClose(protocol.CloseProtocolError, bad)
	_ = ws.Close()
}

// frameWalker follows the frame headers of a client's byte stream, skipping
// payloads: it counts complete text frames without payload and stops at the
// first header that breaks the protocol.
type frameWalker struct {
	// The connection's client once registered. Read on the poller: nbio's
	// Session() reads its field without a lock once set, racing SetSession.
	cl atomic.Pointer[client]
	// The client whose sends onWritten counts (trackWrites), until its
	// close; apart from cl so that no write is counted before it.
	writer atomic.Pointer[client]
	skip   uint64 // payload bytes of the current frame still to come
	head   []byte // the current header, as far as read
	bad    string // why the stream broke the protocol; nothing more is walked

	// The small fields together: one walker per connection, 80 bytes.
	maxRun int32 // frames of one token in one read that end in a 1008; 0: no limit
	run    int32 // such frames so far in this read
	frag   bool  // the last data frame had no FIN: a message is in fragments
	flood  bool  // a read held maxRun of them; nothing more is walked
}

// walk walks data. It returns how many empty text frames ended in it and,
// when a header in it breaks the protocol or completes a flood (w.flood),
// why (for a break) and at which offset of data that frame begins (0 when
// it began in an earlier read).
func (w *frameWalker) walk(data []byte) (empty int, bad string, at int) {
	if w.bad != "" || w.flood {
		return 0, w.bad, 0
	}
	w.run = 0 // a run counts within one read: those frames came at once
	off := 0
	for off < len(data) {
		if w.skip > 0 {
			k := min(uint64(len(data)-off), w.skip)
			w.skip -= k
			off += int(k)
			continue
		}
		w.head = append(w.head, data[off])
		off++
		if len(w.head) < headerLen(w.head) {
			continue
		}
		if w.bad = brokenHeader(w.head); w.bad != "" {
			return empty, w.bad, max(0, off-len(w.head))
		}
		b0, b1 := w.head[0], w.head[1]
		size := uint64(b1 & 0x7f)
		switch size {
		case 126:
			size = uint64(binary.BigEndian.Uint16(w.head[2:4]))
		case 127:
			size = binary.BigEndian.Uint64(w.head[2:10])
		}
		switch {
		case b0 == 0x89 || (b0 == 0x81 && size == 0): // a ping or an empty text frame: one token
			w.run++
			if w.maxRun > 0 && w.run >= w.maxRun {
				w.flood = true
				return empty, "", max(0, off-len(w.head))
			}
		case b0&0x0f == 0xa: // a pong costs nothing and ends no run
		default:
			w.run = 0
		}
		if b0&0x0f < 8 { // a data frame: control frames may come between fragments
			w.frag = b0&0x80 == 0
		}
		if size == 0 && b0 == 0x81 { // FIN, no RSV bits, opcode text
			empty++
		}
		w.skip = size
		w.head = w.head[:0]
	}
	return empty, "", 0
}

// brokenHeader says how a client frame's complete header breaks RFC 6455
// (5.2, 5.5), or "". No extension is negotiated, so no RSV bit may be set.
func brokenHeader(h []byte) string {
	b0, b1 := h[0], h[1]
	op := b0 & 0x0f
	switch {
	case b1&0x80 == 0:
		return "client frames must be masked"
	case b0&0x70 != 0:
		return "reserved bits set"
	case (op >= 3 && op <= 7) || op >= 0xb:
		return "reserved opcode"
	case op >= 8 && b0&0x80 == 0:
		return "fragmented control frame"
	case op >= 8 && b1&0x7f > 125:
		return "control frame over 125 bytes"
	}
	return ""
}

// headerLen is the length of a masked frame header that begins with h (2
// while its second byte is unknown). An unmasked header is judged at 2.
func headerLen(h []byte) int {
	if len(h) < 2 || h[1]&0x80 == 0 {
		return 2
	}
	switch h[1] & 0x7f {
	case 126:
		return 2 + 2 + 4
	case 127:
		return 2 + 8 + 4
	}
	return 2 + 4
}
