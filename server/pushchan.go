package server

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/pusher"
	"github.com/greendot/greendot/store"
)

// pxMessage is an event for channels, as it crosses nodes (store.Broadcaster).
type pxMessage struct {
	Channels []string        `json:"c"`
	Event    string          `json:"e"`
	Data     json.RawMessage `json:"d"`           // the frame's data, as it is sent
	Exclude  string          `json:"x,omitempty"` // socket id that gets nothing
	UserID   string          `json:"u,omitempty"` // sender of a client event on a presence channel
	// Terminate: close every socket of this user instead (the REST API's
	// terminate_connections).
	Terminate string `json:"t,omitempty"`
}

// publish sends m to the subscribers of its channels on every node.
func (p *pxServer) publish(ctx context.Context, m pxMessage) error {
	if p.bus == nil {
		p.deliver(m)
		return nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return p.bus.Broadcast(ctx, b)
}

func (p *pxServer) onBroadcast(payload []byte) {
	var m pxMessage
	if err := json.Unmarshal(payload, &m); err != nil {
		p.s.log.Warn("pusher broadcast: undecodable message", "err", err)
		return
	}
	p.deliver(m)
}

// deliver writes m to the local subscribers of its channels. A socket
// subscribed to several of them gets it once per channel, as Pusher does.
func (p *pxServer) deliver(m pxMessage) {
	if m.Terminate != "" {
		p.terminate(m.Terminate)
		return
	}
	for _, ch := range m.Channels {
		frame := pusher.FrameRaw(m.Event, ch, m.Data, m.UserID)
		var to []*pxConn
		p.mu.Lock()
		if team, ok := pusher.PresenceTeam(ch); ok && pusher.KindOf(ch) == pusher.Presence {
			if t := p.teams[team]; t != nil {
				t.mu.Lock()
				for pc := range t.subs {
					to = append(to, pc)
				}
				t.mu.Unlock()
			}
		} else {
			for pc := range p.channels[ch] {
				to = append(to, pc)
			}
		}
		p.mu.Unlock()
		n := 0
		for _, pc := range to {
			if pc.socketID != m.Exclude {
				pc.write(frame)
				n++
			}
		}
		p.s.metrics.pusherDelivered.Add(float64(n))
	}
}

// terminate closes the user's sockets here; 4009 tells pusher-js not to
// reconnect.
func (p *pxServer) terminate(user string) {
	var to []*pxConn
	p.mu.Lock()
	for pc := range p.conns {
		pc.mu.Lock()
		if pc.user == user {
			to = append(to, pc)
		}
		pc.mu.Unlock()
	}
	p.mu.Unlock()
	for _, pc := range to {
		pc.fail(pusher.CodeUnauthorized, "connection terminated by the app (terminate_connections)")
	}
}

// clientEvent relays a client-* event to the other subscribers of a
// private or presence channel that the sender subscribes.
func (p *pxServer) clientEvent(pc *pxConn, in pusher.Incoming, now time.Time) {
	if !p.cfg.ClientEvents {
		pc.write(pusher.ErrorFrame(0, "client events are not enabled on this server (greendot serve --pusher-client-events)"))
		return
	}
	if !pusher.ValidClientEvent(in.Event) {
		pc.write(pusher.ErrorFrame(0, fmt.Sprintf("client event names start with client- and have at most %d characters", pusher.MaxEventNameLen)))
		return
	}
	kind := pusher.KindOf(in.Channel)
	if kind != pusher.Private && kind != pusher.Presence {
		pc.write(pusher.ErrorFrame(0, "client events are allowed on private- and presence- channels only"))
		return
	}
	pc.mu.Lock()
	subscribed := pc.subs.has(in.Channel)
	user := pc.user
	pc.mu.Unlock()
	if !subscribed {
		pc.write(pusher.ErrorFrame(0, "client event on a channel this socket has not subscribed: "+trimForMessage(in.Channel)))
		return
	}
	if len(in.Data) > pxMaxEventData {
		pc.write(pusher.ErrorFrame(0, fmt.Sprintf("client event data exceeds %d bytes", pxMaxEventData)))
		return
	}
	// Frame handler only: serial per socket.
	// A wall clock stepped back refills nothing rather than taking tokens.
	if d := now.UnixNano() - pc.evRefilled; d > 0 {
		pc.evTokens = min(pxClientEventRate, pc.evTokens+time.Duration(d).Seconds()*pxClientEventRate)
	}
	pc.evRefilled = now.UnixNano()
	if pc.evTokens < 1 {
		pc.write(pusher.ErrorFrame(pusher.CodeClientEventRateLimit, fmt.Sprintf("client event rejected: more than %d per second", pxClientEventRate)))
		return
	}
	pc.evTokens--
	data := in.Data
	if len(data) == 0 {
		data = json.RawMessage("{}")
	}
	m := pxMessage{Channels: []string{in.Channel}, Event: in.Event, Data: data, Exclude: pc.socketID}
	if kind == pusher.Presence {
		m.UserID = user
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := p.publish(ctx, m); err != nil {
		p.s.log.Warn("pusher client event", "err", err)
		pc.write(pusher.ErrorFrame(0, "client event not delivered: store unavailable"))
	}
}

// signin authenticates the socket as a user (pusher:signin): it becomes
// one of the user's devices, and its watchlist is reported.
func (p *pxServer) signin(pc *pxConn, si pusher.Signin) {
	if !pusher.CheckUserAuth(p.cfg.Key, p.cfg.Secret, pc.socketID, si.UserData, si.Auth) {
		p.s.metrics.pusherSubscribeErrors.WithLabelValues("SigninError").Inc()
		pc.fail(pusher.CodeUnauthorized, "Invalid signature: expected HMAC SHA256 hex digest of socket_id::user::user_data")
		return
	}
	pc.signed()
	ud, err := pusher.ParseUserData(si.UserData)
	if err != nil {
		pc.fail(pusher.CodeUnauthorized, "invalid user_data: "+err.Error())
		return
	}
	if !protocol.ValidID(ud.ID) {
		pc.fail(pusher.CodeUnauthorized, "invalid user_data: id is 1 to 128 bytes of printable UTF-8")
		return
	}
	for _, w := range ud.Watchlist {
		if !protocol.ValidID(w) {
			pc.fail(pusher.CodeUnauthorized, "invalid user_data: watchlist ids are 1 to 128 bytes of printable UTF-8")
			return
		}
	}
	pc.mu.Lock()
	if pc.user != "" && pc.user != ud.ID {
		user := pc.user
		pc.mu.Unlock()
		pc.fail(pusher.CodeUnauthorized, fmt.Sprintf("this socket is user %q and cannot sign in as another", user))
		return
	}
	pc.signedIn = true
	pc.user = ud.ID
	pc.watch = make(map[string]pxWatched, len(ud.Watchlist))
	for _, w := range ud.Watchlist {
		pc.watch[w] = pxWatched{}
	}
	pc.watchList = ud.Watchlist
	pc.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	gc, err := p.identify(ctx, pc, ud.ID)
	if err != nil {
		p.s.log.Warn("pusher signin", "err", err)
		pc.fail(pusher.CodeReconnect, "store unavailable; reconnect")
		return
	}
	if gc == nil {
		return
	}
	pc.write(pusher.Frame("pusher:signin_success", "", map[string]string{"user_data": si.UserData}))
	p.reportWatchlist(ctx, pc, ud.ID, ud.Watchlist)
}

// reportWatchlist sends the watched users online now; changes follow from
// watchChange. Only teammates are reported: greendot shows presence to
// those who share a team, and the watchlist does not widen that.
func (p *pxServer) reportWatchlist(ctx context.Context, pc *pxConn, user string, ids []string) {
	if len(ids) == 0 {
		return
	}
	shares, err := p.s.sharesTeamWith(ctx, user, ids)
	if err != nil {
		p.s.log.Warn("pusher watchlist", "err", err)
		return
	}
	var mates []string
	for _, id := range ids {
		if shares[id] {
			mates = append(mates, id)
		}
	}
	ps, err := p.s.readStates(ctx, mates)
	if err != nil {
		p.s.log.Warn("pusher watchlist", "err", err)
		return
	}
	var online []string
	pc.mu.Lock()
	for _, st := range ps {
		w, ok := pc.watch[st.UserID]
		if !ok || (w.version != 0 && st.Version <= w.version) {
			continue
		}
		on := st.State != presence.Offline
		pc.watch[st.UserID] = pxWatched{version: st.Version, online: on}
		if on {
			online = append(online, st.UserID)
		}
	}
	if len(online) > 0 {
		pc.write(watchlistFrame("online", online))
	}
	pc.mu.Unlock()
}

func watchlistFrame(name string, ids []string) []byte {
	type ev struct {
		Name    string   `json:"name"`
		UserIDs []string `json:"user_ids"`
	}
	return pusher.Frame("pusher_internal:watchlist_events", "", map[string][]ev{"events": {{name, ids}}})
}

// watchChange reports a change of a watched user (the hub queues every
// change its user may see on the user's connection, c.queue).
func (pc *pxConn) watchChange(ch protocol.Change) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	w, ok := pc.watch[ch.UserID]
	if !ok || ch.Version <= w.version {
		return
	}
	on := ch.State != presence.Offline.String()
	pc.watch[ch.UserID] = pxWatched{version: ch.Version, online: on}
	if on != w.online {
		pc.write(watchlistFrame(map[bool]string{true: "online", false: "offline"}[on], []string{ch.UserID}))
	}
}

// countsLoop writes this node's channel counts for the cluster's REST
// reads (store.ChannelCounter) when they changed, and at least every
// ChannelCountsRefresh so that they stay counted.
func (p *pxServer) countsLoop() {
	defer p.s.wg.Done()
	cc, ok := p.s.store.(store.ChannelCounter)
	if _, shared := p.s.store.(store.Watcher); !ok || !shared {
		return
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last time.Time
	for {
		select {
		case <-p.s.stop:
			return
		case <-tick.C:
		}
		p.mu.Lock()
		due := p.dirty || time.Since(last) >= store.ChannelCountsRefresh
		var counts map[string]int
		if due {
			counts = make(map[string]int, len(p.counts))
			for ch, n := range p.counts {
				counts[ch] = n
			}
			p.dirty = false
		}
		p.mu.Unlock()
		if !due {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := cc.SetChannelCounts(ctx, counts)
		cancel()
		if err != nil {
			p.mu.Lock()
			p.dirty = true
			p.mu.Unlock()
			p.s.log.Warn("pusher channel counts", "err", err)
			continue
		}
		last = time.Now()
	}
}

// channelCounts is the subscription count of every occupied channel with
// prefix, over the cluster when the store is shared.
func (p *pxServer) channelCounts(ctx context.Context, prefix string) (map[string]int, error) {
	if cc, ok := p.s.store.(store.ChannelCounter); ok {
		if _, shared := p.s.store.(store.Watcher); shared {
			return cc.ChannelCounts(ctx, prefix)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int)
	for ch, n := range p.counts {
		if len(ch) >= len(prefix) && ch[:len(prefix)] == prefix {
			out[ch] = n
		}
	}
	return out, nil
}
