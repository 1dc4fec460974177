package server

import (
	"errors"
	"net/http"
	"syscall"
	"time"

	"github.com/lesismal/nbio"
	"github.com/lesismal/nbio/nbhttp"
	"github.com/lesismal/nbio/nbhttp/websocket"
)

// nbio's poller (v1.6.8) looks each event up by descriptor number, in the
// table of connections, when it comes to it in the batch epoll_wait
// returned. A socket closed on another goroutine (a worker, a timer) frees
// its number while that batch may still hold an event for it, such as its
// peer's FIN: the accept loop's dup takes the lowest free number, so the
// next socket gets it at once, and the poller then hands the old socket's
// hang-up to the new one and closes it before its handshake is answered.
// A socket closed by its own poller, while it handles that socket's event,
// leaves no such event behind (the kernel drops a closed socket's pending
// events with it).
//
// So the server closes no socket off its poller: it shuts the socket down
// (the peer gets a FIN after what was written, as on a close), and the
// poller, seeing the hang-up in its next batch, closes the socket itself.
// nbio closes a few off its poller where no handler of ours runs first: a
// failed write, a read deadline (the handshake timeout), a text frame of
// invalid UTF-8. For those, our copy of nbio (third_party/nbio) tags each
// registration with a generation that its events carry, so an old
// socket's event is not handed to a new one.

// closeOnPoller ends nbc's connection from any goroutine; nbc's poller
// closes it.
func closeOnPoller(nbc *nbio.Conn) {
	var err error
	// Under nbc's lock, which its close takes: while it is open, the
	// number is still nbc's and not another socket's.
	nbc.Lock()
	if closed, _ := nbc.IsClosed(); !closed {
		rc, _ := nbc.SyscallConn()
		_ = rc.Control(func(fd uintptr) { err = syscall.Shutdown(int(fd), syscall.SHUT_RDWR) })
	}
	nbc.Unlock()
	// ENOTCONN: reset by the peer already, which the poller sees as well.
	// Anything else would leave the socket open: close it here.
	if err != nil && !errors.Is(err, syscall.ENOTCONN) {
		_ = nbc.Close()
	}
}

// closeWS ends ws's connection on its poller (see above).
func closeWS(ws *websocket.Conn) {
	if nbc := nbioConn(ws); nbc != nil {
		closeOnPoller(nbc)
		return
	}
	_ = ws.Close()
}

// awaitPollerClose waits, up to max, until nbc's poller has closed it
// after closeOnPoller. It polls: nbio runs its close callbacks in the
// connection's serial executor, where the caller (a close frame's handler)
// runs, so a callback would only ever come after this returns. The poller
// closes a socket it saw hang up within its next batch, a few microseconds
// on an idle node.
func awaitPollerClose(nbc *nbio.Conn, max time.Duration) {
	deadline := time.Now().Add(max)
	for d := 5 * time.Microsecond; ; d = min(2*d, time.Millisecond) {
		nbc.Lock()
		closed, _ := nbc.IsClosed()
		nbc.Unlock()
		if closed || time.Now().After(deadline) {
			return // past the deadline, nbio's own close follows
		}
		time.Sleep(d)
	}
}

// responseSocket is nbio's socket that w answers on, or nil when w is not
// nbio's.
func responseSocket(w http.ResponseWriter) *nbio.Conn {
	res, ok := w.(*nbhttp.Response)
	if !ok || res.Parser == nil {
		return nil
	}
	return nbioSocket(res.Parser.Conn)
}

// closeAfterResponse closes the socket of a connect that was refused (not
// upgraded), on its poller, once the response is written. nbio writes a
// response after its handler returns, in the same job of the connection's
// serial executor, and would close a Close request's socket right there,
// on a worker; mayConnect leaves Close unset when this closes it instead.
func closeAfterResponse(w http.ResponseWriter) {
	if nbc := responseSocket(w); nbc != nil {
		nbc.Execute(func() { closeOnPoller(nbc) }) // the next job: after the write
	}
}
