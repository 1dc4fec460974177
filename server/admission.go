package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/lesismal/nbio"

	"github.com/greendot/greendot/protocol"
)

// Why a socket was refused at accept (greendot_sockets_refused_total).
const (
	reasonFDLimit        = "fd_limit"
	reasonUnauthenticIP  = "unauthenticated_per_ip"
	admissionLogInterval = time.Minute
)

// requestTimeout bounds a request once its head is in: its body, the
// handler and the response. The handshake timeout bounds the head.
const requestTimeout = 30 * time.Second

// admission decides at accept which sockets the node takes, so that file
// descriptors are not held by clients that never authenticate:
//   - one IP holds at most maxPerIP sockets that have not authenticated
//     (no WebSocket upgrade accepted, no request with the API key);
//   - near the process's file descriptor limit every new socket gets a
//     503 and is closed, instead of nbio failing to take it with an
//     unstructured "too many open files" line and a reset.
//
// It is used by acceptLoop (one goroutine), by the request gate on the
// pollers and by engine close callbacks, hence the mutex.
type admission struct {
	maxPerIP int // <0: no cap
	fdLimit  int // RLIMIT_NOFILE at start; 0: unknown, no check
	fdBase   int // descriptors open at start (listener, store, logs)
	reserve  int // descriptors kept free below the limit

	mu    sync.Mutex
	conns map[*nbio.Conn]*admitted
	perIP map[string]int // unauthenticated sockets by IP

	spare *os.File // closed to accept, and refuse, one socket when out of descriptors
	log   throttledLog
}

type admitted struct {
	ip     string
	authed bool
	// The two steps that race to set and clear the socket's read deadline
	// (see added).
	added, upgraded bool
}

func newAdmission(maxPerIP int) *admission {
	return &admission{
		maxPerIP: maxPerIP,
		conns:    make(map[*nbio.Conn]*admitted),
		perIP:    make(map[string]int),
	}
}

// measure reads the descriptor limit and what is open already; called
// once the engine's pollers hold theirs, before the first accept.
func (a *admission) measure() {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur > 0 && lim.Cur < 1<<31 {
		a.fdLimit = int(lim.Cur)
		// Room for the store's pool growing, profiles, a dup per accept.
		a.reserve = 32 + a.fdLimit/100
		if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
			a.fdBase = len(ents)
		}
	}
	a.spare, _ = os.Open(os.DevNull)
}

// full reports whether the node is too near its descriptor limit to take
// one more socket.
func (a *admission) full() bool {
	if a.fdLimit == 0 {
		return false
	}
	a.mu.Lock()
	n := len(a.conns)
	a.mu.Unlock()
	return a.fdBase+n >= a.fdLimit-a.reserve
}

// admit counts a new unauthenticated socket of ip, or says why it must be
// refused. An admitted socket is then tracked, or given back with forget.
func (a *admission) admit(ip string) (reason string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.maxPerIP >= 0 && a.perIP[ip] >= a.maxPerIP {
		return reasonUnauthenticIP
	}
	a.perIP[ip]++
	return ""
}

func (a *admission) track(c *nbio.Conn, ip string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.conns[c] = &admitted{ip: ip}
}

func (a *admission) forget(ip string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.uncountLocked(ip)
}

// authenticated takes c out of its IP's count of unauthenticated sockets.
func (a *admission) authenticated(c *nbio.Conn) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ad := a.conns[c]; ad != nil && !ad.authed {
		ad.authed = true
		a.uncountLocked(ad.ip)
	}
}

// nbio's AddConnNonTLSNonBlocking puts a socket on its poller and only
// then sets its read deadline, the handshake timeout. The request may be in
// the socket already: the poller can read it and a worker accept its
// upgrade in between, the upgrader clearing the deadline before nbio sets
// it. The WebSocket was then closed with "read timeout" a handshake
// timeout after it connected (under load: a subject of
// TestSlowReaderIsDisconnectedWithoutHoldingOthers got "broken pipe").
// Each side notes its step here, under the lock; the second one clears the
// deadline again.

// added is take's, once the engine holds c: it reports whether c's upgrade
// came first, leaving take to clear the deadline nbio has just set.
func (a *admission) added(c *nbio.Conn) (upgradedFirst bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ad := a.conns[c]
	if ad == nil {
		return false // closed already
	}
	ad.added = true
	return ad.upgraded
}

