package server_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"
)

// The user-level status over real WebSockets on one node (DESIGN.md Part
// 1b, "Status").

// dialStatus is dial for a user who may have a status: welcome, then
// my_status (returned, nil when none came), then the snapshot.
func (ts *testServer) dialStatus(t *testing.T, user string, device ...string) (*wsClient, frame) {
	t.Helper()
	q := url.Values{"user": {user}}
	if len(device) > 0 {
		q.Set("device", device[0])
	}
	c, resp, err := ts.dialRaw(t, q.Encode())
	if err != nil {
		t.Fatalf("dial %s: %v (%v)", user, err, resp)
	}
	c.name = user
	c.welcome = c.next("welcome")
	var my frame
	f := c.nextAny()
	if f.typ() == "my_status" {
		my = f
		f = c.nextAny()
	}
	if f.typ() != "snapshot" {
		t.Fatalf("%s: got %v, want the snapshot", user, f)
	}
	c.snap = f
	c.heartbeatEvery(testHeartbeat)
	return c, my
}

func (c *wsClient) nextAny() frame {
	c.t.Helper()
	select {
	case f, ok := <-c.frames:
		if !ok {
			c.t.Fatalf("%s: closed (%v)", c.name, c.closeStatus())
		}
		return f
	case <-time.After(5 * time.Second):
		c.t.Fatalf("%s: no frame within 5s", c.name)
	}
	return nil
}

func (c *wsClient) setStatus(st map[string]any) {
	c.t.Helper()
	m := map[string]any{"type": "set_status"}
	for k, v := range st {
		m[k] = v
	}
	c.send(m)
}

// expectChange waits for one presence change and returns it.
func (c *wsClient) expectChange(want string) map[string]any {
	c.t.Helper()
	return c.expectChanges(5*time.Second, want)[0]
}

// expectMyStatus waits for a my_status frame with mode.
func (c *wsClient) expectMyStatus(mode string) frame {
	c.t.Helper()
	f := c.next("my_status")
	if f["mode"] != mode {
		c.t.Fatalf("%s: my_status = %v, want mode %s", c.name, f, mode)
	}
	return f
}

func num(v any) int64 {
	f, _ := v.(float64)
	return int64(f)
}

func TestDNDReachesViewersAndTheOwnDevices(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob")
	alice, _ := ts.dialStatus(t, "alice")
	web, _ := ts.dialStatus(t, "bob", "web")
	on := alice.expectChange("bob=online")
	ios, _ := ts.dialStatus(t, "bob", "ios")

	web.setStatus(map[string]any{"mode": "dnd"})
	c := alice.expectChange("bob=dnd")
	if num(c["version"]) <= num(on["version"]) || num(c["since"]) < num(on["at"]) || c["since"] != c["at"] {
		t.Fatalf("dnd = %v after %v: want a newer version, since the change", c, on)
	}
	for _, dev := range []*wsClient{web, ios} {
		if m := dev.expectMyStatus("dnd"); num(m["version"]) != num(c["version"]) || m["text"] != "" || m["expires_at"] != nil {
			t.Fatalf("%s: my_status = %v, want dnd at version %v", dev.name, m, c["version"])
		}
	}
	// Idle devices: still dnd, nothing published.
	web.status("away")
	ios.status("away")
	alice.expectQuiet(settle)

	// A new device learns the status right after welcome; a new viewer
	// sees dnd in the snapshot, with since.
	_, my := ts.dialStatus(t, "bob", "desktop")
	if my == nil || my["mode"] != "dnd" || num(my["version"]) != num(c["version"]) {
		t.Fatalf("my_status after welcome = %v, want dnd at %v", my, c["version"])
	}
	ios.expectQuiet(100 * time.Millisecond)
	alice2, _ := ts.dialStatus(t, "alice", "ios")
	u := snapshotEntry(t, alice2.snap, "bob")
	if u["state"] != "dnd" || num(u["since"]) != num(c["since"]) {
		t.Fatalf("snapshot entry = %v, want dnd since %v", u, c["since"])
	}

	// Back to auto: the real state (the desktop is active).
	web.setStatus(map[string]any{"mode": "auto"})
	alice.expectChange("bob=online")
	alice2.expectChange("bob=online")
}

func snapshotEntry(t *testing.T, snap frame, user string) map[string]any {
	t.Helper()
	for _, u := range snap["users"].([]any) {
		if m := u.(map[string]any); m["user_id"] == user {
			return m
		}
	}
	t.Fatalf("snapshot %v has no %s", snap, user)
	return nil
}

