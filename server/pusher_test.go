package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

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

// pxClient is a Pusher protocol 7 socket, as pusher-js speaks it.
type pxClient struct {
	t        *testing.T
	name     string
	conn     *websocket.Conn
	frames   chan map[string]any
	done     chan struct{}
	cancel   context.CancelFunc
	socketID string
}

func (ts *testServer) pxDialKey(t *testing.T, key string) *pxClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	defer dcancel()
	conn, _, err := websocket.Dial(dctx, "ws://"+ts.addr+"/app/"+key+"?protocol=7&client=js&version=8.4.0", nil)
	if err != nil {
		cancel()
		t.Fatalf("dial /app/%s: %v", key, err)
	}
	c := &pxClient{t: t, name: "px", conn: conn, frames: make(chan map[string]any, 256), done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(c.done)
		defer close(c.frames)
		for {
			_, data, err := conn.Read(ctx)
			if err != nil {
				return
			}
			var f map[string]any
			if err := json.Unmarshal(data, &f); err != nil {
				t.Errorf("frame is not JSON: %q", data)
				continue
			}
			c.frames <- f
		}
	}()
	t.Cleanup(c.close)
	return c
}

func (ts *testServer) pxDial(t *testing.T, name string) *pxClient {
	t.Helper()
	c := ts.pxDialKey(t, pxKey)
	c.name = name
	f := c.next("pusher:connection_established")
	var d struct {
		SocketID        string `json:"socket_id"`
		ActivityTimeout int    `json:"activity_timeout"`
	}
	decodeData(t, f, &d)
	if !pusher.ValidSocketID(d.SocketID) || d.ActivityTimeout < 1 {
		t.Fatalf("connection_established data %+v", d)
	}
	c.socketID = d.SocketID
	return c
}

func (c *pxClient) close() {
	c.cancel()
	_ = c.conn.CloseNow()
	<-c.done
}

func (c *pxClient) send(v any) {
	c.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.conn.Write(ctx, websocket.MessageText, b); err != nil {
		c.t.Fatalf("%s: write: %v", c.name, err)
	}
}

// next returns the next frame, which must be event.
func (c *pxClient) next(event string) map[string]any {
	c.t.Helper()
	select {
	case f, ok := <-c.frames:
		if !ok {
			c.t.Fatalf("%s: closed while waiting for %s", c.name, event)
		}
		if f["event"] != event {
			c.t.Fatalf("%s: got %v, want %s", c.name, f, event)
		}
		return f
	case <-time.After(5 * time.Second):
		c.t.Fatalf("%s: no %s within 5s", c.name, event)
	}
	return nil
}

// quiet asserts that no frame comes for d.
func (c *pxClient) quiet(d time.Duration) {
	c.t.Helper()
	select {
	case f, ok := <-c.frames:
		if ok {
			c.t.Fatalf("%s: unexpected %v", c.name, f)
		}
	case <-time.After(d):
	}
}

func decodeData(t *testing.T, f map[string]any, v any) {
	t.Helper()
	s, ok := f["data"].(string)
	if !ok {
		t.Fatalf("data of %v is not a JSON string", f)
	}
	if err := json.Unmarshal([]byte(s), v); err != nil {
		t.Fatalf("data of %v: %v", f, err)
	}
}

func (c *pxClient) subscribePresence(team, user, info string) {
	c.t.Helper()
	ch := "presence-" + team
	cd := fmt.Sprintf(`{"user_id":%q,"user_info":%s}`, user, info)
	auth := pxKey + ":" + pusher.SignChannel(pxSecret, c.socketID, ch, cd)
	c.send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": ch, "auth": auth, "channel_data": cd}})
}

