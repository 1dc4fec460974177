package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/lesismal/nbio/nbhttp/websocket"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/store"
)

// Bad frames in a row after which a connection is closed with 1008.
const maxBadStreak = 10

func (s *Server) newUpgrader() *websocket.Upgrader {
	u := websocket.NewUpgrader()
	u.CheckOrigin = func(*http.Request) bool { return true } // tokens, not cookies, authenticate
	// No read deadline: resetting one per frame cost 5% of the CPU per
	// heartbeat; the liveness timer (ping.go) closes sockets that stay silent past the ttl.
	u.KeepaliveTime = 0
	u.MessageLengthLimit = s.cfg.MaxMessageSize // nbio closes with 1009 past it
	u.BlockingModAsyncWrite = false
	u.OnMessage(s.onMessage)
	u.OnClose(s.onClose)
	u.SetCloseHandler(func(c *websocket.Conn, code int, _ string) {
		var reply []byte // 1005: no code came, none goes back
		if code != 1005 {
			reply = closePayload(code, "")
		}
		if cl, ok := c.Session().(*client); ok {
			cl.closeFrame.Store(true) // a clean close: the close is the last sign of life
			_ = cl.send(websocket.CloseMessage, reply)
		} else {
			_ = c.WriteMessage(websocket.CloseMessage, reply)
		}
		// nbio closes c on this goroutine once this returns, as the client's
		// FIN comes in: its poller must have closed it first (sockclose.go).
		if nbc := nbioConn(c); nbc != nil {
			closeOnPoller(nbc)
			awaitPollerClose(nbc, time.Second)
		}
	})
	// A client's ping costs a rate token like a frame: answering a flood of
	// them took a core. nbio runs this handler in the connection's serial
	// executor, as onMessage, so allow needs no lock. A client's pong is an
	// answer to our own ping and is not counted.
	u.SetPingHandler(func(c *websocket.Conn, data string) {
		cl, ok := c.Session().(*client)
		if !ok {
			_ = c.WriteMessage(websocket.PongMessage, []byte(data))
			return
		}
		if cl.closed.Load() {
			return // as in onMessage
		}
		now := s.cfg.Now()
		s.signOfLife(cl, now)
		if cl.allow(now, 1) { // refused: no pong
			_ = cl.send(websocket.PongMessage, []byte(data))
		}
	})
	u.SetPongHandler(func(c *websocket.Conn, _ string) {
		switch cl, _ := c.Session().(*client); {
		case cl == nil:
		case cl.px != nil:
			s.px.alive(cl.px, s.cfg.Now())
		default:
			s.signOfLife(cl, s.cfg.Now())
		}
	})
	return u
}

