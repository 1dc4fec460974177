package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/store/redisstore/redistest"
)

// The user-level status (DESIGN.md Part 1b, "Status") across two nodes on
// Redis, over real WebSockets, frame by frame.

// wsUser is a raw WebSocket client: every frame it receives, in order.
type wsUser struct {
	t      *testing.T
	name   string
	conn   *websocket.Conn
	frames chan map[string]any // closed when the reader stops
	cancel context.CancelFunc
	done   chan struct{}
	my     map[string]any // my_status right after welcome, if any
	snap   map[string]any
}

// dialWS connects user to n (dev mode), reads welcome, the my_status that
// may follow and the snapshot, and heartbeats until the test ends.
func dialWS(t *testing.T, n *node, user, device string) *wsUser {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	defer dcancel()
	q := url.Values{"user": {user}, "device": {device}}
	conn, _, err := websocket.Dial(dctx, n.ws()+"?"+q.Encode(), nil)
	if err != nil {
		cancel()
		t.Fatalf("dial %s on %s: %v", user, n.name, err)
	}
	conn.SetReadLimit(1 << 20)
	u := &wsUser{t: t, name: user + "/" + device + "@" + n.name, conn: conn, frames: make(chan map[string]any, 256),
		cancel: cancel, done: make(chan struct{})}
	go u.read(ctx)
	beats := make(chan struct{})
	go func() {
		defer close(beats)
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				// The socket's lifetime, not a deadline per write: the
				// library closes the connection when a write's context ends
				// mid-write, and on a loaded machine a heartbeat that waited
				// for the write lock past a 1 s deadline dropped a live
				// device, which its viewers then saw go offline.
				_ = conn.Write(ctx, websocket.MessageText, []byte(`{"type":"heartbeat"}`))
			}
		}
	}()
	t.Cleanup(func() { u.close(); <-beats })
	if f := u.next(); f["type"] != "welcome" {
		t.Fatalf("%s: first frame %v", u.name, f)
	}
	f := u.next()
	if f["type"] == "my_status" {
		u.my = f
		f = u.next()
	}
	if f["type"] != "snapshot" {
		t.Fatalf("%s: got %v, want the snapshot", u.name, f)
	}
	u.snap = f
	return u
}

func (u *wsUser) read(ctx context.Context) {
	defer close(u.done)
	defer close(u.frames)
	for {
		_, data, err := u.conn.Read(ctx)
		if err != nil {
			return
		}
		var f map[string]any
		if json.Unmarshal(data, &f) != nil {
			u.t.Errorf("%s: not JSON: %q", u.name, data)
			continue
		}
		select {
		case u.frames <- f:
		case <-ctx.Done():
			return
		}
	}
}

func (u *wsUser) close() {
	u.cancel()
	_ = u.conn.CloseNow()
	<-u.done
}

func (u *wsUser) next() map[string]any {
	u.t.Helper()
	select {
	case f, ok := <-u.frames:
		if !ok {
			u.t.Fatalf("%s: closed", u.name)
		}
		return f
	case <-time.After(10 * time.Second):
		u.t.Fatalf("%s: no frame within 10s", u.name)
	}
	return nil
}

func (u *wsUser) send(v any) {
	u.t.Helper()
	b, _ := json.Marshal(v)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := u.conn.Write(ctx, websocket.MessageText, b); err != nil {
		u.t.Fatalf("%s: write: %v", u.name, err)
	}
}

func (u *wsUser) setStatus(st map[string]any) {
	u.t.Helper()
	m := map[string]any{"type": "set_status"}
	for k, v := range st {
		m[k] = v
	}
	u.send(m)
}

// change waits for the next presence change, which must be want
// ("user=state"); frames of other types are refused.
func (u *wsUser) change(want string) map[string]any {
	u.t.Helper()
	f := u.next()
	if f["type"] != "presence" {
		u.t.Fatalf("%s: got %v while waiting for %s", u.name, f, want)
	}
	chs := f["changes"].([]any)
	c := chs[0].(map[string]any)
	if got := fmt.Sprintf("%s=%s", c["user_id"], c["state"]); len(chs) != 1 || got != want {
		u.t.Fatalf("%s: changes %v, want %s", u.name, chs, want)
	}
	return c
}