// members reads subscription_succeeded and returns its member ids.
func (c *pxClient) members(ch string) map[string]json.RawMessage {
	c.t.Helper()
	f := c.next("pusher_internal:subscription_succeeded")
	if f["channel"] != ch {
		c.t.Fatalf("%s: subscription_succeeded for %v, want %s", c.name, f["channel"], ch)
	}
	var d struct {
		Presence struct {
			IDs   []string                   `json:"ids"`
			Hash  map[string]json.RawMessage `json:"hash"`
			Count int                        `json:"count"`
		} `json:"presence"`
	}
	decodeData(c.t, f, &d)
	if d.Presence.Count != len(d.Presence.IDs) || len(d.Presence.Hash) != len(d.Presence.IDs) {
		c.t.Fatalf("%s: inconsistent presence data %+v", c.name, d)
	}
	return d.Presence.Hash
}

func (c *pxClient) memberEvent(event string) (string, string) {
	c.t.Helper()
	f := c.next(event)
	var d struct {
		UserID   string          `json:"user_id"`
		UserInfo json.RawMessage `json:"user_info"`
	}
	decodeData(c.t, f, &d)
	return d.UserID, string(d.UserInfo)
}

func TestPusherPresenceMembersAreUsers(t *testing.T) {
	ts := startPusher(t)
	bob := ts.pxDial(t, "bob")
	bob.subscribePresence("eng", "bob", `{"name":"Bob"}`)
	if m := bob.members("presence-eng"); len(m) != 1 || string(m["bob"]) != `{"name":"Bob"}` {
		t.Fatalf("bob's list: %v", m)
	}
	alice1 := ts.pxDial(t, "alice1")
	alice1.subscribePresence("eng", "alice", `{"name":"Alice"}`)
	if m := alice1.members("presence-eng"); len(m) != 2 || string(m["bob"]) != `{"name":"Bob"}` {
		t.Fatalf("alice's list: %v", m)
	}
	if u, info := bob.memberEvent("pusher_internal:member_added"); u != "alice" || info != `{"name":"Alice"}` {
		t.Fatalf("member_added %s %s", u, info)
	}
	// A second tab of alice is no news; closing one of two neither.
	alice2 := ts.pxDial(t, "alice2")
	alice2.subscribePresence("eng", "alice", `{"name":"Alice"}`)
	alice2.members("presence-eng")
	alice1.close()
	bob.quiet(testGrace + 300*time.Millisecond)
	// A reload within the grace: close and come back.
	alice2.close()
	alice3 := ts.pxDial(t, "alice3")
	alice3.subscribePresence("eng", "alice", `{"name":"Alice"}`)
	alice3.members("presence-eng")
	bob.quiet(testGrace + 300*time.Millisecond)
	alice3.close()
	if u, _ := bob.memberEvent("pusher_internal:member_removed"); u != "alice" {
		t.Fatalf("member_removed of %s", u)
	}
}

func TestPusherAndNativeClientsSeeEachOther(t *testing.T) {
	ts := startPusher(t)
	ts.join("eng", "carol")
	carol := ts.dial(t, "carol")
	bob := ts.pxDial(t, "bob")
	bob.subscribePresence("eng", "bob", `{}`)
	if m := bob.members("presence-eng"); len(m) != 2 || string(m["carol"]) != "{}" {
		t.Fatalf("bob's list: %v", m)
	}
	carol.expectChanges(5*time.Second, "bob=online")
	carol.close()
	if u, _ := bob.memberEvent("pusher_internal:member_removed"); u != "carol" {
		t.Fatalf("member_removed of %s", u)
	}
	dave := ts.dial(t, "dave")
	ts.join("eng", "dave")
	if u, _ := bob.memberEvent("pusher_internal:member_added"); u != "dave" {
		t.Fatalf("member_added of %s", u)
	}
	dave.expectChanges(5*time.Second, "bob=online")
	bob.close()
	dave.expectChanges(5*time.Second, "bob=offline")
}

