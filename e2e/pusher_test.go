package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/pushertest"
	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

const (
	pxApp    = "77"
	pxKey    = "e2e-key"
	pxSecret = "e2e-secret"
)

var pxFlags = []string{"--pusher-app-id", pxApp, "--pusher-key", pxKey, "--pusher-secret", pxSecret, "--pusher-client-events"}

var pxTestApp = pushertest.App{ID: pxApp, Key: pxKey, Secret: pxSecret}

// pxDial connects a Pusher socket that pings as pusher-js does when idle.
func pxDial(t *testing.T, n *node, name string) *pushertest.Socket {
	t.Helper()
	return pushertest.Dial(t, n.addr, pxTestApp, name, 500*time.Millisecond)
}

// pxJoin subscribes presence-{team} as user, with a user_info naming them.
func pxJoin(s *pushertest.Socket, team, user string) map[string]json.RawMessage {
	s.SubscribePresence(team, user, fmt.Sprintf(`{"name":%q}`, strings.ToUpper(user)))
	return s.Members("presence-" + team)
}

func pxREST(t *testing.T, n *node, method, path string, q url.Values, body string) (int, string) {
	t.Helper()
	return pushertest.REST(t, n.addr, pxTestApp, pxSecret, method, path, q, body)
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
	if m := pxJoin(bob, "eng", "bob"); len(m) != 1 {
		t.Fatalf("bob's list: %v", m)
	}
	alice := pxDial(t, n2, "alice")
	if m := pxJoin(alice, "eng", "alice"); len(m) != 2 || string(m["bob"]) != `{"name":"BOB"}` {
		t.Fatalf("alice's list: %v", m)
	}
	if u, info := bob.MemberEvent("pusher_internal:member_added", 10*time.Second); u != "alice" || info != `{"name":"ALICE"}` {
		t.Fatalf("bob got member_added %s %s", u, info)
	}
	// A second device of alice on the other node: no news.
	alice2 := pxDial(t, n1, "alice2")
	pxJoin(alice2, "eng", "alice")
	bob.Quiet(tm.grace + 500*time.Millisecond)

	// A REST trigger on one node reaches the other's subscribers.
	bob.Send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": "news"}})
	bob.Next("pusher_internal:subscription_succeeded")
	if code, out := pxREST(t, n2, "POST", "/apps/"+pxApp+"/events", nil, `{"name":"flash","channels":["news","presence-eng"],"data":"hi"}`); code != 200 {
		t.Fatalf("trigger: %d %s", code, out)
	}
	got := map[string]bool{}
	for range 2 {
		f := bob.Next("flash")
		got[fmt.Sprint(f["channel"])] = f["data"] == "hi"
	}
	if !got["news"] || !got["presence-eng"] {
		t.Fatalf("bob got %v", got)
	}
	alice.Next("flash") // presence-eng only
	alice2.Next("flash")
	// A client event crosses nodes too.
	alice.Send(map[string]any{"event": "client-wave", "channel": "presence-eng", "data": map[string]any{"x": 1}})
	if f := bob.Next("client-wave"); f["user_id"] != "alice" {
		t.Fatalf("client event %v", f)
	}
	alice2.Next("client-wave")

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
	if u, _ := alice.MemberEvent("pusher_internal:member_removed", tm.ttl+tm.grace+10*time.Second); u != "bob" {
		t.Fatalf("member_removed of %s", u)
	}
	alice.Quiet(tm.grace + time.Second)
	testwait.For(t, 25*time.Second, func() error {
		code, out := pxREST(t, n2, "GET", "/apps/"+pxApp+"/channels", nil, "")
		if code != 200 || strings.Contains(out, `"news"`) {
			return fmt.Errorf("%d %s", code, out)
		}
		return nil
	})
}