func (u *wsUser) myStatus(mode string) map[string]any {
	u.t.Helper()
	f := u.next()
	if f["type"] != "my_status" || f["mode"] != mode {
		u.t.Fatalf("%s: got %v, want my_status %s", u.name, f, mode)
	}
	return f
}

// quiet asserts no frame arrives for d (the "exactly once" half).
func (u *wsUser) quiet(d time.Duration) {
	u.t.Helper()
	select {
	case f, ok := <-u.frames:
		if ok {
			u.t.Fatalf("%s: expected nothing, got %v", u.name, f)
		}
	case <-time.After(d):
	}
}

func num(v any) int64 {
	f, _ := v.(float64)
	return int64(f)
}

func (n *node) put(path, body string) (int, string) {
	req, _ := http.NewRequest("PUT", "http://"+n.addr+path, strings.NewReader(body))
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		k, err := resp.Body.Read(buf)
		b.Write(buf[:k])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}

var statusTiming = timing{ttl: 3 * time.Second, heartbeat: time.Second, grace: 500 * time.Millisecond}

func TestStatusAcrossNodes(t *testing.T) {
	r := redistest.Start(t)
	a := startNode(t, r.URL(), "a", statusTiming)
	b := startNode(t, r.URL(), "b", statusTiming)
	a.join("t1", "alice", "bob", "carol")
	alice := dialWS(t, a, "alice", "web")
	carol := dialWS(t, b, "carol", "web")
	alice.change("carol=online")
	bobWeb := dialWS(t, a, "bob", "web")
	on := alice.change("bob=online")
	carol.change("bob=online")
	bobIOS := dialWS(t, b, "bob", "ios")

	// dnd from one device: every viewer, on either node, sees it once; the
	// other device, on the other node, learns it.
	bobWeb.setStatus(map[string]any{"mode": "dnd"})
	d := alice.change("bob=dnd")
	if dc := carol.change("bob=dnd"); num(dc["version"]) != num(d["version"]) || num(d["version"]) <= num(on["version"]) {
		t.Fatalf("dnd: alice %v, carol %v, after %v", d, dc, on)
	}
	for _, dev := range []*wsUser{bobWeb, bobIOS} {
		if m := dev.myStatus("dnd"); num(m["version"]) != num(d["version"]) {
			t.Fatalf("%s: my_status %v, want version %v", dev.name, m, d["version"])
		}
	}

	// Invisible from the other node: offline to everyone, while bob still
	// sees others; the truth on either node says invisible.
	bobIOS.setStatus(map[string]any{"mode": "invisible"})
	off := alice.change("bob=offline")
	carol.change("bob=offline")
	if off["last_seen"] == nil {
		t.Fatalf("going invisible = %v, want last_seen", off)
	}
	bobWeb.myStatus("invisible")
	bobIOS.myStatus("invisible")
	carol.send(map[string]string{"type": "status", "state": "away"})
	alice.change("carol=away")
	bobWeb.change("carol=away")
	bobIOS.change("carol=away")
	for _, n := range []*node{a, b} {
		if p := n.presence("bob"); p["state"] != "online" || p["mode"] != "invisible" || num(p["connection_count"]) != 2 {
			t.Fatalf("truth on %s = %v", n.name, p)
		}
	}
	// Back: the real state, once per viewer.
	bobWeb.setStatus(map[string]any{"mode": "auto"})
	alice.change("bob=online")
	carol.change("bob=online")
	bobWeb.myStatus("auto")
	bobIOS.myStatus("auto")

	// A backend sets a text with an expiry through node b; both nodes
	// sweep, and the expiry is published once, within a second.
	until := time.Now().Add(2 * time.Second).UnixMilli()
	code, body := b.put("/v1/users/bob/status", fmt.Sprintf(`{"mode":"auto","text":"In a meeting","emoji":"📅","expires_at":%d}`, until))
	if code != 200 || !strings.Contains(body, `"text":"In a meeting"`) {
		t.Fatalf("PUT = %d %s", code, body)
	}
	for _, v := range []*wsUser{alice, carol} {
		if c := v.change("bob=online"); c["text"] != "In a meeting" || c["emoji"] != "📅" || num(c["expires_at"]) != until {
			t.Fatalf("%s: text change %v", v.name, c)
		}
	}
	bobWeb.myStatus("auto")
	bobIOS.myStatus("auto")
	for _, v := range []*wsUser{alice, carol} {
		e := v.change("bob=online")
		if e["text"] != nil || e["emoji"] != nil {
			t.Fatalf("%s: expiry %v", v.name, e)
		}
		if late := num(e["at"]) - until; late < 0 || late > 1000 {
			t.Fatalf("%s: expiry published %d ms after expires_at", v.name, late)
		}
	}
	for _, dev := range []*wsUser{bobWeb, bobIOS} {
		if m := dev.myStatus("auto"); m["text"] != "" {
			t.Fatalf("%s: my_status after expiry %v", dev.name, m)
		}
	}
	// Exactly once: nothing more, anywhere.
	for _, u := range []*wsUser{alice, carol, bobWeb, bobIOS} {
		u.quiet(time.Second)
	}

	// Bad input is refused on either node and changes nothing.
	bobIOS.setStatus(map[string]any{"mode": "dnd", "text": strings.Repeat("x", 101)})
	if e := bobIOS.next(); e["type"] != "error" || e["code"] != "bad_request" {
		t.Fatalf("bad status: %v", e)
	}
	if code, _ := a.put("/v1/users/bob/status", `{"mode":"dnd","expires_at":1}`); code != 400 {
		t.Fatalf("PUT with a past expiry = %d, want 400", code)
	}
	alice.quiet(time.Second)
}