// upgraded is the upgrade's: it reports whether the engine held c already,
// and so may have set the deadline after the upgrader cleared it.
func (a *admission) upgraded(c *nbio.Conn) (addedFirst bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ad := a.conns[c]
	if ad == nil {
		return false
	}
	ad.upgraded = true
	return ad.added
}

// closed forgets c; calling it again does nothing.
func (a *admission) closed(c *nbio.Conn) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ad := a.conns[c]
	if ad == nil {
		return
	}
	delete(a.conns, c)
	if !ad.authed {
		a.uncountLocked(ad.ip)
	}
}

func (a *admission) uncountLocked(ip string) {
	if a.perIP[ip]--; a.perIP[ip] <= 0 {
		delete(a.perIP, ip)
	}
}

func (a *admission) unauthenticated(ip string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.perIP[ip]
}

func (a *admission) close() {
	if a.spare != nil {
		_ = a.spare.Close()
	}
}

// acceptOverLimit is called when Accept failed for want of descriptors: the
// kernel keeps completing handshakes into the backlog, whose clients would
// wait for nothing. The spare descriptor makes room to accept one of them
// and refuse it; then it is taken again.
func (s *Server) acceptOverLimit(ln net.Listener) {
	a := s.adm
	if a.spare != nil {
		_ = a.spare.Close()
		a.spare = nil
	}
	if c, err := ln.Accept(); err == nil {
		s.refuseSocket(c, reasonFDLimit)
	}
	a.spare, _ = os.Open(os.DevNull)
}

// refuseSocket answers a socket the node will not take and closes it. The
// answer is written before anything is read: a client that has already
// sent its request may see a reset instead.
func (s *Server) refuseSocket(c net.Conn, reason string) {
	s.metrics.socketsRefused.WithLabelValues(reason).Inc()
	var status int
	var code, msg string
	switch reason {
	case reasonUnauthenticIP:
		status, code = http.StatusTooManyRequests, protocol.CodeTooManyConns
		msg = fmt.Sprintf("this address already holds %d connections that have not authenticated", s.adm.maxPerIP)
		s.adm.log.note(s.log, "refused sockets: too many unauthenticated connections from one address (--max-unauthenticated-per-ip)", reason)
	default:
		status, code = http.StatusServiceUnavailable, protocol.CodeUnavailable
		msg = "this node is at its file descriptor limit; retry later or on another node"
		s.adm.log.note(s.log, "refused sockets: the process is near its file descriptor limit (ulimit -n)", reason,
			"limit", s.adm.fdLimit, "reserve", s.adm.reserve)
	}
	b, _ := json.Marshal(map[string]map[string]string{"error": {"code": code, "message": msg}})
	b = append(b, '\n')
	head := fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n",
		status, http.StatusText(status), len(b))
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write(append([]byte(head), b...))
	drainNow(c)
	_ = c.Close()
}

// drainNow reads, without waiting, what a socket has received: closed with
// unread bytes, it would be reset, and its client might lose the answer.
func drainNow(c net.Conn) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	var buf [4096]byte
	_ = rc.Read(func(fd uintptr) bool {
		for range 16 {
			if n, err := syscall.Read(int(fd), buf[:]); n <= 0 || err != nil {
				break
			}
		}
		return true // never wait for more
	})
}

// outOfDescriptors reports whether an accept or dup error is EMFILE or ENFILE.
func outOfDescriptors(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// remoteIP is the address a socket's per-IP count is kept under.
func remoteIP(c net.Conn) string {
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// throttledLog logs a kind of event at most once per interval, with the
// count of each reason since the last line, so that a flood cannot flood
// the log.
type throttledLog struct {
	mu     sync.Mutex
	last   time.Time
	counts map[string]int
}

func (t *throttledLog) note(log *slog.Logger, msg, reason string, attrs ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.counts == nil {
		t.counts = make(map[string]int)
	}
	t.counts[reason]++
	if now := time.Now(); now.Sub(t.last) >= admissionLogInterval {
		args := append([]any{"interval", admissionLogInterval.String()}, attrs...)
		for r, n := range t.counts {
			args = append(args, r, n)
		}
		log.Warn(msg, args...)
		t.last, t.counts = now, nil
	}
}