func TestInvisibleUserSeesOthersAndIsOfflineToThem(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob", "carol")
	alice, _ := ts.dialStatus(t, "alice")
	bob, _ := ts.dialStatus(t, "bob")
	alice.expectChange("bob=online")
	bob.setStatus(map[string]any{"mode": "invisible", "text": "secret"})
	c := alice.expectChange("bob=offline")
	if c["last_seen"] == nil || c["since"] != c["last_seen"] || c["text"] != nil {
		t.Fatalf("going invisible = %v, want offline, last seen that moment, no text", c)
	}
	bob.expectMyStatus("invisible")

	// Still sees others.
	carol, _ := ts.dialStatus(t, "carol")
	bob.expectChange("carol=online")
	alice.expectChange("carol=online")
	if got := snapshotUsers(carol.snap); got["bob"] != "" {
		t.Fatalf("carol's snapshot = %v, want no bob", got)
	}
	// Activity while invisible shows nothing.
	bob.status("away")
	alice.expectQuiet(settle)

	// Every answer but the truth says offline.
	alice.send(map[string]any{"type": "query", "id": "q", "user_ids": []string{"bob"}})
	q := alice.next("query_result")["users"].([]any)[0].(map[string]any)
	if q["state"] != "offline" || num(q["connection_count"]) != 0 || len(q["devices"].([]any)) != 0 ||
		num(q["last_seen"]) != num(c["last_seen"]) || q["mode"] != nil || q["text"] != nil {
		t.Fatalf("query = %v, want offline with nothing of the truth", q)
	}
	_, body := ts.do("POST", "/v1/presence/query", `{"user_ids":["bob"]}`)
	if !strings.Contains(body, `"state":"offline"`) || strings.Contains(body, "secret") {
		t.Fatalf("HTTP query = %s, want offline", body)
	}
	_, body = ts.do("GET", "/v1/teams/t1/presence", "")
	if strings.Contains(body, `"user_id":"bob","state"`) {
		t.Fatalf("team presence lists bob online: %s", body)
	}
	truth := ts.presenceOf("bob")
	if truth["state"] != "away" || truth["mode"] != "invisible" || num(truth["connection_count"]) != 1 || truth["text"] != "secret" {
		t.Fatalf("truth = %v, want away, invisible, one connection", truth)
	}

	// Coming back shows the real state.
	bob.setStatus(map[string]any{"mode": "auto"})
	alice.expectChange("bob=away")
	carol.expectChange("bob=away")
}

func TestStatusTextExpiresOnItsOwn(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob")
	alice, _ := ts.dialStatus(t, "alice")
	bob, _ := ts.dialStatus(t, "bob")
	on := alice.expectChange("bob=online")
	until := time.Now().Add(1500 * time.Millisecond).UnixMilli()
	bob.setStatus(map[string]any{"mode": "auto", "text": "In a meeting", "emoji": "📅", "expires_at": until})
	c := alice.expectChange("bob=online")
	if c["text"] != "In a meeting" || c["emoji"] != "📅" || num(c["expires_at"]) != until ||
		num(c["since"]) != num(on["since"]) || num(c["version"]) <= num(on["version"]) {
		t.Fatalf("text change = %v after %v, want the text, since kept, a new version", c, on)
	}
	if m := bob.expectMyStatus("auto"); m["text"] != "In a meeting" || num(m["expires_at"]) != until {
		t.Fatalf("my_status = %v", m)
	}
	// The same status again publishes nothing.
	bob.setStatus(map[string]any{"mode": "auto", "text": "In a meeting", "emoji": "📅", "expires_at": until})
	bob.expectQuiet(200 * time.Millisecond)

	e := alice.expectChange("bob=online")
	if e["text"] != nil || e["emoji"] != nil || e["expires_at"] != nil || num(e["since"]) != num(on["since"]) {
		t.Fatalf("expiry = %v, want online with no text", e)
	}
	// Published within a second of the expiry, by the server's clock.
	if late := num(e["at"]) - until; late < 0 || late > 1000 {
		t.Fatalf("expiry published at %d, %d ms after expires_at %d", num(e["at"]), late, until)
	}
	if m := bob.expectMyStatus("auto"); m["text"] != "" || m["expires_at"] != nil {
		t.Fatalf("my_status after expiry = %v", m)
	}
	alice.expectQuiet(settle)
	if _, body := ts.do("GET", "/metrics", ""); !strings.Contains(body, "\ngreendot_status_expirations_total 1\n") {
		t.Fatalf("metrics do not count one status expiry")
	}
}