// handleConnect authenticates, upgrades, registers the connection and sends
// welcome and snapshot.
func (s *Server) handleConnect(w http.ResponseWriter, r *http.Request) {
	upgraded := false
	defer func() {
		if !upgraded {
			closeAfterResponse(w)
		}
	}()
	if !s.mayConnect(w, r) {
		return
	}
	id, err := s.auth.authenticate(r)
	if err != nil {
		var bad badIDError
		if errors.As(err, &bad) {
			s.metrics.connectsRejected.WithLabelValues(reasonBadRequest).Inc()
			writeError(w, http.StatusBadRequest, protocol.CodeBadRequest, err.Error())
			return
		}
		s.metrics.connectsRejected.WithLabelValues(reasonUnauthorized).Inc()
		writeError(w, http.StatusUnauthorized, protocol.CodeUnauthorized, err.Error())
		return
	}
	if !s.validUpgrade(w, r) {
		return
	}
	device, ok := deviceOf(r)
	if !ok {
		s.metrics.connectsRejected.WithLabelValues(reasonBadRequest).Inc()
		writeError(w, http.StatusBadRequest, protocol.CodeBadRequest, errBadID("device").Error())
		return
	}
	if !id.expiry.IsZero() && !id.expiry.After(s.cfg.Now()) {
		writeError(w, http.StatusUnauthorized, protocol.CodeUnauthorized, "token expired")
		return
	}
	release, ok := s.reserveConn(id.userID)
	if !ok {
		s.metrics.connectsRejected.WithLabelValues(reasonTooManyConns).Inc()
		writeError(w, http.StatusTooManyRequests, protocol.CodeTooManyConns,
			fmt.Sprintf("this user already has %d connections on this node; close one first", s.cfg.MaxConnectionsPerUser))
		return
	}
	defer release()
	if !s.admit() {
		s.metrics.connectsRejected.WithLabelValues(reasonOverloaded).Inc()
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, protocol.CodeUnavailable, "too many connects in progress; retry with backoff")
		return
	}
	defer func() { <-s.connecting }()
	if s.draining.Load() { // began while this connect waited for its slot
		s.metrics.connectsRejected.WithLabelValues(reasonDraining).Inc()
		writeError(w, http.StatusServiceUnavailable, protocol.CodeUnavailable, "this node is draining; connect to another")
		return
	}
	if s.intact() != nil {
		s.metrics.connectsRejected.WithLabelValues(reasonRecovering).Inc()
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, protocol.CodeUnavailable, msgRecovering)
		return
	}
	ws, err := s.upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader has answered
	}
	upgraded = true
	s.upgradedSocket(ws)
	if nbc := nbioConn(ws); nbc != nil {
		s.adm.authenticated(nbc)
	}
	now := s.cfg.Now()
	c := &client{
		srv:    s,
		ws:     ws,
		id:     randomID(8),
		user:   id.userID,
		device: device,
	}
	c.lastFrame.Store(now.UnixNano())
	c.tokens = float64(s.cfg.RateBurst)
	c.refilled = now.UnixNano()
	ws.SetSession(c)
	if nbc := nbioConn(ws); nbc != nil {
		s.bindWalker(nbc, c)
	}
	s.trackWrites(c)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	teams, gen, err := s.hub.addAt(ctx, c)
	release() // the hub counts c from here on
	// A large team's members are not in the snapshot: team_counts follow it.
	small := s.hub.smallTeams(teams)
	var reads connectReads
	registered := false
	if err == nil {
		registered, reads, err = s.register(ctx, c, small)
	}
	if !registered {
		s.log.Error("register connection", "err", err)
		s.hub.remove(c)
		c.closeWith(1011, "store unavailable")
		return
	}
	c.registered.Store(true)
	c.startLiveness()
	if c.closed.Load() {
		// Closed while registering: onClose may have run before registered
		// was set, or even before hub.add, whose entry it then missed.
		s.hub.remove(c)
		_ = s.store.Disconnect(ctx, c.id, presence.Closed)
		return
	}
	if err != nil {
		s.log.Error("read own status", "err", err)
		c.closeWith(1011, "store unavailable")
		return
	}
	if !s.hub.notGiven(c, gen, teams, reads) {
		// A membership event of the user came during the read, or the
		// read has the user in a team whose join the index lacks: the
		// snapshot would leave out members.
		c.closeWith(protocol.CloseTryAgainLater, "memberships changed while connecting")
		return
	}
	// The user's own status, for my_status right after welcome, read once
	// c was in the hub: changes from then on reach c through the hub
	// (OnStatus) as well; the newer version wins.
	own := reads.own
	c.mu.Lock()
	c.writeJSONLocked(protocol.Welcome{
		Type:                protocol.TypeWelcome,
		ConnectionID:        c.id,
		UserID:              c.user,
		HeartbeatIntervalMS: s.cfg.HeartbeatInterval.Milliseconds(),
		TTLMS:               s.cfg.TTL.Milliseconds(),
		OfflineGraceMS:      s.cfg.Grace.Milliseconds(),
	})
	c.welcomed = true
	c.welcomeStatusLocked(myStatusFrame(own.Status, own.Version))
	c.mu.Unlock()
	snap, members, err := s.snapshot(ctx, c.user, small, reads.members)
	if errors.Is(err, store.ErrRecovering) {
		// Redis lost its data: the snapshot would lack the users of nodes
		// not written back yet. The client reconnects.
		c.closeWith(protocol.CloseTryAgainLater, "store recovering from a data loss")
		return
	}
	if err != nil {
		s.log.Error("snapshot", "err", err)
		c.closeWith(1011, "store unavailable")
		return
	}
	s.hub.noteSnapshot(c, members, snap)
	c.sendSnapshot(snap)
	s.hub.afterSnapshot(c)
	if !id.expiry.IsZero() {
		c.setExpiry(id.expiry.Sub(now))
	}
}

