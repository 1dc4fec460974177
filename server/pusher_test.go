package server_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/pushertest"
	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/pusher"
	"github.com/greendot/greendot/server"
)

const (
	pxApp    = "123"
	pxKey    = "key-abc"
	pxSecret = "s3cret"
)

func startPusher(t *testing.T, mutate ...func(*server.Config)) *testServer {
	return startServer(t, append([]func(*server.Config){func(c *server.Config) {
		c.Pusher = server.PusherConfig{AppID: pxApp, Key: pxKey, Secret: pxSecret, ClientEvents: true}
	}}, mutate...)...)
}

var pxTestApp = pushertest.App{ID: pxApp, Key: pxKey, Secret: pxSecret}

func (ts *testServer) pxDial(t *testing.T, name string) *pushertest.Socket {
	t.Helper()
	return pushertest.Dial(t, ts.addr, pxTestApp, name, 0)
}

// pxPair connects a socket for each of two users, both members of
// presence-eng; the first has heard the second arrive.
func (ts *testServer) pxPair(t *testing.T, first, second string) (*pushertest.Socket, *pushertest.Socket) {
	t.Helper()
	a := ts.pxDial(t, first)
	a.SubscribePresence("eng", first, "{}")
	a.Members("presence-eng")
	b := ts.pxDial(t, second)
	b.SubscribePresence("eng", second, "{}")
	b.Members("presence-eng")
	a.MemberEvent("pusher_internal:member_added", 5*time.Second)
	return a, b
}

func (ts *testServer) signedRequest(t *testing.T, secret, method, path string, q url.Values, body string) (int, string) {
	t.Helper()
	return pushertest.REST(t, ts.addr, pxTestApp, secret, method, path, q, body)
}

func TestPusherPresenceMembersAreUsers(t *testing.T) {
	ts := startPusher(t)
	bob := ts.pxDial(t, "bob")
	bob.SubscribePresence("eng", "bob", `{"name":"Bob"}`)
	if m := bob.Members("presence-eng"); len(m) != 1 || string(m["bob"]) != `{"name":"Bob"}` {
		t.Fatalf("bob's list: %v", m)
	}
	alice1 := ts.pxDial(t, "alice1")
	alice1.SubscribePresence("eng", "alice", `{"name":"Alice"}`)
	if m := alice1.Members("presence-eng"); len(m) != 2 || string(m["bob"]) != `{"name":"Bob"}` {
		t.Fatalf("alice's list: %v", m)
	}
	if u, info := bob.MemberEvent("pusher_internal:member_added", 5*time.Second); u != "alice" || info != `{"name":"Alice"}` {
		t.Fatalf("member_added %s %s", u, info)
	}
	// A second tab of alice is no news; closing one of two neither.
	alice2 := ts.pxDial(t, "alice2")
	alice2.SubscribePresence("eng", "alice", `{"name":"Alice"}`)
	alice2.Members("presence-eng")
	alice1.Close()
	bob.Quiet(testGrace + 300*time.Millisecond)
	// A reload within the grace: close and come back.
	alice2.Close()
	alice3 := ts.pxDial(t, "alice3")
	alice3.SubscribePresence("eng", "alice", `{"name":"Alice"}`)
	alice3.Members("presence-eng")
	bob.Quiet(testGrace + 300*time.Millisecond)
	alice3.Close()
	if u, _ := bob.MemberEvent("pusher_internal:member_removed", 5*time.Second); u != "alice" {
		t.Fatalf("member_removed of %s", u)
	}
}

func TestPusherAndNativeClientsSeeEachOther(t *testing.T) {
	ts := startPusher(t)
	ts.join("eng", "carol")
	carol := ts.dial(t, "carol")
	bob := ts.pxDial(t, "bob")
	bob.SubscribePresence("eng", "bob", `{}`)
	if m := bob.Members("presence-eng"); len(m) != 2 || string(m["carol"]) != "{}" {
		t.Fatalf("bob's list: %v", m)
	}
	carol.expectChanges(5*time.Second, "bob=online")
	carol.close()
	if u, _ := bob.MemberEvent("pusher_internal:member_removed", 5*time.Second); u != "carol" {
		t.Fatalf("member_removed of %s", u)
	}
	dave := ts.dial(t, "dave")
	ts.join("eng", "dave")
	if u, _ := bob.MemberEvent("pusher_internal:member_added", 5*time.Second); u != "dave" {
		t.Fatalf("member_added of %s", u)
	}
	dave.expectChanges(5*time.Second, "bob=online")
	bob.Close()
	dave.expectChanges(5*time.Second, "bob=offline")
}