func TestPusherRefusesBadAuth(t *testing.T) {
	ts := startPusher(t)
	c := ts.pxDial(t, "eve")
	cd := `{"user_id":"eve"}`
	c.send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": "presence-eng",
		"auth": pxKey + ":" + pusher.SignChannel("wrong", c.socketID, "presence-eng", cd), "channel_data": cd}})
	f := c.next("pusher:subscription_error")
	if f["channel"] != "presence-eng" {
		t.Fatalf("error frame %v", f)
	}
	c.send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": "private-x", "auth": pxKey + ":00"}})
	c.next("pusher:subscription_error")
	c.send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": "bad name!"}})
	c.next("pusher:subscription_error")
	// One user per socket.
	c.subscribePresence("eng", "eve", "{}")
	c.members("presence-eng")
	c.subscribePresence("ops", "mallory", "{}")
	c.next("pusher:subscription_error")
	if p := ts.presenceOf("mallory"); p["state"] != "offline" {
		t.Fatalf("mallory: %v", p)
	}
}

func TestPusherWrongKey(t *testing.T) {
	ts := startPusher(t)
	c := ts.pxDialKey(t, "nope")
	f := c.next("pusher:error")
	if d, _ := f["data"].(map[string]any); d["code"] != float64(pusher.CodeAppNotFound) {
		t.Fatalf("error %v", f)
	}
}

func TestPusherPingPong(t *testing.T) {
	ts := startPusher(t)
	c := ts.pxDial(t, "p")
	c.send(map[string]any{"event": "pusher:ping", "data": map[string]any{}})
	c.next("pusher:pong")
}

// signedRequest sends a REST request signed as the server SDKs sign it.
func (ts *testServer) signedRequest(t *testing.T, secret, method, path string, q url.Values, body string) (int, string) {
	t.Helper()
	if q == nil {
		q = url.Values{}
	}
	q = pusher.SignRequest(pxKey, secret, method, path, q, []byte(body), time.Now())
	req, err := http.NewRequest(method, ts.url(path)+"?"+q.Encode(), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

func TestPusherRESTTriggerAndChannels(t *testing.T) {
	ts := startPusher(t)
	a := ts.pxDial(t, "a")
	a.send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": "news"}})
	a.next("pusher_internal:subscription_succeeded")
	b := ts.pxDial(t, "b")
	b.send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": "news"}})
	b.next("pusher_internal:subscription_succeeded")

	body := fmt.Sprintf(`{"name":"flash","channels":["news"],"data":"{\"x\":1}","socket_id":%q}`, b.socketID)
	if code, out := ts.signedRequest(t, pxSecret, "POST", "/apps/"+pxApp+"/events", nil, body); code != 200 {
		t.Fatalf("trigger: %d %s", code, out)
	}
	f := a.next("flash")
	if f["channel"] != "news" || f["data"] != `{"x":1}` {
		t.Fatalf("event %v", f)
	}
	b.quiet(200 * time.Millisecond) // excluded by socket_id
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
	a.subscribePresence("eng", "ann", "{}")
	a.members("presence-eng")
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
	a := ts.pxDial(t, "a")
	a.subscribePresence("eng", "ann", "{}")
	a.members("presence-eng")
	b := ts.pxDial(t, "b")
	b.subscribePresence("eng", "ben", "{}")
	b.members("presence-eng")
	a.memberEvent("pusher_internal:member_added")
	a.send(map[string]any{"event": "client-typing", "channel": "presence-eng", "data": map[string]any{"on": true}})
	f := b.next("client-typing")
	if f["user_id"] != "ann" {
		t.Fatalf("client event %v", f)
	}
	a.quiet(100 * time.Millisecond) // not echoed
	// Past 10 a second: 4301, and the socket stays.
	for i := 0; i < 12; i++ {
		a.send(map[string]any{"event": "client-typing", "channel": "presence-eng", "data": map[string]any{}})
	}
	limited := false
	for i := 0; i < 12 && !limited; i++ {
		select {
		case f := <-a.frames:
			d, _ := f["data"].(map[string]any)
			limited = f["event"] == "pusher:error" && d["code"] == float64(pusher.CodeClientEventRateLimit)
		case <-time.After(2 * time.Second):
			t.Fatal("no 4301")
		}
	}
	if !limited {
		t.Fatal("no 4301")
	}
	a.send(map[string]any{"event": "pusher:ping", "data": map[string]any{}})
	a.until("pusher:pong")
}

// until skips frames up to the next event.
func (c *pxClient) until(event string) map[string]any {
	c.t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case f, ok := <-c.frames:
			if !ok {
				c.t.Fatalf("%s: closed while waiting for %s", c.name, event)
			}
			if f["event"] == event {
				return f
			}
		case <-deadline:
			c.t.Fatalf("%s: no %s within 5s", c.name, event)
		}
	}
}