func TestBackendSetsStatusOverHTTP(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob")
	alice, _ := ts.dialStatus(t, "alice")
	bob, _ := ts.dialStatus(t, "bob")
	alice.expectChange("bob=online")

	until := time.Now().Add(time.Hour).UnixMilli()
	body := fmt.Sprintf(`{"mode":"dnd","text":"In a meeting","emoji":"📅","expires_at":%d}`, until)
	code, resp := ts.do("PUT", "/v1/users/bob/status", body)
	var p map[string]any
	_ = json.Unmarshal([]byte(resp), &p)
	if code != 200 || p["state"] != "dnd" || p["mode"] != "dnd" || p["text"] != "In a meeting" || num(p["expires_at"]) != until {
		t.Fatalf("PUT = %d %s", code, resp)
	}
	c := alice.expectChange("bob=dnd")
	if c["text"] != "In a meeting" || num(c["version"]) != num(p["version"]) {
		t.Fatalf("change = %v, want the text at version %v", c, p["version"])
	}
	bob.expectMyStatus("dnd")
	// Written again unchanged: nothing.
	if code, resp := ts.do("PUT", "/v1/users/bob/status", body); code != 200 {
		t.Fatalf("PUT again = %d %s", code, resp)
	}
	alice.expectQuiet(settle)

	code, resp = ts.do("DELETE", "/v1/users/bob/status", "")
	if code != 200 || !strings.Contains(resp, `"mode":"auto"`) {
		t.Fatalf("DELETE = %d %s", code, resp)
	}
	if c := alice.expectChange("bob=online"); c["text"] != nil {
		t.Fatalf("after DELETE = %v", c)
	}
	bob.expectMyStatus("auto")
}

func TestBadStatusIsRefusedAndChangesNothing(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob")
	alice, _ := ts.dialStatus(t, "alice")
	bob, _ := ts.dialStatus(t, "bob")
	alice.expectChange("bob=online")
	past := time.Now().Add(-time.Minute).UnixMilli()
	bad := []map[string]any{
		{"mode": "busy"},
		{"text": "no mode"},
		{"mode": "dnd", "text": strings.Repeat("x", 101)},
		{"mode": "dnd", "emoji": strings.Repeat("😀", 9)},
		{"mode": "dnd", "expires_at": past},
		{"mode": "dnd", "text": "evil\u202eeulav"},
		{"mode": "dnd", "text": "nul\x00"},
		{"mode": "dnd", "text": 7},
	}
	for _, st := range bad {
		bob.setStatus(st)
		if e := bob.next("error"); e["code"] != "bad_request" {
			t.Fatalf("%v: error %v, want bad_request", st, e)
		}
		b, _ := json.Marshal(st)
		if code, resp := ts.do("PUT", "/v1/users/bob/status", string(b)); code != 400 || !strings.Contains(resp, `"bad_request"`) {
			t.Fatalf("PUT %s = %d %s, want 400 bad_request", b, code, resp)
		}
	}
	for _, raw := range []string{`{"mode":"dnd","text":"\ud800"}`, `{"mode":"dnd"`, `[]`, `{"mode":"dnd"} {}`} {
		if code, resp := ts.do("PUT", "/v1/users/bob/status", raw); code != 400 {
			t.Fatalf("PUT %s = %d %s, want 400", raw, code, resp)
		}
	}
	alice.expectQuiet(settle)
	if p := ts.presenceOf("bob"); p["state"] != "online" || p["mode"] != "auto" {
		t.Fatalf("bob = %v, want online, auto", p)
	}
}

func TestStatusSurvivesReconnect(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob")
	alice, _ := ts.dialStatus(t, "alice")
	bob, _ := ts.dialStatus(t, "bob")
	alice.expectChange("bob=online")
	bob.setStatus(map[string]any{"mode": "dnd", "text": "focus"})
	alice.expectChange("bob=dnd")
	bob.expectMyStatus("dnd")
	bob.close()
	off := alice.expectChange("bob=offline")
	if off["text"] != "focus" || off["last_seen"] == nil || off["since"] == nil {
		t.Fatalf("offline = %v, want the text, last_seen and since", off)
	}
	bob2, my := ts.dialStatus(t, "bob", "ios")
	if my == nil || my["mode"] != "dnd" || my["text"] != "focus" {
		t.Fatalf("my_status on reconnect = %v", my)
	}
	if c := alice.expectChange("bob=dnd"); c["text"] != "focus" {
		t.Fatalf("back = %v", c)
	}
	bob2.expectQuiet(100 * time.Millisecond)
}

// A team join (rule 7) shows the status text to the new teammates, both ways.
func TestTeamJoinShowsTheStatusText(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice")
	ts.join("t2", "bob")
	alice, _ := ts.dialStatus(t, "alice")
	bob, _ := ts.dialStatus(t, "bob")
	bob.setStatus(map[string]any{"mode": "dnd", "text": "focus", "emoji": "🎧"})
	bob.expectMyStatus("dnd")
	alice.setStatus(map[string]any{"mode": "auto", "text": "lunch"})
	alice.expectMyStatus("auto")
	ts.join("t1", "bob")
	if c := alice.expectChange("bob=dnd"); c["text"] != "focus" || c["emoji"] != "🎧" || c["since"] == nil {
		t.Fatalf("alice's catch-up = %v", c)
	}
	if c := bob.expectChange("alice=online"); c["text"] != "lunch" {
		t.Fatalf("bob's catch-up = %v", c)
	}
}
