package server

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lesismal/nbio/nbhttp/websocket"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/pusher"
	"github.com/greendot/greendot/store"
)

// PusherConfig turns on Pusher Channels compatibility (docs/pusher.md): the
// listener speaks Pusher protocol 7 at /app/{key} and Pusher's signed REST
// API at /apps/{app_id}/. All of AppID, Key and Secret, or none.
type PusherConfig struct {
	AppID, Key, Secret string
	// ClientEvents relays client-* events between the sockets of private
	// and presence channels; off, they are refused.
	ClientEvents bool
}

func (c PusherConfig) enabled() bool { return c.AppID != "" }

// Limits a Pusher user knows (docs/pusher.md).
const (
	pxMaxEventData      = 10 << 10 // bytes of an event's data, client or REST
	pxMaxChannelsPerSub = 100      // channels one socket may subscribe: its memory is bounded before any auth
	pxClientEventRate   = 10       // client events per second per socket
	pxMaxTriggerChans   = 100      // channels of one REST event
	pxMaxBatch          = 10       // events of one batch_events call
	pxDevice            = "pusher" // the device kind of a Pusher socket
)

// pxServer is the Pusher side of a node: its sockets, which of them
// subscribe which channel, and the presence channels (pxTeam).
type pxServer struct {
	s   *Server
	cfg PusherConfig
	bus store.Broadcaster // nil: one node, delivered here only

	mu       sync.Mutex
	conns    map[*pxConn]struct{}
	channels map[string]map[*pxConn]struct{} // public, private and user channels
	teams    map[string]*pxTeam              // presence channels by team
	counts   map[string]int                  // subscriptions here by channel
	dirty    bool                            // counts changed since last written
	stopped  bool                            // Shutdown: no channel loop starts
}

// stop keeps new presence channels from starting their loops once Shutdown
// waits for the server's goroutines.
func (p *pxServer) stop() {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
}

// pxConn is one Pusher socket. base carries its writes and is the socket's
// session; gc is the greendot connection of its user, from the socket's
// first presence subscription or sign-in until it closes.
type pxConn struct {
	px       *pxServer
	base     *client
	socketID string
	gc       atomic.Pointer[client]

	// Only the frame handler (serial per socket) touches these.
	evTokens   float64
	evRefilled int64 // Unix ns

	mu        sync.Mutex
	closed    bool
	signedIn  bool   // pusher:signin succeeded
	user      string // "" until identified
	subs      subList
	watch     map[string]pxWatched
	watchList []string
}

// subList is a socket's subscribed channels. A socket holds a few (at most
// pxMaxChannelsPerSub), and a map of one channel costs ~250 bytes per socket
// where a slice costs a string header.
type subList []string

func (l subList) has(ch string) bool { return slices.Contains(l, ch) }

// remove deletes ch and reports whether it was there. Order is not kept.
func (l *subList) remove(ch string) bool {
	i := slices.Index(*l, ch)
	if i < 0 {
		return false
	}
	last := len(*l) - 1
	(*l)[i] = (*l)[last]
	(*l)[last] = ""
	*l = (*l)[:last]
	return true
}

type pxWatched struct {
	version uint64
	online  bool
}

func newPusher(s *Server) *pxServer {
	p := &pxServer{
		s:        s,
		cfg:      s.cfg.Pusher,
		conns:    make(map[*pxConn]struct{}),
		channels: make(map[string]map[*pxConn]struct{}),
		teams:    make(map[string]*pxTeam),
		counts:   make(map[string]int),
	}
	if b, ok := s.store.(store.Broadcaster); ok {
		p.bus = b
		b.OnBroadcast(p.onBroadcast)
	}
	return p
}