// mayConnect refuses a connect while the node drains or from an Origin not
// allowed. A refused connect closes its connection: the request gate stops
// reading a connection as HTTP once an upgrade request is handed over
// (server.go, onData). An upgrade hijacks the connection and sends its own
// headers, so the close only reaches refusals. The caller closes an nbio
// socket itself (closeAfterResponse); only another server needs Close.
func (s *Server) mayConnect(w http.ResponseWriter, r *http.Request) bool {
	w.Header().Set("Connection", "close")
	r.Close = responseSocket(w) == nil
	if s.draining.Load() {
		s.metrics.connectsRejected.WithLabelValues(reasonDraining).Inc()
		writeError(w, http.StatusServiceUnavailable, protocol.CodeUnavailable, "this node is draining; connect to another")
		return false
	}
	if !s.originAllowed(r) {
		s.metrics.connectsRejected.WithLabelValues(reasonForbiddenOrigin).Inc()
		writeError(w, http.StatusForbidden, protocol.CodeForbiddenOrigin, "this Origin may not connect (see --allowed-origins)")
		return false
	}
	return true
}

// deviceOf is r's ?device= ("web" when absent), and whether it is a valid
// id. The value is copied: a query value is a substring of the request's
// URI, which would then stay in memory, token and all, for as long as the
// connection.
func deviceOf(r *http.Request) (string, bool) {
	d, ok := r.URL.Query()["device"]
	if !ok {
		return "web", true
	}
	return strings.Clone(d[0]), protocol.ValidID(d[0])
}

// validUpgrade checks the WebSocket handshake here so that a bad one is
// answered in JSON like every other error; the upgrader would answer in
// plain text.
func (s *Server) validUpgrade(w http.ResponseWriter, r *http.Request) bool {
	if !websocketRequest(r) {
		s.metrics.connectsRejected.WithLabelValues(reasonBadRequest).Inc()
		writeError(w, http.StatusBadRequest, protocol.CodeBadRequest, "expected a WebSocket upgrade (Connection: Upgrade, Upgrade: websocket)")
		return false
	}
	if !headerHas(r.Header, "Sec-WebSocket-Version", "13") {
		s.metrics.connectsRejected.WithLabelValues(reasonBadRequest).Inc()
		w.Header().Set("Sec-WebSocket-Version", "13")
		writeError(w, http.StatusBadRequest, protocol.CodeBadRequest, "unsupported WebSocket version; this server speaks 13")
		return false
	}
	if key, err := base64.StdEncoding.DecodeString(r.Header.Get("Sec-WebSocket-Key")); err != nil || len(key) != 16 {
		s.metrics.connectsRejected.WithLabelValues(reasonBadRequest).Inc()
		writeError(w, http.StatusBadRequest, protocol.CodeBadRequest, "Sec-WebSocket-Key must be 16 random bytes in base64")
		return false
	}
	return true
}

// reserveConn counts a connect of user against MaxConnectionsPerUser: the
// user's connections in the hub plus their connects still on the way there,
// so that simultaneous connects cannot all pass. release, idempotent, ends
// the reservation once the connection is in the hub or has failed; counting
// it twice meanwhile errs on the side of refusing.
func (s *Server) reserveConn(user string) (release func(), ok bool) {
	max := s.cfg.MaxConnectionsPerUser
	if max < 0 {
		return func() {}, true
	}
	s.userMu.Lock()
	defer s.userMu.Unlock()
	live := 0
	s.hub.mu.RLock()
	if lu := s.hub.users[user]; lu != nil {
		live = len(lu.conns)
	}
	s.hub.mu.RUnlock()
	if live+s.userPending[user] >= max {
		return nil, false
	}
	s.userPending[user]++
	done := false // release runs on the connect's goroutine only
	return func() {
		if done {
			return
		}
		done = true
		s.userMu.Lock()
		defer s.userMu.Unlock()
		if s.userPending[user]--; s.userPending[user] <= 0 {
			delete(s.userPending, user)
		}
	}, true
}

// originAllowed checks an upgrade's Origin against AllowedOrigins. Only
// browsers send Origin, and they always do on a WebSocket: a request
// without one is not a page of another site, so it passes.
func (s *Server) originAllowed(r *http.Request) bool {
	if len(s.origins) == 0 {
		return true
	}
	o, sent := r.Header["Origin"]
	if !sent {
		return true
	}
	_, ok := s.origins[strings.ToLower(o[0])]
	return ok
}