func TestPusherRefusesBadAuth(t *testing.T) {
	ts := startPusher(t)
	c := ts.pxDial(t, "eve")
	cd := `{"user_id":"eve"}`
	c.Send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": "presence-eng",
		"auth": pxKey + ":" + pusher.SignChannel("wrong", c.SocketID, "presence-eng", cd), "channel_data": cd}})
	f := c.Next("pusher:subscription_error")
	if f["channel"] != "presence-eng" {
		t.Fatalf("error frame %v", f)
	}
	c.Send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": "private-x", "auth": pxKey + ":00"}})
	c.Next("pusher:subscription_error")
	c.Send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": "bad name!"}})
	c.Next("pusher:subscription_error")
	// One user per socket.
	c.SubscribePresence("eng", "eve", "{}")
	c.Members("presence-eng")
	c.SubscribePresence("ops", "mallory", "{}")
	c.Next("pusher:subscription_error")
	if p := ts.presenceOf("mallory"); p["state"] != "offline" {
		t.Fatalf("mallory: %v", p)
	}
}

func TestPusherWrongKey(t *testing.T) {
	ts := startPusher(t)
	c := pushertest.DialKey(t, ts.addr, pxTestApp, "nope", "nope", 0)
	f := c.Next("pusher:error")
	if d, _ := f["data"].(map[string]any); d["code"] != float64(pusher.CodeAppNotFound) {
		t.Fatalf("error %v", f)
	}
}

func TestPusherPingPong(t *testing.T) {
	ts := startPusher(t)
	c := ts.pxDial(t, "p")
	c.Send(map[string]any{"event": "pusher:ping", "data": map[string]any{}})
	c.Next("pusher:pong")
}

// pings sends a ping on s every interval and reads its pong, until stop is
// closed; other frames go to other. It runs on a goroutine of its own, so
// it reports failures with t.Errorf and returns.
func pings(t *testing.T, s *pushertest.Socket, interval time.Duration, stop <-chan struct{}, other chan<- map[string]any) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		if err := s.Write(map[string]any{"event": "pusher:ping", "data": map[string]any{}}); err != nil {
			t.Errorf("ping: %v", err)
			return
		}
		for pong := false; !pong; {
			select {
			case f, ok := <-s.Frames:
				if !ok {
					t.Errorf("%s: closed while pinging", s.Name)
					return
				}
				if pong = f["event"] == "pusher:pong"; !pong {
					select {
					case other <- f:
					case <-stop:
						return
					}
				}
			case <-time.After(5 * time.Second):
				t.Errorf("%s: no pong within 5s", s.Name)
				return
			}
		}
	}
}

// A member whose socket only pings stays present past many ttls (the ping
// is its sign of life, whichever goroutine answers it); once the pings
// stop, it leaves after the ttl and the grace. No WebSocket pings from the
// server: their pongs would keep it alive too.
func TestPusherPingsKeepAMemberPresent(t *testing.T) {
	ts := startPusher(t, func(c *server.Config) { c.PingInterval = -1 })
	bob, ann := ts.pxPair(t, "bob", "ann")

	heard := make(chan map[string]any, 16)
	stopBob, stopAnn := make(chan struct{}), make(chan struct{})
	stopBobOnce := sync.OnceFunc(func() { close(stopBob) })
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); pings(t, bob, testHeartbeat, stopBob, make(chan map[string]any, 16)) }()
	go func() { defer wg.Done(); pings(t, ann, testHeartbeat, stopAnn, heard) }()
	defer func() {
		stopBobOnce()
		close(stopAnn)
		wg.Wait()
	}()
	select {
	case f := <-heard:
		t.Fatalf("ann heard %v while bob pinged", f)
	case <-time.After(3 * testTTL):
	}
	stopBobOnce()
	select {
	case f := <-heard:
		if f["event"] != "pusher_internal:member_removed" {
			t.Fatalf("ann heard %v, want bob's member_removed", f)
		}
	case <-time.After(testTTL + testGrace + 5*time.Second):
		t.Fatal("bob never left once his pings stopped")
	}
}