// handleApp upgrades /app/{key}: Pusher refuses a wrong key or protocol
// after the upgrade, with pusher:error and the same close code.
func (s *Server) handleApp(w http.ResponseWriter, r *http.Request) {
	if !s.mayConnect(w, r) || !s.validUpgrade(w, r) {
		closeAfterResponse(w)
		return
	}
	ws, err := s.upgrader.Upgrade(w, r, nil)
	if err != nil {
		closeAfterResponse(w)
		return
	}
	s.upgradedSocket(ws)
	now := s.cfg.Now()
	c := &client{srv: s, ws: ws, id: randomID(8), device: pxDevice}
	c.lastFrame.Store(now.UnixNano())
	c.tokens = float64(s.cfg.RateBurst)
	c.refilled = now.UnixNano()
	pc := &pxConn{px: s.px, base: c, socketID: pusher.NewSocketID(), evTokens: pxClientEventRate, evRefilled: now.UnixNano()}
	c.px = pc
	ws.SetSession(c)
	if nbc := nbioConn(ws); nbc != nil {
		s.bindWalker(nbc, c)
	}
	s.trackWrites(c)
	if r.PathValue("key") != s.cfg.Pusher.Key {
		pc.fail(pusher.CodeAppNotFound, fmt.Sprintf("App key %s not in this cluster. Did you forget to specify the cluster?", r.PathValue("key")))
		return
	}
	if code, ok := pusher.CheckProtocol(r.URL.Query().Get("protocol")); !ok {
		pc.fail(code, "Unsupported protocol version: this server speaks Pusher protocol 7")
		return
	}
	// Not authenticated yet (admission): public channels need no auth, so a
	// socket counts against --max-unauthenticated-per-ip until it makes a
	// signed subscription or sign-in (pxConn.signed).
	s.px.mu.Lock()
	s.px.conns[pc] = struct{}{}
	s.px.mu.Unlock()
	s.metrics.pusherConns.Inc()
	// pusher-js pings after activity_timeout of silence: the heartbeat
	// interval keeps it inside the ttl like a native client.
	activity := max(1, int(s.cfg.HeartbeatInterval.Round(time.Second)/time.Second))
	pc.write(pusher.Frame("pusher:connection_established", "", map[string]any{
		"socket_id": pc.socketID, "activity_timeout": activity,
	}))
	c.startLiveness()
}

// signed notes that the socket made a request signed with the app secret:
// it no longer counts as unauthenticated. Idempotent.
func (pc *pxConn) signed() {
	if nbc := nbioConn(pc.base.ws); nbc != nil {
		pc.px.s.adm.authenticated(nbc)
	}
}

// fail sends pusher:error and closes with the same code, as Pusher does for
// errors that end a connection.
func (pc *pxConn) fail(code int, msg string) {
	pc.write(pusher.ErrorFrame(code, msg))
	pc.base.closeWith(code, msg)
}

func (pc *pxConn) write(b []byte) {
	pc.base.mu.Lock()
	pc.base.writeLocked(b)
	pc.base.mu.Unlock()
}

// alive notes a sign of life of the socket, and of its user's connection.
func (p *pxServer) alive(pc *pxConn, now time.Time) {
	pc.base.lastFrame.Store(now.UnixNano())
	if gc := pc.gc.Load(); gc != nil {
		p.s.signOfLife(gc, now)
	}
}

func (p *pxServer) onMessage(pc *pxConn, mt websocket.MessageType, data []byte) {
	c := pc.base
	if mt == websocket.BinaryMessage {
		c.closeWith(protocol.CloseUnsupported, "binary frames are not accepted")
		return
	}
	now := p.s.cfg.Now()
	p.alive(pc, now)
	if !c.allow(now, 1) {
		if c.limited == 1 {
			pc.write(pusher.ErrorFrame(0, "too many frames; slow down or be disconnected"))
		}
		return
	}
	if len(data) > pxMaxEventData+2048 {
		c.closeWith(protocol.CloseTooBig, "message exceeds 10 KiB")
		return
	}
	in, err := pusher.Decode(data)
	if err != nil {
		pc.write(pusher.ErrorFrame(0, err.Error()))
		return
	}
	p.s.metrics.pusherFrames.WithLabelValues(pxFrameKind(in.Event)).Inc()
	switch in.Event {
	case "pusher:ping":
		pc.write(pusher.Frame("pusher:pong", "", struct{}{}))
	case "pusher:pong":
	case "pusher:subscribe":
		sub, err := pusher.DecodeSubscribe(in.Data)
		if err != nil {
			pc.write(pusher.ErrorFrame(0, err.Error()))
			return
		}
		p.subscribe(pc, sub)
	case "pusher:unsubscribe":
		ch, err := pusher.DecodeUnsubscribe(in.Data)
		if err != nil {
			pc.write(pusher.ErrorFrame(0, err.Error()))
			return
		}
		p.unsubscribe(pc, ch)
	case "pusher:signin":
		si, err := pusher.DecodeSignin(in.Data)
		if err != nil {
			pc.write(pusher.ErrorFrame(0, err.Error()))
			return
		}
		p.signin(pc, si)
	default:
		if strings.HasPrefix(in.Event, "client-") {
			p.clientEvent(pc, in, now)
			return
		}
		pc.write(pusher.ErrorFrame(0, fmt.Sprintf("unknown event %q", trimForMessage(in.Event))))
	}
}