func TestStatusSurvivesReconnectAndNodeCrash(t *testing.T) {
	r := redistest.Start(t)
	a := startNode(t, r.URL(), "a", statusTiming)
	b := startNode(t, r.URL(), "b", statusTiming)
	a.join("t1", "alice", "bob")
	alice := dialWS(t, b, "alice", "web")
	bob := dialWS(t, a, "bob", "web")
	alice.change("bob=online")
	bob.setStatus(map[string]any{"mode": "dnd", "text": "focus"})
	alice.change("bob=dnd")
	bob.myStatus("dnd")

	// A reconnect: the new connection learns the status after welcome.
	bob.close()
	again := dialWS(t, a, "bob", "ios")
	if again.my == nil || again.my["mode"] != "dnd" || again.my["text"] != "focus" {
		t.Fatalf("my_status after reconnect = %v", again.my)
	}
	alice.quiet(statusTiming.grace + time.Second) // within the grace: nothing moved

	// Node a crashes: bob goes offline (his text still shown), and comes
	// back on node b with his status.
	a.kill()
	off := alice.change("bob=offline")
	if off["text"] != "focus" || off["last_seen"] == nil {
		t.Fatalf("offline after the crash = %v", off)
	}
	back := dialWS(t, b, "bob", "web")
	if back.my == nil || back.my["mode"] != "dnd" || back.my["text"] != "focus" {
		t.Fatalf("my_status after the crash = %v", back.my)
	}
	if c := alice.change("bob=dnd"); c["text"] != "focus" {
		t.Fatalf("back = %v", c)
	}
	// A new viewer's snapshot shows it too, with since.
	alice2 := dialWS(t, b, "alice", "ios")
	for _, e := range alice2.snap["users"].([]any) {
		if m := e.(map[string]any); m["user_id"] == "bob" && (m["state"] != "dnd" || m["text"] != "focus" || m["since"] == nil) {
			t.Fatalf("snapshot entry %v", m)
		}
	}
}

// A team join on one node shows the status text to the new teammate on the
// other, with the user's current version.
func TestTeamJoinShowsTheStatusTextAcrossNodes(t *testing.T) {
	r := redistest.Start(t)
	a := startNode(t, r.URL(), "a", statusTiming)
	b := startNode(t, r.URL(), "b", statusTiming)
	a.join("t1", "alice")
	a.join("t2", "bob")
	alice := dialWS(t, a, "alice", "web")
	bob := dialWS(t, b, "bob", "web")
	bob.setStatus(map[string]any{"mode": "dnd", "text": "focus"})
	my := bob.myStatus("dnd")
	b.join("t1", "bob")
	c := alice.change("bob=dnd")
	if c["text"] != "focus" || num(c["version"]) < num(my["version"]) {
		t.Fatalf("alice's catch-up = %v (status %v)", c, my)
	}
	if c := bob.change("alice=online"); c["text"] != nil {
		t.Fatalf("bob's catch-up = %v", c)
	}
}