// A flood of pings meets the frame rate limit like any other frame.
func TestPusherPingFloodIsLimited(t *testing.T) {
	ts := startPusher(t, func(c *server.Config) { c.RateLimit, c.RateBurst = 5, 5 })
	c := ts.pxDial(t, "p")
	for range 12 {
		c.Send(map[string]any{"event": "pusher:ping", "data": map[string]any{}})
	}
	for pongs := 0; ; {
		select {
		case f, ok := <-c.Frames:
			if !ok {
				t.Fatalf("closed after %d pongs, before a rate-limit error", pongs)
			}
			switch f["event"] {
			case "pusher:pong":
				if pongs++; pongs > 6 {
					t.Fatalf("%d pongs to 12 pings with a burst of 5", pongs)
				}
				continue
			case "pusher:error":
				if d, _ := f["data"].(map[string]any); !strings.Contains(fmt.Sprint(d["message"]), "too many frames") {
					t.Fatalf("error %v, want too many frames", f)
				}
				return
			}
			t.Fatalf("got %v", f)
		case <-time.After(5 * time.Second):
			t.Fatalf("no rate-limit error after %d pongs", pongs)
		}
	}
}

func TestPusherRESTTriggerAndChannels(t *testing.T) {
	ts := startPusher(t)
	a := ts.pxDial(t, "a")
	a.Send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": "news"}})
	a.Next("pusher_internal:subscription_succeeded")
	b := ts.pxDial(t, "b")
	b.Send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": "news"}})
	b.Next("pusher_internal:subscription_succeeded")

	body := fmt.Sprintf(`{"name":"flash","channels":["news"],"data":"{\"x\":1}","socket_id":%q}`, b.SocketID)
	if code, out := ts.signedRequest(t, pxSecret, "POST", "/apps/"+pxApp+"/events", nil, body); code != 200 {
		t.Fatalf("trigger: %d %s", code, out)
	}
	f := a.Next("flash")
	if f["channel"] != "news" || f["data"] != `{"x":1}` {
		t.Fatalf("event %v", f)
	}
	b.Quiet(200 * time.Millisecond) // excluded by socket_id
	if code, _ := ts.signedRequest(t, "wrong", "POST", "/apps/"+pxApp+"/events", nil, body); code != 401 {
		t.Fatalf("wrong secret: %d", code)
	}
	big := fmt.Sprintf(`{"name":"x","channel":"news","data":%q}`, strings.Repeat("a", 10<<10+1))
	if code, _ := ts.signedRequest(t, pxSecret, "POST", "/apps/"+pxApp+"/events", nil, big); code != 413 {
		t.Fatalf("big event: %d", code)
	}
	code, out := ts.signedRequest(t, pxSecret, "GET", "/apps/"+pxApp+"/channels", nil, "")
	if code != 200 || !strings.Contains(out, `"news":{}`) {
		t.Fatalf("channels: %d %s", code, out)
	}
	a.SubscribePresence("eng", "ann", "{}")
	a.Members("presence-eng")
	code, out = ts.signedRequest(t, pxSecret, "GET", "/apps/"+pxApp+"/channels/presence-eng", url.Values{"info": {"user_count,subscription_count"}}, "")
	if code != 200 || out != `{"occupied":true,"subscription_count":1,"user_count":1}`+"\n" {
		t.Fatalf("channel: %d %q", code, out)
	}
	code, out = ts.signedRequest(t, pxSecret, "GET", "/apps/"+pxApp+"/channels/presence-eng/users", nil, "")
	if code != 200 || out != `{"users":[{"id":"ann"}]}`+"\n" {
		t.Fatalf("users: %d %q", code, out)
	}
}

func TestPusherClientEvents(t *testing.T) {
	ts := startPusher(t)
	a, b := ts.pxPair(t, "ann", "ben")
	a.Send(map[string]any{"event": "client-typing", "channel": "presence-eng", "data": map[string]any{"on": true}})
	f := b.Next("client-typing")
	if f["user_id"] != "ann" {
		t.Fatalf("client event %v", f)
	}
	a.Quiet(100 * time.Millisecond) // not echoed
	// Past 10 a second: 4301, and the socket stays.
	for i := 0; i < 12; i++ {
		a.Send(map[string]any{"event": "client-typing", "channel": "presence-eng", "data": map[string]any{}})
	}
	limited := false
	for i := 0; i < 12 && !limited; i++ {
		select {
		case f := <-a.Frames:
			d, _ := f["data"].(map[string]any)
			limited = f["event"] == "pusher:error" && d["code"] == float64(pusher.CodeClientEventRateLimit)
		case <-time.After(2 * time.Second):
			t.Fatal("no 4301")
		}
	}
	if !limited {
		t.Fatal("no 4301")
	}
	a.Send(map[string]any{"event": "pusher:ping", "data": map[string]any{}})
	a.Until("pusher:pong")
}