// pxFrameKind bounds the metric's label set.
func pxFrameKind(ev string) string {
	switch ev {
	case "pusher:ping", "pusher:pong", "pusher:subscribe", "pusher:unsubscribe", "pusher:signin":
		return ev
	}
	if strings.HasPrefix(ev, "client-") {
		return "client-event"
	}
	return "other"
}

func trimForMessage(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

func userChannel(user string) string { return "#server-to-user-" + user }

func (p *pxServer) subscribe(pc *pxConn, sub pusher.Subscribe) {
	ch := sub.Channel
	subErr := func(typ, msg string, status int) {
		p.s.metrics.pusherSubscribeErrors.WithLabelValues(typ).Inc()
		pc.write(pusher.SubscriptionError(ch, typ, msg, status))
	}
	if strings.HasPrefix(ch, "#server-to-user-") {
		pc.mu.Lock()
		ok := pc.signedIn && ch == userChannel(pc.user)
		pc.mu.Unlock()
		if !ok {
			subErr("AuthError", "the server-to-user channel of a user is open only to a socket signed in as that user", 403)
			return
		}
		if p.addSub(pc, ch) {
			pc.write(pusher.Frame("pusher_internal:subscription_succeeded", ch, struct{}{}))
		}
		return
	}
	if !pusher.ValidChannel(ch) {
		subErr("InvalidChannel", "invalid channel name: 1 to 164 characters of A-Z a-z 0-9 _ - = @ , . ;", 400)
		return
	}
	kind := pusher.KindOf(ch)
	if kind == pusher.Public {
		if p.addSub(pc, ch) {
			pc.write(pusher.Frame("pusher_internal:subscription_succeeded", ch, struct{}{}))
		} else {
			subErr(errTooManyChannels.typ, errTooManyChannels.msg, errTooManyChannels.status)
		}
		return
	}
	data := ""
	if kind == pusher.Presence {
		data = sub.ChannelData
	}
	if !pusher.CheckChannelAuth(p.cfg.Key, p.cfg.Secret, pc.socketID, ch, data, sub.Auth) {
		subErr("AuthError", "invalid signature: expected HMAC SHA256 hex digest of socket_id:channel"+map[bool]string{true: ":channel_data", false: ""}[kind == pusher.Presence], 401)
		return
	}
	pc.signed()
	if kind != pusher.Presence {
		if p.addSub(pc, ch) {
			pc.write(pusher.Frame("pusher_internal:subscription_succeeded", ch, struct{}{}))
		} else {
			subErr(errTooManyChannels.typ, errTooManyChannels.msg, errTooManyChannels.status)
		}
		return
	}
	cd, err := pusher.ParseChannelData(sub.ChannelData)
	if err != nil {
		subErr("InvalidChannelData", err.Error(), 400)
		return
	}
	team, _ := pusher.PresenceTeam(ch)
	if !protocol.ValidID(team) || !protocol.ValidID(cd.UserID) {
		subErr("InvalidChannelData", "team and user ids are 1 to 128 bytes of printable UTF-8", 400)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.joinPresence(ctx, pc, ch, team, cd); err != nil {
		var se *pxSubError
		if errors.As(err, &se) {
			subErr(se.typ, se.msg, se.status)
			return
		}
		p.s.log.Warn("pusher presence subscription", "err", err)
		subErr("ServerError", "store unavailable; retry", 503)
	}
}

type pxSubError struct {
	typ, msg string
	status   int
}

func (e *pxSubError) Error() string { return e.msg }

// errTooManyChannels refuses a subscription past pxMaxChannelsPerSub.
var errTooManyChannels = &pxSubError{"LimitReached", fmt.Sprintf("a socket may subscribe at most %d channels", pxMaxChannelsPerSub), 429}

// joinPresence makes the user a member of team (a presence subscription is
// the app's word that they are), this socket one of their devices, and
// subscribes it; the team's channel answers with subscription_succeeded.
func (p *pxServer) joinPresence(ctx context.Context, pc *pxConn, ch, team string, cd pusher.ChannelData) error {
	pc.mu.Lock()
	user, closed := pc.user, pc.closed
	pc.mu.Unlock()
	if closed {
		return nil
	}
	if user != "" && user != cd.UserID {
		return &pxSubError{"AuthError", fmt.Sprintf("this socket is user %q: its presence subscriptions must all be that user", user), 403}
	}
	s := p.s
	if s.cfg.LargeTeam > 0 {
		if mc, ok := s.store.(store.MemberCounter); ok {
			n, err := mc.MemberCount(ctx, team)
			if err != nil {
				return err
			}
			if n > s.cfg.LargeTeam {
				return &pxSubError{"LimitReached", fmt.Sprintf("presence channels are limited to %d members (--large-team)", s.cfg.LargeTeam), 403}
			}
		}
	}
	teams, err := s.store.TeamsOf(ctx, cd.UserID)
	if err != nil {
		return err
	}
	if !slices.Contains(teams, team) {
		if err := s.timed(store.OpMembership, func() error { return s.store.AddMember(ctx, team, cd.UserID) }); err != nil {
			return err
		}
	}
	if mi, ok := s.store.(store.MemberInfos); ok {
		if err := mi.SetMemberInfo(ctx, team, cd.UserID, cd.UserInfo); err != nil {
			return err
		}
	}
	p.noteInfo(team, cd.UserID, cd.UserInfo)
	gc, err := p.identify(ctx, pc, cd.UserID)
	if err != nil || gc == nil {
		return err
	}
	s.hub.ensureIndexed(ctx, gc.user, team)
	t, ok := p.retainTeam(pc, ch, team)
	if !ok {
		return errTooManyChannels
	}
	t.enqueue(pxItem{kind: itemSub, conn: pc, user: cd.UserID, info: cd.UserInfo})
	return nil
}

// identify makes the socket a device of user: a greendot connection in the
// hub and the store, like a native connect. It returns nil, nil when the
// socket closed meanwhile.
func (p *pxServer) identify(ctx context.Context, pc *pxConn, user string) (*client, error) {
	if gc := pc.gc.Load(); gc != nil {
		return gc, nil
	}
	s := p.s
	if s.intact() != nil {
		return nil, errors.New(msgRecovering)
	}
	release, ok := s.reserveConn(user)
	if !ok {
		return nil, &pxSubError{"LimitReached", fmt.Sprintf("this user already has %d connections on this node", s.cfg.MaxConnectionsPerUser), 429}
	}
	defer release()
	now := s.cfg.Now()
	gc := &client{srv: s, ws: pc.base.ws, id: randomID(8), user: user, device: pxDevice, px: pc}
	gc.lastFrame.Store(now.UnixNano())
	pc.mu.Lock()
	if pc.closed {
		pc.mu.Unlock()
		return nil, nil
	}
	pc.user = user
	pc.gc.Store(gc)
	pc.mu.Unlock()
	if _, err := s.hub.add(ctx, gc); err != nil {
		release()
		p.drop(pc, gc)
		return nil, err
	}
	release()
	err := s.timed(store.OpConnect, func() error {
		return s.store.Connect(ctx, presence.Conn{ID: gc.id, UserID: user, Device: pxDevice, Node: s.cfg.NodeID})
	})
	if err != nil {
		p.drop(pc, gc)
		return nil, err
	}
	gc.registered.Store(true)
	pc.mu.Lock()
	closed := pc.closed
	pc.mu.Unlock()
	if closed {
		// onClose may have run before registered was set.
		s.hub.remove(gc)
		_ = s.store.Disconnect(ctx, gc.id, presence.Closed)
		return nil, nil
	}
	return gc, nil
}

// drop undoes a failed identify: the socket is anonymous again.
func (p *pxServer) drop(pc *pxConn, gc *client) {
	p.s.hub.remove(gc)
	pc.mu.Lock()
	if pc.gc.Load() == gc {
		pc.gc.Store(nil)
		if !pc.signedIn {
			pc.user = ""
		}
	}
	pc.mu.Unlock()
}

// addSub records a subscription of a non-presence channel; false when the
// socket has too many.
func (p *pxServer) addSub(pc *pxConn, ch string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.closed {
		return false
	}
	if pc.subs.has(ch) {
		return true
	}
	if len(pc.subs) >= pxMaxChannelsPerSub {
		return false
	}
	pc.subs = append(pc.subs, ch)
	set := p.channels[ch]
	if set == nil {
		set = make(map[*pxConn]struct{})
		p.channels[ch] = set
	}
	set[pc] = struct{}{}
	p.counts[ch]++
	p.dirty = true
	return true
}

func (p *pxServer) unsubscribe(pc *pxConn, ch string) {
	p.mu.Lock()
	pc.mu.Lock()
	ok := pc.subs.remove(ch)
	pc.mu.Unlock()
	if !ok {
		p.mu.Unlock()
		return
	}
	t := p.releaseLocked(pc, ch)
	p.mu.Unlock()
	if t != nil {
		t.stop()
	}
}

// releaseLocked takes pc out of channel ch; it returns a presence channel
// left with no subscription, for the caller to stop.
func (p *pxServer) releaseLocked(pc *pxConn, ch string) *pxTeam {
	if n := p.counts[ch] - 1; n > 0 {
		p.counts[ch] = n
	} else {
		delete(p.counts, ch)
	}
	p.dirty = true
	if team, ok := pusher.PresenceTeam(ch); ok && pusher.KindOf(ch) == pusher.Presence {
		t := p.teams[team]
		if t == nil {
			return nil
		}
		t.release(pc)
		t.refs--
		if t.refs == 0 {
			delete(p.teams, team)
			return t
		}
		return nil
	}
	if set := p.channels[ch]; set != nil {
		delete(set, pc)
		if len(set) == 0 {
			delete(p.channels, ch)
		}
	}
	return nil
}

// retainTeam records pc's subscription of presence channel ch and returns
// the team's channel, started on first use.
func (p *pxServer) retainTeam(pc *pxConn, ch, team string) (*pxTeam, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pc.mu.Lock()
	if pc.closed || p.stopped {
		pc.mu.Unlock()
		return nil, false
	}
	again := pc.subs.has(ch)
	if !again && len(pc.subs) >= pxMaxChannelsPerSub {
		pc.mu.Unlock()
		return nil, false
	}
	if !again {
		pc.subs = append(pc.subs, ch)
	}
	pc.mu.Unlock()
	t := p.teams[team]
	if t == nil {
		t = newPxTeam(p, team)
		p.teams[team] = t
		p.s.wg.Add(1)
		go t.loop()
	}
	if !again {
		t.refs++
		p.counts[ch]++
		p.dirty = true
	}
	t.pend(pc)
	return t, true
}

// onClose ends a Pusher socket: its subscriptions, and its user's
// connection (which enters grace like a native one).
func (p *pxServer) onClose(pc *pxConn, why error) {
	p.mu.Lock()
	_, counted := p.conns[pc]
	delete(p.conns, pc)
	pc.mu.Lock()
	if pc.closed {
		pc.mu.Unlock()
		p.mu.Unlock()
		return
	}
	pc.closed = true
	subs := pc.subs
	pc.subs = nil
	gc := pc.gc.Load()
	pc.mu.Unlock()
	var stopped []*pxTeam
	for _, ch := range subs {
		if t := p.releaseLocked(pc, ch); t != nil {
			stopped = append(stopped, t)
		}
	}
	p.mu.Unlock()
	if counted {
		p.s.metrics.pusherConns.Dec()
	}
	for _, t := range stopped {
		t.stop()
	}
	if gc == nil {
		return
	}
	s := p.s
	s.log.Debug("pusher socket closed", "socket", pc.socketID, "user", gc.user, "err", why,
		"silent", time.Duration(s.cfg.Now().UnixNano()-pc.base.lastFrame.Load()))
	cause := presence.Closed
	switch {
	case pc.base.closeFrame.Load():
	case time.Duration(s.cfg.Now().UnixNano()-gc.lastFrame.Load()) >= s.cfg.TTL:
		cause = presence.Expired
	default:
		cause = presence.Lost
	}
	gc.markClosed()
	s.hub.remove(gc)
	if !gc.registered.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.timed(store.OpDisconnect, func() error { return s.store.Disconnect(ctx, gc.id, cause) })
	if err != nil && !errors.Is(err, store.ErrUnknownConn) {
		s.log.Warn("disconnect", "err", err)
	}
}

// drain asks every socket to reconnect elsewhere, spread over spread:
// 4200 makes pusher-js reconnect at once.
func (p *pxServer) drain(spread time.Duration) {
	p.mu.Lock()
	conns := make([]*pxConn, 0, len(p.conns))
	for pc := range p.conns {
		conns = append(conns, pc)
	}
	p.mu.Unlock()
	for _, pc := range conns {
		d := time.Duration(0)
		if spread > 0 {
			d = rand.N(spread)
		}
		time.AfterFunc(d, func() {
			pc.write(pusher.ErrorFrame(pusher.CodeReconnect, "server restarting: reconnect"))
			pc.base.closeWith(pusher.CodeReconnect, "server restarting")
		})
	}
}

// count is the number of Pusher sockets on this node.
func (p *pxServer) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}