// ParseOrigins splits a comma-separated list of origins (the
// --allowed-origins flag), each scheme://host[:port] as browsers send it;
// empty entries are skipped.
func ParseOrigins(list string) ([]string, error) {
	var out []string
	for _, o := range strings.Split(list, ",") {
		if o = strings.TrimSpace(o); o == "" {
			continue
		}
		if _, err := parseOrigin(o); err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

// parseOrigin checks that o is scheme://host[:port] and lowers its case
// (scheme and host are case-insensitive; browsers send them in lower case).
func parseOrigin(o string) (string, error) {
	u, err := url.Parse(o)
	if err != nil || u.Scheme == "" || u.Host == "" || u.User != nil || u.Path != "" ||
		u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(o, "?") || strings.HasSuffix(o, "#") {
		return "", fmt.Errorf("%q is not an origin: want scheme://host[:port], e.g. https://app.example.com, with no path", o)
	}
	return strings.ToLower(o), nil
}

// admit takes a connect slot, waiting up to ConnectQueueWait for one.
func (s *Server) admit() bool {
	select {
	case s.connecting <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(s.cfg.ConnectQueueWait)
	defer t.Stop()
	select {
	case s.connecting <- struct{}{}:
		return true
	case <-t.C:
		return false
	case <-s.stop:
		return false
	}
}

// mayBeBig reports whether a frame may pass MaxSmallFrame, by its "type"
// alone: a query, watch or unwatch of 500 ids.
func mayBeBig(data []byte) bool {
	var f struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(data, &f) != nil {
		return false
	}
	return f.Type == protocol.TypeQuery || f.Type == protocol.TypeWatch || f.Type == protocol.TypeUnwatch
}

// onMessage handles one client frame. nbio calls it serially per connection.
func (s *Server) onMessage(ws *websocket.Conn, mt websocket.MessageType, data []byte) {
	c, ok := ws.Session().(*client)
	if !ok {
		return
	}
	if c.closed.Load() {
		// Closed by a job before this one (a flood's 1008): what the poller
		// had queued behind it is dropped unread, so the close, and the
		// user's connection slot, are not held up behind it.
		return
	}
	if c.px != nil {
		s.px.onMessage(c.px, mt, data)
		return
	}
	if mt == websocket.BinaryMessage {
		s.metrics.framesRejected.WithLabelValues(reasonBinary).Inc()
		c.closeWith(protocol.CloseUnsupported, "binary frames are not accepted")
		return
	}
	now := s.cfg.Now()
	s.signOfLife(c, now)
	// Refused frames in a row before this one: a query refused for its ids
	// continues the streak that its first token ended (see below).
	streak := c.limited
	// The rate limit comes first: a flood of big frames costs no JSON scan.
	if !c.allow(now, 1) {
		return
	}
	big := len(data) > protocol.MaxSmallFrame
	// Decoding a 500-id query takes about a millisecond. A flood of them,
	// refused for their ids after the decode, ran on every worker at once
	// and kept each other connection's frames waiting for a core (a
	// bystander's heartbeat ack p99 at 200-700 ms in `greendot bench
	// abuse`). The big frames of a connection in a run of refused frames
	// are decoded on at most half the cores, leaving the other half to
	// everyone else; one that finds them all busy is refused undecoded,
	// continuing its run (waiting instead held the connection open while
	// the poller read ever more of its flood). A client within its limit
	// is not affected.
	laned := big && streak > 0
	if laned {
		select {
		case s.bigFrames <- struct{}{}:
		default:
			c.limited = streak // the token it took does not end the run
			c.refuse()
			return
		}
	}
	f, err := protocol.DecodeClientFrame(data)
	if laned {
		<-s.bigFrames
	}
	if big {
		// The contract's 4 KiB holds for every frame but a query, watch or
		// unwatch, which nbio reads up to MaxFrameSize for their 500 ids.
		// The type comes from the one decode; only an undecodable frame
		// is scanned for it.
		ok := f.Query != nil || f.Watch != nil || f.Unwatch != nil
		if err != nil {
			ok = mayBeBig(data)
		}
		if !ok {
			c.closeWith(protocol.CloseTooBig, "message exceeds the configured limit")
			return
		}
	}
	if err != nil {
		var de *protocol.DecodeError
		if !errors.As(err, &de) {
			de = &protocol.DecodeError{Code: protocol.CodeBadRequest, Message: "bad frame"}
		}
		reason := reasonBadRequest
		if de.Code == protocol.CodeUnknownType {
			reason = reasonUnknownType
		}
		s.metrics.framesRejected.WithLabelValues(reason).Inc()
		c.badStreak++
		if c.badStreak > maxBadStreak {
			c.closeWith(protocol.ClosePolicy, "too many bad frames")
			return
		}
		c.writeJSON(protocol.Error{Type: protocol.TypeError, Code: de.Code, Message: de.Message})
		return
	}
	c.badStreak = 0
	switch {
	case f.Heartbeat != nil:
		s.answerHeartbeat(c, f.Heartbeat.ID)
	case f.Status != nil:
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.metrics.frames.WithLabelValues(protocol.TypeStatus).Inc()
		active := f.Status.State == protocol.StateOnline
		c.away.Store(!active)
		err := s.timed(store.OpStatus, func() error { return s.store.SetStatus(ctx, c.id, active) })
		if errors.Is(err, store.ErrUnknownConn) {
			if s.reassert(ctx, c) == nil {
				err = s.store.SetStatus(ctx, c.id, active)
			}
		}
		if err != nil {
			s.log.Warn("set status", "err", err)
		}
	case f.SetStatus != nil:
		s.onSetStatus(c, f.SetStatus, now)
	case f.Query != nil:
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.metrics.frames.WithLabelValues(protocol.TypeQuery).Inc()
		if !c.chargeIDs(now, len(f.Query.UserIDs), streak) {
			return
		}
		s.answerQuery(ctx, c, f.Query)
	case f.Watch != nil:
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.metrics.frames.WithLabelValues(protocol.TypeWatch).Inc()
		// Priced as a query (DESIGN.md, Limits): it reads as much.
		if !c.chargeIDs(now, len(f.Watch.UserIDs), streak) {
			return
		}
		s.answerWatch(ctx, c, f.Watch)
	case f.Unwatch != nil:
		s.metrics.frames.WithLabelValues(protocol.TypeUnwatch).Inc()
		s.hub.watch.remove(c, f.Unwatch.UserIDs)
	}
}

// signOfLife records that c was heard from: any frame counts.
func (s *Server) signOfLife(c *client, now time.Time) {
	err := s.heard(c, now)
	if errors.Is(err, store.ErrUnknownConn) {
		// The store expired or lost it, yet the client is alive: assert it again.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = s.reassert(ctx, c)
		cancel()
	}
	if err != nil {
		s.log.Warn("heartbeat", "err", err)
	}
}

// heard is signOfLife up to the store's answer. It never waits: the
// poller calls it for a heartbeat (inline.go).
func (s *Server) heard(c *client, now time.Time) error {
	prev := c.lastFrame.Swap(now.UnixNano())
	s.metrics.heartbeatGap.Observe(time.Duration(now.UnixNano() - prev).Seconds())
	if !c.registered.Load() {
		return nil
	}
	// Heartbeat only records or queues (the stores batch their writes), so
	// it needs no deadline of its own, and its latency is not worth a
	// histogram observation per frame: only its errors are counted.
	err := s.store.Heartbeat(context.Background(), c.id)
	if err != nil {
		s.metrics.heartbeatErrors.Inc()
	}
	return err
}

// reassert registers a live connection the store no longer knows.
func (s *Server) reassert(ctx context.Context, c *client) error {
	// It comes back idle if it was: connecting it active and then idle
	// would publish an online that was never true.
	err := s.store.Connect(ctx, presence.Conn{ID: c.id, UserID: c.user, Device: c.device, Node: s.cfg.NodeID, Idle: c.away.Load()})
	if errors.Is(err, store.ErrDuplicateConn) {
		return nil
	}
	return err
}

// onClose ends the connection in the store: its user may enter grace.
func (s *Server) onClose(ws *websocket.Conn, why error) {
	c, ok := ws.Session().(*client)
	if !ok {
		return
	}
	if c.px != nil {
		s.px.onClose(c.px, why)
	}
	c.markClosed()
	s.untrackWrites(c)
	s.hub.remove(c)
	if !c.registered.Load() {
		return
	}
	// A close frame (or a close we sent) is a sign of life; a dropped TCP
	// connection is not, so last_seen stays at the last frame received.
	cause := presence.Closed
	switch {
	case c.closeFrame.Load():
	case time.Duration(s.cfg.Now().UnixNano()-c.lastFrame.Load()) >= s.cfg.TTL:
		cause = presence.Expired
	default:
		cause = presence.Lost
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.timed(store.OpDisconnect, func() error { return s.store.Disconnect(ctx, c.id, cause) })
	if err != nil && !errors.Is(err, store.ErrUnknownConn) {
		s.log.Warn("disconnect", "err", err)
	}
}

func websocketRequest(r *http.Request) bool {
	return headerHas(r.Header, "Connection", "upgrade") && headerHas(r.Header, "Upgrade", "websocket")
}

func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, part := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(part), token) {
				return true
			}
		}
	}
	return false
}

func sharesAny(a, b []string) bool {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return true
			}
		}
	}
	return false
}