// Pusher's REST requests are signed, not keyed: --api-key does not refuse
// their bodies.
func TestPusherRESTBesideAPIKey(t *testing.T) {
	ts := startPusher(t, func(c *server.Config) { c.APIKey = "api-secret" })
	a := ts.pxDial(t, "a")
	a.Send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": "news"}})
	a.Next("pusher_internal:subscription_succeeded")
	if code, out := ts.signedRequest(t, pxSecret, "POST", "/apps/"+pxApp+"/events", nil, `{"name":"e","channel":"news","data":"1"}`); code != 200 {
		t.Fatalf("trigger: %d %s", code, out)
	}
	a.Next("e")
	if code, _ := ts.do("PUT", "/v1/teams/t/members/u", "x"); code != 401 {
		t.Fatalf("native API without key: %d", code)
	}
}

func TestPusherTerminateConnections(t *testing.T) {
	ts := startPusher(t)
	a, b := ts.pxPair(t, "ann", "ben")
	if code, out := ts.signedRequest(t, pxSecret, "POST", "/apps/"+pxApp+"/users/ben/terminate_connections", nil, "{}"); code != 200 {
		t.Fatalf("terminate: %d %s", code, out)
	}
	f := b.Next("pusher:error")
	if d, _ := f["data"].(map[string]any); d["code"] != float64(pusher.CodeUnauthorized) {
		t.Fatalf("error %v", f)
	}
	if u, _ := a.MemberEvent("pusher_internal:member_removed", 5*time.Second); u != "ben" {
		t.Fatalf("member_removed of %s", u)
	}
}

// A draining node asks Pusher sockets to reconnect with 4200, Pusher's
// "reconnect at once", never the native 1012.
func TestPusherDrainSays4200(t *testing.T) {
	ts := startPusher(t)
	a := ts.pxDial(t, "a")
	a.SubscribePresence("eng", "ann", "{}")
	a.Members("presence-eng")
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = ts.srv.Shutdown(ctx)
	}()
	f := a.Next("pusher:error")
	if d, _ := f["data"].(map[string]any); d["code"] != float64(pusher.CodeReconnect) {
		t.Fatalf("drain frame %v", f)
	}
	<-done
}

// A socket's channels are bounded before any auth: the one past the limit
// is refused on its channel, and the socket stays.
func TestPusherChannelsPerSocketBounded(t *testing.T) {
	ts := startPusher(t, func(c *server.Config) { c.RateBurst = 200 }) // the frame limit is not under test
	a := ts.pxDial(t, "a")
	for i := range 100 {
		a.Send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": fmt.Sprintf("c%d", i)}})
		a.Next("pusher_internal:subscription_succeeded")
	}
	a.Send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": "one-more"}})
	f := a.Next("pusher:subscription_error")
	if d, _ := f["data"].(map[string]any); f["channel"] != "one-more" || d["type"] != "LimitReached" {
		t.Fatalf("error %v", f)
	}
	a.Send(map[string]any{"event": "pusher:ping", "data": map[string]any{}})
	a.Next("pusher:pong")
}

// A Pusher socket with only public channels has shown no secret: it counts
// against --max-unauthenticated-per-ip until a signed subscription.
func TestPusherSocketIsUnauthenticatedUntilSigned(t *testing.T) {
	ts := startPusher(t, func(c *server.Config) {
		c.MaxUnauthenticatedPerIP = 2
		c.HandshakeTimeout = time.Minute
	})
	a := ts.pxDial(t, "a")
	a.Send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": "news"}})
	a.Next("pusher_internal:subscription_succeeded")
	b := ts.pxDial(t, "b")
	if ok, got := refusedAtAccept(t, dialTCP(t, ts.addr)); !ok {
		t.Fatalf("a 3rd socket beside two anonymous Pusher sockets: %s, want 429", got)
	}
	b.SubscribePresence("eng", "ben", "{}")
	b.Members("presence-eng")
	testwait.For(t, 5*time.Second, func() error {
		c := dialTCP(t, ts.addr)
		defer c.Close()
		if ok, got := refusedAtAccept(t, c); ok {
			return errors.New("still refused: " + got)
		}
		return nil
	})
}

