package server

import (
	"encoding/binary"

	"github.com/lesismal/nbio"
	"github.com/lesismal/nbio/nbhttp/websocket"
)

// nbio drops a text frame with no payload before any handler sees it, yet
// any frame is a sign of life (docs/protocol.md). watchEmptyFrames wraps the
// connection's reader with a walker of the client's frame headers, which
// finds those frames; each is then a sign of life and costs a rate token,
// like any frame, in the connection's serial executor, where onMessage runs.
func (s *Server) watchEmptyFrames(ws *websocket.Conn, c *client) {
	nbc := nbioConn(ws)
	if nbc == nil || ws.Execute == nil {
		return
	}
	parse := nbc.DataHandler()
	var w frameWalker // only this connection's reads touch it, one at a time
	nbc.OnData(func(conn *nbio.Conn, data []byte) {
		// Queued before the parse queues the read's other frames, so a
		// frame answered after an empty one sees its effect.
		for range w.emptyTexts(data) {
			ws.Execute(func() {
				now := s.cfg.Now()
				s.signOfLife(c, now)
				c.allow(now, 1)
			})
		}
		parse(conn, data)
	})
}

// frameWalker follows the frame headers of a client's byte stream, skipping
// payloads, to count complete text frames without payload. It is installed
// just after the upgrade; bytes a fast client sent before that would put it
// out of step, which a header without the client's mask bit reveals: it then
// stops, and empty frames go unnoticed again, as nbio leaves them.
type frameWalker struct {
	skip uint64 // payload bytes of the current frame still to come
	head []byte // the current header, as far as read
	lost bool
}

// emptyTexts walks data and returns how many empty text frames ended in it.
func (w *frameWalker) emptyTexts(data []byte) (n int) {
	for len(data) > 0 && !w.lost {
		if w.skip > 0 {
			k := min(uint64(len(data)), w.skip)
			w.skip -= k
			data = data[k:]
			continue
		}
		w.head = append(w.head, data[0])
		data = data[1:]
		if len(w.head) < headerLen(w.head) {
			continue
		}
		b0, b1 := w.head[0], w.head[1]
		if b1&0x80 == 0 { // clients must mask every frame
			w.lost = true
			return n
		}
		size := uint64(b1 & 0x7f)
		switch size {
		case 126:
			size = uint64(binary.BigEndian.Uint16(w.head[2:4]))
		case 127:
			size = binary.BigEndian.Uint64(w.head[2:10])
		}
		if size == 0 && b0 == 0x81 { // FIN, no RSV bits, opcode text
			n++
		}
		w.skip = size
		w.head = w.head[:0]
	}
	return n
}

// headerLen is the length of a masked frame header that begins with h (2
// while its second byte is unknown).
func headerLen(h []byte) int {
	if len(h) < 2 {
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