func TestPusherSigninWatchlist(t *testing.T) {
	ts := startPusher(t)
	ts.join("eng", "ann", "ben", "cat")
	ben := ts.dial(t, "ben")
	_ = ben
	a := ts.pxDial(t, "a")
	ud := `{"id":"ann","watchlist":["ben","cat","zed"]}`
	a.send(map[string]any{"event": "pusher:signin", "data": map[string]string{"user_data": ud,
		"auth": pxKey + ":" + pusher.SignUser(pxSecret, a.socketID, ud)}})
	a.next("pusher:signin_success")
	f := a.next("pusher_internal:watchlist_events")
	var d struct {
		Events []struct {
			Name    string   `json:"name"`
			UserIDs []string `json:"user_ids"`
		} `json:"events"`
	}
	decodeData(t, f, &d)
	if len(d.Events) != 1 || d.Events[0].Name != "online" || len(d.Events[0].UserIDs) != 1 || d.Events[0].UserIDs[0] != "ben" {
		t.Fatalf("watchlist %+v", d)
	}
	cat := ts.dial(t, "cat")
	decodeData(t, a.next("pusher_internal:watchlist_events"), &d)
	if d.Events[0].Name != "online" || d.Events[0].UserIDs[0] != "cat" {
		t.Fatalf("watchlist %+v", d)
	}
	cat.close()
	decodeData(t, a.next("pusher_internal:watchlist_events"), &d)
	if d.Events[0].Name != "offline" || d.Events[0].UserIDs[0] != "cat" {
		t.Fatalf("watchlist %+v", d)
	}
	// Signed in, the socket is one of ann's devices.
	ben.expectChanges(5*time.Second, "ann=online", "cat=online", "cat=offline")
}

// Pusher's REST requests are signed, not keyed: --api-key does not refuse
// their bodies.
func TestPusherRESTBesideAPIKey(t *testing.T) {
	ts := startPusher(t, func(c *server.Config) { c.APIKey = "api-secret" })
	a := ts.pxDial(t, "a")
	a.send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": "news"}})
	a.next("pusher_internal:subscription_succeeded")
	if code, out := ts.signedRequest(t, pxSecret, "POST", "/apps/"+pxApp+"/events", nil, `{"name":"e","channel":"news","data":"1"}`); code != 200 {
		t.Fatalf("trigger: %d %s", code, out)
	}
	a.next("e")
	if code, _ := ts.do("PUT", "/v1/teams/t/members/u", "x"); code != 401 {
		t.Fatalf("native API without key: %d", code)
	}
}

func TestPusherTerminateConnections(t *testing.T) {
	ts := startPusher(t)
	a := ts.pxDial(t, "a")
	a.subscribePresence("eng", "ann", "{}")
	a.members("presence-eng")
	b := ts.pxDial(t, "b")
	b.subscribePresence("eng", "ben", "{}")
	b.members("presence-eng")
	a.memberEvent("pusher_internal:member_added")
	if code, out := ts.signedRequest(t, pxSecret, "POST", "/apps/"+pxApp+"/users/ben/terminate_connections", nil, "{}"); code != 200 {
		t.Fatalf("terminate: %d %s", code, out)
	}
	f := b.next("pusher:error")
	if d, _ := f["data"].(map[string]any); d["code"] != float64(pusher.CodeUnauthorized) {
		t.Fatalf("error %v", f)
	}
	if u, _ := a.memberEvent("pusher_internal:member_removed"); u != "ben" {
		t.Fatalf("member_removed of %s", u)
	}
}