// A socket's channels: a second subscribe of one is no new channel, the
// 101st is refused, and one left from the middle makes room for another;
// REST and events see what the socket holds.
func TestPusherSocketChannelList(t *testing.T) {
	ts := startPusher(t, func(c *server.Config) { c.RateBurst = 200 })
	a := ts.pxDial(t, "a")
	sub := func(ch string) map[string]any {
		a.Send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": ch}})
		select {
		case f := <-a.Frames:
			return f
		case <-time.After(10 * time.Second):
			t.Fatalf("no answer to subscribing %s", ch)
			return nil
		}
	}
	for i := range 100 {
		if f := sub(fmt.Sprintf("c%d", i)); f["event"] != "pusher_internal:subscription_succeeded" {
			t.Fatalf("channel %d: %v", i, f)
		}
	}
	if f := sub("c7"); f["event"] != "pusher_internal:subscription_succeeded" {
		t.Fatalf("a channel held already: %v", f)
	}
	if f := sub("c100"); f["event"] != "pusher:subscription_error" || f["channel"] != "c100" {
		t.Fatalf("the 101st channel: %v", f)
	}
	a.Send(map[string]any{"event": "pusher:unsubscribe", "data": map[string]string{"channel": "c7"}})
	if f := sub("c100"); f["event"] != "pusher_internal:subscription_succeeded" {
		t.Fatalf("c100 after leaving c7: %v", f)
	}
	if f := sub("c101"); f["event"] != "pusher:subscription_error" {
		t.Fatalf("the 101st channel again: %v", f)
	}
	// The socket's own list, not only the node's counts: c7 is gone from
	// it (a full list refuses it), c99 is still in it (a repeat).
	if f := sub("c7"); f["event"] != "pusher:subscription_error" {
		t.Fatalf("c7 after leaving it, with the list full again: %v", f)
	}
	if f := sub("c99"); f["event"] != "pusher_internal:subscription_succeeded" {
		t.Fatalf("c99, held all along: %v", f)
	}
	code, out := ts.signedRequest(t, pxSecret, "GET", "/apps/"+pxApp+"/channels", nil, "")
	if code != 200 || strings.Contains(out, `"c7"`) || !strings.Contains(out, `"c100":{}`) || !strings.Contains(out, `"c99":{}`) {
		t.Fatalf("channels: %d %s", code, out)
	}
	for _, ch := range []string{"c7", "c100"} {
		body := fmt.Sprintf(`{"name":"e","channel":%q,"data":"{}"}`, ch)
		if code, out := ts.signedRequest(t, pxSecret, "POST", "/apps/"+pxApp+"/events", nil, body); code != 200 {
			t.Fatalf("trigger %s: %d %s", ch, code, out)
		}
	}
	if f := a.Next("e"); f["channel"] != "c100" {
		t.Fatalf("event %v: only c100's reaches the socket", f)
	}
	a.Quiet(200 * time.Millisecond)
	// Closing releases every channel the list holds.
	a.Close()
	testwait.For(t, 5*time.Second, func() error {
		code, out := ts.signedRequest(t, pxSecret, "GET", "/apps/"+pxApp+"/channels", nil, "")
		if code != 200 || out != `{"channels":{}}`+"\n" {
			return fmt.Errorf("channels after the close: %d %s", code, out)
		}
		return nil
	})
}

// A wall clock stepped back refills no client-event tokens, and takes none:
// a second later on the new clock, a second's worth is back.
func TestPusherClientEventsAfterTheClockStepsBack(t *testing.T) {
	var offset atomic.Int64
	ts := startPusher(t, func(c *server.Config) {
		c.Now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	})
	a, b := ts.pxPair(t, "ann", "ben")
	typing := map[string]any{"event": "client-typing", "channel": "presence-eng", "data": map[string]any{}}
	for range 10 { // the whole burst
		a.Send(typing)
		b.Next("client-typing")
	}
	offset.Store(int64(-10 * time.Second))
	a.Send(typing)
	f := a.Next("pusher:error")
	if d, _ := f["data"].(map[string]any); d["code"] != float64(pusher.CodeClientEventRateLimit) {
		t.Fatalf("the burst spent, then the clock 10 s back: %v, want 4301", f)
	}
	offset.Store(int64(-9 * time.Second))
	a.Send(typing)
	b.Next("client-typing")
	a.Quiet(200 * time.Millisecond)
}
