package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/pusher"
)

// The Pusher side of the run (Options.Protocol "pusher"): each member is a
// Pusher protocol 7 socket at /app/{key}, subscribed to presence-{team}
// with the auth an app's auth endpoint would sign, as pusher-js is once
// its presence channel is authorised.

// Protocols a run's connections may speak.
const (
	protoNative = "native"
	protoPusher = "pusher"
)

// pxReadLimit bounds one frame read: a subscription_succeeded carries the
// whole member list, far past the WebSocket library's 32 KiB default for a
// team of a thousand.
const pxReadLimit = 16 << 20

// pxSocket is one Pusher socket of the run.
type pxSocket struct {
	conn     *websocket.Conn
	socketID string
	members  int // in the subscription_succeeded answer

	cancel  context.CancelFunc // ends the reader and the pinger
	done    chan struct{}      // closed when the reader ends
	pinged  chan struct{}      // closed when the pinger ends
	closing atomic.Bool        // Close was called: the reader's end is no drop
}

// pxFrame is a server frame. Data of pusher: and pusher_internal: events
// is a JSON string holding JSON, Pusher's double encoding.
type pxFrame struct {
	Event   string          `json:"event"`
	Channel string          `json:"channel"`
	Data    json.RawMessage `json:"data"`
}

// inner decodes the frame's data, a string of JSON or (pusher:error) an
// object, into v.
func (f pxFrame) inner(v any) error {
	raw := []byte(f.Data)
	var s string
	if json.Unmarshal(f.Data, &s) == nil {
		raw = []byte(s)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("loadgen: %s data %q: %w", f.Event, truncate(string(f.Data), 80), err)
	}
	return nil
}

// pxMemberEvent is a member_added or member_removed of the socket's channel.
type pxMemberEvent struct {
	Added    bool
	UserID   string
	Received time.Time
}

// pxEvents are what a socket reports once subscribed; each may be nil. They
// run on the socket's reader: they must not block.
type pxEvents struct {
	onMember func(pxMemberEvent)
	onError  func(pxFrame) // pusher:error, pusher:subscription_error after the answer
	onDown   func()        // the socket ended, once
}

func pxChannel(team string) string { return "presence-" + team }

// channelData is the presence channel_data of user, as an app's auth
// endpoint hands it to pusher-js.
func channelData(user string) string {
	b, _ := json.Marshal(struct {
		UserID   string          `json:"user_id"`
		UserInfo json.RawMessage `json:"user_info"`
	}{user, json.RawMessage("{}")})
	return string(b)
}

// dialPusher opens one socket to target for m and subscribes it to
// channel; it returns once the subscription is answered.
func (d *dialer) dialPusher(ctx context.Context, m *member, channel string, ev pxEvents) (*pxSocket, error) {
	var err error
	for attempt := range 3 {
		var s *pxSocket
		if s, err = d.dialPusherOnce(ctx, m, channel, ev); err == nil {
			d.ctr.dials.Add(1)
			return s, nil
		}
		var refused *pxRefusedError
		if errors.As(err, &refused) || !sleepCtx(ctx, time.Duration(100<<attempt)*time.Millisecond) {
			break
		}
	}
	d.ctr.dialErrs.Add(1)
	return nil, err
}

// pxRefusedError is a subscription or connection the server refused: no
// retry makes it succeed.
type pxRefusedError struct{ msg string }

func (e *pxRefusedError) Error() string { return "loadgen: pusher: " + e.msg }

