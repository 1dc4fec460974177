package e2e

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

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/pusher"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

const (
	pxApp    = "77"
	pxKey    = "e2e-key"
	pxSecret = "e2e-secret"
)

var pxFlags = []string{"--pusher-app-id", pxApp, "--pusher-key", pxKey, "--pusher-secret", pxSecret, "--pusher-client-events"}

// pxSocket is a Pusher protocol 7 socket, as pusher-js speaks it.
type pxSocket struct {
	t        *testing.T
	name     string
	conn     *websocket.Conn
	frames   chan map[string]any
	done     chan struct{}
	cancel   context.CancelFunc
	socketID string
}

func pxDial(t *testing.T, n *node, name string) *pxSocket {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	defer dcancel()
	conn, _, err := websocket.Dial(dctx, "ws://"+n.addr+"/app/"+pxKey+"?protocol=7", nil)
	if err != nil {
		cancel()
		t.Fatalf("%s: dial %s: %v", name, n.name, err)
	}
	s := &pxSocket{t: t, name: name, conn: conn, frames: make(chan map[string]any, 256), done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(s.done)
		defer close(s.frames)
		for {
			_, data, err := conn.Read(ctx)
			if err != nil {
				return
			}
			var f map[string]any
			if json.Unmarshal(data, &f) == nil && f["event"] != "pusher:pong" {
				s.frames <- f
			}
		}
	}()
	// pusher-js pings after activity_timeout of silence; so does this.
	go func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = conn.Write(ctx, websocket.MessageText, []byte(`{"event":"pusher:ping","data":{}}`))
			}
		}
	}()
	t.Cleanup(s.close)
	var d struct {
		SocketID string `json:"socket_id"`
	}
	s.data(s.next("pusher:connection_established"), &d)
	s.socketID = d.SocketID
	return s
}

func (s *pxSocket) close() {
	s.cancel()
	_ = s.conn.CloseNow()
	<-s.done
}

func (s *pxSocket) send(v any) {
	s.t.Helper()
	b, _ := json.Marshal(v)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.conn.Write(ctx, websocket.MessageText, b); err != nil {
		s.t.Fatalf("%s: write: %v", s.name, err)
	}
}

func (s *pxSocket) nextWithin(d time.Duration, event string) map[string]any {
	s.t.Helper()
	select {
	case f, ok := <-s.frames:
		if !ok {
			s.t.Fatalf("%s: closed while waiting for %s", s.name, event)
		}
		if f["event"] != event {
			s.t.Fatalf("%s: got %v, want %s", s.name, f, event)
		}
		return f
	case <-time.After(d):
		s.t.Fatalf("%s: no %s within %v", s.name, event, d)
	}
	return nil
}

func (s *pxSocket) next(event string) map[string]any { return s.nextWithin(10*time.Second, event) }

func (s *pxSocket) quiet(d time.Duration) {
	s.t.Helper()
	select {
	case f, ok := <-s.frames:
		if ok {
			s.t.Fatalf("%s: unexpected %v", s.name, f)
		}
	case <-time.After(d):
	}
}

func (s *pxSocket) data(f map[string]any, v any) {
	s.t.Helper()
	str, _ := f["data"].(string)
	if err := json.Unmarshal([]byte(str), v); err != nil {
		s.t.Fatalf("%s: data of %v: %v", s.name, f, err)
	}
}

func (s *pxSocket) join(team, user string) map[string]json.RawMessage {
	s.t.Helper()
	ch := "presence-" + team
	cd := fmt.Sprintf(`{"user_id":%q,"user_info":{"name":%q}}`, user, strings.ToUpper(user))
	s.send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": ch,
		"auth": pxKey + ":" + pusher.SignChannel(pxSecret, s.socketID, ch, cd), "channel_data": cd}})
	var d struct {
		Presence struct {
			Hash map[string]json.RawMessage `json:"hash"`
		} `json:"presence"`
	}
	s.data(s.next("pusher_internal:subscription_succeeded"), &d)
	return d.Presence.Hash
}

func (s *pxSocket) member(event string, within time.Duration) (string, string) {
	s.t.Helper()
	var d struct {
		UserID   string          `json:"user_id"`
		UserInfo json.RawMessage `json:"user_info"`
	}
	s.data(s.nextWithin(within, event), &d)
	return d.UserID, string(d.UserInfo)
}

