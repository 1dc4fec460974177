package server

import (
	"net"

	"github.com/lesismal/nbio"
	"github.com/lesismal/nbio/nbhttp"
	"github.com/lesismal/nbio/nbhttp/websocket"
)

// nbio does not tell how much it holds for a connection, but reports each
// write to a socket (Engine.OnWrittenSize). A client counts what it hands to
// nbio (send) and onWritten subtracts what reaches the socket, so unsent is
// what waits in nbio's buffer: not 0 while the socket does not drain.

// nbioConn is the socket under an upgraded connection; nil if it is not one
// of nbio's (then nothing is counted, and empty frames go unnoticed).
func nbioConn(ws *websocket.Conn) *nbio.Conn { return nbioSocket(ws.Conn) }

// nbioSocket is nbio's socket under raw, or nil.
func nbioSocket(raw net.Conn) *nbio.Conn {
	if hc, ok := raw.(*nbhttp.Conn); ok { // upgraded from, or read by, nbhttp's parser
		raw = hc.Conn
	}
	nbc, _ := raw.(*nbio.Conn)
	return nbc
}

// trackWrites makes onWritten count c's socket; before c writes anything.
func (s *Server) trackWrites(c *client) {
	if nbc := nbioConn(c.ws); nbc != nil {
		if w := s.walkers.load(nbc); w != nil { // none: closed already
			w.writer.Store(c)
		}
	}
}

func (s *Server) untrackWrites(c *client) {
	if nbc := nbioConn(c.ws); nbc != nil {
		if w := s.walkers.load(nbc); w != nil {
			w.writer.CompareAndSwap(c, nil)
		}
	}
}

// onWritten is nbio's report of n bytes written to a socket. It runs with
// the socket's lock held, on a poller or in a write: it must not write,
// close or take a client's lock.
func (s *Server) onWritten(nc *nbio.Conn, _ []byte, n int) {
	w := s.walkers.load(nc)
	if w == nil {
		return // an HTTP connection
	}
	c := w.writer.Load()
	if c == nil {
		return // a WebSocket not yet registered, or closed
	}
	if c.unsent.Add(-int64(n)) <= 0 {
		c.drained()
	}
}