func (d *dialer) dialPusherOnce(ctx context.Context, m *member, channel string, ev pxEvents) (*pxSocket, error) {
	o := d.o
	u := o.Targets[m.target] + "/app/" + url.PathEscape(o.PusherKey) + "?protocol=7&client=greendot-bench&version=1"
	hs, cancelHS := context.WithTimeout(ctx, 15*time.Second)
	defer cancelHS()
	conn, _, err := websocket.Dial(hs, u, &websocket.DialOptions{HTTPClient: d.hc})
	if err != nil {
		return nil, fmt.Errorf("loadgen: pusher: dial %s: %w", u, err)
	}
	conn.SetReadLimit(pxReadLimit)
	fail := func(err error) (*pxSocket, error) {
		_ = conn.CloseNow()
		return nil, err
	}
	f, err := readPx(hs, conn)
	if err != nil {
		return fail(err)
	}
	var est struct {
		SocketID        string `json:"socket_id"`
		ActivityTimeout int    `json:"activity_timeout"`
	}
	switch {
	case f.Event == pusher.EventError:
		return fail(&pxRefusedError{"connect: " + string(f.Data)})
	case f.Event != pusher.EventConnectionEstablished:
		return fail(fmt.Errorf("loadgen: pusher: first frame %q, want %s", f.Event, pusher.EventConnectionEstablished))
	}
	if err := f.inner(&est); err != nil {
		return fail(err)
	}
	if est.SocketID == "" || est.ActivityTimeout < 1 {
		return fail(fmt.Errorf("loadgen: pusher: connection_established %s", f.Data))
	}
	cd := channelData(m.user)
	sub, _ := json.Marshal(map[string]any{"event": pusher.EventSubscribe, "data": map[string]string{
		"channel": channel, "channel_data": cd,
		"auth": o.PusherKey + ":" + pusher.SignChannel(o.PusherSecret, est.SocketID, channel, cd),
	}})
	if err := conn.Write(hs, websocket.MessageText, sub); err != nil {
		return fail(fmt.Errorf("loadgen: pusher: subscribe: %w", err))
	}
	members := 0
	for members == 0 {
		f, err := readPx(hs, conn)
		if err != nil {
			return fail(err)
		}
		switch {
		case f.Event == pusher.EventSubscriptionError || f.Event == pusher.EventError:
			return fail(&pxRefusedError{"subscribe " + channel + ": " + string(f.Data)})
		case f.Event == pusher.EventSubscriptionSucceeded && f.Channel == channel:
			var p struct {
				Presence struct {
					Count int      `json:"count"`
					IDs   []string `json:"ids"`
				} `json:"presence"`
			}
			if err := f.inner(&p); err != nil {
				return fail(err)
			}
			if p.Presence.Count < 1 || len(p.Presence.IDs) != p.Presence.Count {
				return fail(fmt.Errorf("loadgen: pusher: subscription_succeeded of %d members lists %d", p.Presence.Count, len(p.Presence.IDs)))
			}
			members = p.Presence.Count
		}
		// Anything else before the answer (nothing is expected) is skipped.
	}
	rctx, cancel := context.WithCancel(context.Background())
	s := &pxSocket{conn: conn, socketID: est.SocketID, members: members, cancel: cancel,
		done: make(chan struct{}), pinged: make(chan struct{})}
	d.ctr.conns.Add(1)
	go s.read(rctx, d.ctr, ev)
	go s.ping(rctx, time.Duration(est.ActivityTimeout)*time.Second)
	return s, nil
}

func readPx(ctx context.Context, conn *websocket.Conn) (pxFrame, error) {
	_, b, err := conn.Read(ctx)
	if err != nil {
		return pxFrame{}, fmt.Errorf("loadgen: pusher: read: %w", err)
	}
	var f pxFrame
	if err := json.Unmarshal(b, &f); err != nil || f.Event == "" {
		return pxFrame{}, fmt.Errorf("loadgen: pusher: frame %q is not a Pusher frame", truncate(string(b), 80))
	}
	return f, nil
}

// read is the socket's one reader: it reports member events until the
// socket ends.
func (s *pxSocket) read(ctx context.Context, ctr *counters, ev pxEvents) {
	defer close(s.done)
	defer func() {
		ctr.conns.Add(-1)
		if ev.onDown != nil {
			ev.onDown()
		}
	}()
	for {
		f, err := readPx(ctx, s.conn)
		if err != nil {
			if !s.closing.Load() {
				ctr.drop(err.Error())
			}
			return
		}
		switch f.Event {
		case pusher.EventMemberAdded, pusher.EventMemberRemoved:
			var m struct {
				UserID string `json:"user_id"`
			}
			if f.inner(&m) != nil || m.UserID == "" {
				if ev.onError != nil {
					ev.onError(f)
				}
				continue
			}
			if ev.onMember != nil {
				ev.onMember(pxMemberEvent{Added: f.Event == pusher.EventMemberAdded, UserID: m.UserID, Received: time.Now()})
			}
		case pusher.EventPing:
			_ = s.conn.Write(ctx, websocket.MessageText, []byte(`{"event":"pusher:pong","data":{}}`))
		case pusher.EventError, pusher.EventSubscriptionError:
			if ev.onError != nil {
				ev.onError(f)
			}
		}
	}
}

// ping sends pusher:ping every activity timeout, each gap uniform in
// [0.7, 1.0] of it like the native client's heartbeats, so both protocols
// keep their connections alive at the same rate. It ends with the socket.
func (s *pxSocket) ping(ctx context.Context, activity time.Duration) {
	defer close(s.pinged)
	for {
		t := time.NewTimer(time.Duration(float64(activity) * (0.7 + 0.3*rand.Float64())))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-s.done:
			t.Stop()
			return
		case <-t.C:
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := s.conn.Write(wctx, websocket.MessageText, []byte(`{"event":"pusher:ping","data":{}}`))
		cancel()
		if err != nil {
			return
		}
	}
}

// Close ends the socket with a normal close and waits for its reader and
// pinger.
func (s *pxSocket) Close() error {
	s.closing.Store(true)
	err := s.conn.Close(websocket.StatusNormalClosure, "")
	s.cancel()
	<-s.done
	<-s.pinged
	return err
}

// reportDrops adds the Pusher sockets that ended before the run closed
// them: the server closed them, or their TCP connection broke.
func (d *driver) reportDrops() {
	p := d.progress()
	d.res.add("pusher_dropped", "Pusher sockets closed under the load generator", float64(p.Drops), "")
	d.res.goal(0, false, "0")
	if p.Drops > 0 {
		d.res.note("%d Pusher sockets ended before the run closed them; the first: %s", p.Drops, p.DropReason)
	}
}