func pxREST(t *testing.T, n *node, method, path string, q url.Values, body string) (int, string) {
	t.Helper()
	if q == nil {
		q = url.Values{}
	}
	q = pusher.SignRequest(pxKey, pxSecret, method, path, q, []byte(body), time.Now())
	req, _ := http.NewRequest(method, "http://"+n.addr+path+"?"+q.Encode(), strings.NewReader(body))
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

// Pusher clients on two nodes share presence channels, channel events and
// the REST API's view; a node killed with -9 leaves no ghost.
func TestPusherAcrossNodes(t *testing.T) {
	t.Run("redis", func(t *testing.T) { testPusherAcrossNodes(t, redistest.Start(t).URL()) })
	t.Run("cluster", func(t *testing.T) { testPusherAcrossNodes(t, redistest.StartCluster(t, 3).URL()) })
}

func testPusherAcrossNodes(t *testing.T, redisURL string) {
	tm := timing{ttl: 2 * time.Second, heartbeat: 500 * time.Millisecond, grace: 1 * time.Second}
	n1 := startNode(t, redisURL, "px1", tm, pxFlags...)
	n2 := startNode(t, redisURL, "px2", tm, pxFlags...)

	bob := pxDial(t, n1, "bob")
	if m := bob.join("eng", "bob"); len(m) != 1 {
		t.Fatalf("bob's list: %v", m)
	}
	alice := pxDial(t, n2, "alice")
	if m := alice.join("eng", "alice"); len(m) != 2 || string(m["bob"]) != `{"name":"BOB"}` {
		t.Fatalf("alice's list: %v", m)
	}
	if u, info := bob.member("pusher_internal:member_added", 10*time.Second); u != "alice" || info != `{"name":"ALICE"}` {
		t.Fatalf("bob got member_added %s %s", u, info)
	}
	// A second device of alice on the other node: no news.
	alice2 := pxDial(t, n1, "alice2")
	alice2.join("eng", "alice")
	bob.quiet(tm.grace + 500*time.Millisecond)

	// A REST trigger on one node reaches the other's subscribers.
	bob.send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": "news"}})
	bob.next("pusher_internal:subscription_succeeded")
	if code, out := pxREST(t, n2, "POST", "/apps/"+pxApp+"/events", nil, `{"name":"flash","channels":["news","presence-eng"],"data":"hi"}`); code != 200 {
		t.Fatalf("trigger: %d %s", code, out)
	}
	got := map[string]bool{}
	for range 2 {
		f := bob.next("flash")
		got[fmt.Sprint(f["channel"])] = f["data"] == "hi"
	}
	if !got["news"] || !got["presence-eng"] {
		t.Fatalf("bob got %v", got)
	}
	alice.next("flash") // presence-eng only
	alice2.next("flash")
	// A client event crosses nodes too.
	alice.send(map[string]any{"event": "client-wave", "channel": "presence-eng", "data": map[string]any{"x": 1}})
	if f := bob.next("client-wave"); f["user_id"] != "alice" {
		t.Fatalf("client event %v", f)
	}
	alice2.next("client-wave")

	// The REST API sees the whole cluster.
	testwait.For(t, 10*time.Second, func() error {
		code, out := pxREST(t, n1, "GET", "/apps/"+pxApp+"/channels/presence-eng", url.Values{"info": {"user_count,subscription_count"}}, "")
		if want := `{"occupied":true,"subscription_count":3,"user_count":2}` + "\n"; code != 200 || out != want {
			return fmt.Errorf("got %d %q, want %q", code, out, want)
		}
		return nil
	})
	if code, out := pxREST(t, n1, "GET", "/apps/"+pxApp+"/channels/presence-eng/users", nil, ""); code != 200 || out != `{"users":[{"id":"alice"},{"id":"bob"}]}`+"\n" {
		t.Fatalf("users: %d %s", code, out)
	}

	// kill -9 of the node with bob's only socket: alice hears one
	// member_removed, after the ttl and the grace, and no ghost stays.
	testwait.For(t, 10*time.Second, func() error {
		code, out := pxREST(t, n2, "GET", "/apps/"+pxApp+"/channels", nil, "")
		if code != 200 || !strings.Contains(out, `"news":{}`) {
			return fmt.Errorf("channels: %d %s", code, out)
		}
		return nil
	})
	n1.kill()
	if u, _ := alice.member("pusher_internal:member_removed", tm.ttl+tm.grace+10*time.Second); u != "bob" {
		t.Fatalf("member_removed of %s", u)
	}
	alice.quiet(tm.grace + time.Second)
	testwait.For(t, 25*time.Second, func() error {
		code, out := pxREST(t, n2, "GET", "/apps/"+pxApp+"/channels", nil, "")
		if code != 200 || strings.Contains(out, `"news"`) {
			return fmt.Errorf("%d %s", code, out)
		}
		return nil
	})
}
