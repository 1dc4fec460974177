package server_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/server"
	"github.com/greendot/greendot/store/memstore"
)

// Settle is how long a test waits to be sure nothing more arrives: past the
// grace and a few sweeps.
const settle = testGrace + 400*time.Millisecond

func TestWelcomeAndSnapshot(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob", "carol")
	ts.join("t2", "dave")
	ts.dial(t, "bob")
	ts.dial(t, "dave") // no shared team with alice
	c := ts.dial(t, "carol")
	c.status("away")
	checkFor(t, 2*time.Second, func() error {
		if p := ts.presenceOf("carol"); p["state"] != "away" {
			return errorf("carol = %v", p)
		}
		return nil
	})

	alice := ts.dial(t, "alice")
	w := alice.welcome
	if w["user_id"] != "alice" || w["heartbeat_interval_ms"] != float64(testHeartbeat.Milliseconds()) ||
		w["ttl_ms"] != float64(testTTL.Milliseconds()) || w["offline_grace_ms"] != float64(testGrace.Milliseconds()) ||
		w["connection_id"] == "" {
		t.Fatalf("welcome = %v", w)
	}
	got := snapshotUsers(alice.snap)
	if len(got) != 2 || got["bob"] != "online" || got["carol"] != "away" {
		t.Fatalf("snapshot = %v, want bob online and carol away only (never alice herself, never dave)", got)
	}
}

func (c *wsClient) status(state string) {
	c.t.Helper()
	c.send(map[string]string{"type": "status", "state": state})
}

// Rule 1 and the multi-device bullet: one online, one offline, last_seen.
func TestManyDevicesOneDot(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob")
	alice := ts.dial(t, "alice")

	web := ts.dial(t, "bob", "web")
	alice.expectChanges(time.Second, "bob=online")
	phone := ts.dial(t, "bob", "ios")
	desk := ts.dial(t, "bob", "desktop")
	alice.expectQuiet(300 * time.Millisecond)

	p := ts.presenceOf("bob")
	if p["connection_count"] != float64(3) || len(p["devices"].([]any)) != 3 || p["state"] != "online" {
		t.Fatalf("presence = %v", p)
	}
	web.close()
	phone.close()
	alice.expectQuiet(settle)
	desk.close()
	closedAt := time.Now().UnixMilli()
	raw := alice.expectChanges(testGrace+time.Second, "bob=offline")
	if raw[0]["version"].(float64) != 2 {
		t.Fatalf("offline version = %v, want 2", raw[0]["version"])
	}
	alice.expectQuiet(settle)
	p = ts.presenceOf("bob")
	// The test client drops TCP without a close frame: last_seen is its
	// last heartbeat, at most one interval before the drop.
	last, ok := p["last_seen"].(float64)
	if p["state"] != "offline" || !ok || int64(last) < closedAt-testHeartbeat.Milliseconds()-100 || int64(last) > closedAt+50 {
		t.Fatalf("presence = %v, want offline, last seen within a heartbeat before %d", p, closedAt)
	}
}

// Reloads, Wi-Fi switches and reconnects within the grace are invisible.
func TestReconnectWithinGraceIsInvisible(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob")
	alice := ts.dial(t, "alice")
	bob := ts.dial(t, "bob")
	alice.expectChanges(time.Second, "bob=online")
	for i := 0; i < 3; i++ {
		bob.close() // a page reload
		time.Sleep(testGrace / 3)
		bob = ts.dial(t, "bob")
	}
	alice.expectQuiet(settle)
}

// A hung client (TCP open, silent) expires after the ttl.
func TestHungClientExpires(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob")
	alice := ts.dial(t, "alice")
	start := time.Now()
	bob := ts.dialSilent(t, "bob")
	alice.expectChanges(time.Second, "bob=online")
	lastFrame := time.Now().UnixMilli() // the handshake was bob's last sign of life
	alice.expectQuiet(testTTL - time.Since(start) - 100*time.Millisecond)
	alice.expectChanges(testGrace+time.Second+200*time.Millisecond, "bob=offline")
	if took := time.Since(start); took < testTTL+testGrace {
		t.Fatalf("offline after %v, before ttl+grace", took)
	}
	p := ts.presenceOf("bob")
	if last := int64(p["last_seen"].(float64)); last > lastFrame+100 {
		t.Fatalf("last_seen = %d, want the last frame (~%d), not the expiry time", last, lastFrame)
	}
	bob.expectClosed(websocket.StatusCode(-1)) // the server dropped the socket
}

// Rule 4: away only when every device is idle.
func TestAwayWhenEveryDeviceIdle(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob")
	alice := ts.dial(t, "alice")
	web := ts.dial(t, "bob", "web")
	ios := ts.dial(t, "bob", "ios")
	alice.expectChanges(time.Second, "bob=online")
	web.status("away")
	alice.expectQuiet(300 * time.Millisecond)
	ios.status("away")
	alice.expectChanges(time.Second, "bob=away")
	web.status("online")
	alice.expectChanges(time.Second, "bob=online")
	web.close() // the active device leaves; the idle one is left
	alice.expectChanges(time.Second, "bob=away")
}

// Rule 5: versions strictly increase.
func TestVersionsIncrease(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob")
	alice := ts.dial(t, "alice")
	var last float64
	for i := 0; i < 2; i++ {
		bob := ts.dial(t, "bob")
		raw := alice.expectChanges(time.Second, "bob=online")
		bob.status("away")
		raw = append(raw, alice.expectChanges(time.Second, "bob=away")...)
		bob.status("online")
		raw = append(raw, alice.expectChanges(time.Second, "bob=online")...)
		bob.close()
		raw = append(raw, alice.expectChanges(testGrace+time.Second, "bob=offline")...)
		for _, r := range raw {
			v := r["version"].(float64)
			if v <= last {
				t.Fatalf("version %v after %v", v, last)
			}
			last = v
			if at := int64(r["at"].(float64)); at < time.Now().Add(-time.Minute).UnixMilli() {
				t.Fatalf("at = %d is not a recent unix ms time", at)
			}
		}
	}
}

// Rule 6: once per connection, whatever the number of shared teams; nobody else.
func TestChangeReachesEachTeammateOnce(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob", "carol")
	ts.join("t2", "alice", "bob")
	ts.join("t3", "alice", "bob")
	ts.join("t9", "dave", "bob2")
	carol := ts.dial(t, "carol")
	a1 := ts.dial(t, "alice", "web")
	a2 := ts.dial(t, "alice", "ios")
	dave := ts.dial(t, "dave")
	carol.expectChanges(time.Second, "alice=online")
	ts.dial(t, "bob")
	a1.expectChanges(time.Second, "bob=online")
	a2.expectChanges(time.Second, "bob=online")
	carol.expectChanges(time.Second, "bob=online")
	a1.expectQuiet(300 * time.Millisecond)
	a2.expectQuiet(10 * time.Millisecond)
	dave.expectQuiet(10 * time.Millisecond)
}

// Rule 7: membership applies live, both ways.
func TestMembershipAppliesLive(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice")
	ts.join("t2", "bob", "carol")
	alice := ts.dial(t, "alice")
	bob := ts.dial(t, "bob")
	carol := ts.dial(t, "carol")
	bob.expectChanges(time.Second, "carol=online")
	alice.expectQuiet(300 * time.Millisecond)

	// bob joins t1: alice hears bob; bob hears alice (not carol again).
	ts.join("t1", "bob")
	raw := alice.expectChanges(time.Second, "bob=online")
	if raw[0]["version"] != float64(1) {
		t.Fatalf("join delivers the current version, got %v", raw[0]["version"])
	}
	bob.expectChanges(time.Second, "alice=online")
	carol.expectQuiet(300 * time.Millisecond)

	// Removed: nothing more passes between alice and bob.
	ts.leave("t1", "bob")
	time.Sleep(100 * time.Millisecond)
	bob.status("away")
	alice.status("away")
	carol.expectChanges(time.Second, "bob=away")
	alice.expectQuiet(300 * time.Millisecond)
	bob.expectQuiet(10 * time.Millisecond)
}

// A viewer that stopped sharing a team with a subject keeps the subject's
// last state it was sent; when they share a team again, it must hear the
// subject's offline too, or it shows a ghost. Both ways: the subject leaves
// and comes back, or the viewer does.
func TestRejoinCorrectsAStaleState(t *testing.T) {
	for _, who := range []string{"subject", "viewer"} {
		t.Run(who+" re-joins", func(t *testing.T) {
			ts := startServer(t)
			ts.join("t1", "alice", "bob")
			ts.join("t2", "carol")
			alice := ts.dial(t, "alice")
			bob := ts.dial(t, "bob")
			alice.expectChanges(time.Second, "bob=online")

			mover := map[string]string{"subject": "bob", "viewer": "alice"}[who]
			ts.leave("t1", mover)
			bob.close()
			checkFor(t, 2*time.Second, func() error {
				if st := ts.presenceOf("bob")["state"]; st != "offline" {
					return errorf("bob is %v", st)
				}
				return nil
			})
			alice.expectQuiet(100 * time.Millisecond)

			ts.join("t1", mover)
			alice.expectChanges(time.Second, "bob=offline")

			// carol never saw bob: her join tells her nothing.
			carol := ts.dial(t, "carol")
			ts.join("t1", "carol")
			alice.expectChanges(time.Second, "carol=online")
			carol.expectChanges(time.Second, "alice=online")
			carol.expectQuiet(300 * time.Millisecond)
		})
	}
}

func TestQueryOverWebSocket(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob")
	ts.join("t2", "zed")
	ts.dial(t, "zed")
	ts.dial(t, "bob", "ios")
	alice := ts.dial(t, "alice")
	alice.send(`{"type":"query","id":"q1","user_ids":["bob","zed","alice","nobody"]}`)
	r := alice.next("query_result")
	if r["id"] != "q1" {
		t.Fatalf("query id = %v", r["id"])
	}
	users := r["users"].([]any)
	bob := users[0].(map[string]any)
	if bob["state"] != "online" || bob["connection_count"] != float64(1) || bob["devices"].([]any)[0] != "ios" {
		t.Fatalf("bob = %v", bob)
	}
	if _, ok := bob["last_seen"]; !ok {
		t.Fatalf("bob has no last_seen: %v", bob)
	}
	zed := users[1].(map[string]any)
	if zed["state"] != "unknown" || len(zed) != 2 {
		t.Fatalf("zed (no shared team) = %v, want only user_id and state unknown", zed)
	}
	if self := users[2].(map[string]any); self["state"] != "online" {
		t.Fatalf("self = %v", self)
	}
	if nobody := users[3].(map[string]any); nobody["state"] != "unknown" {
		t.Fatalf("nobody = %v", nobody)
	}
}

func TestHeartbeatAck(t *testing.T) {
	ts := startServer(t)
	c := ts.dial(t, "alice")
	c.send(`{"type":"heartbeat","id":42}`)
	if ack := c.next("heartbeat_ack"); ack["id"] != float64(42) {
		t.Fatalf("ack = %v", ack)
	}
	c.send(`{"type":"heartbeat"}`)
	c.expectQuiet(200 * time.Millisecond)
}

func TestHTTPPresenceAPI(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob", "carol")
	ts.dial(t, "alice")
	b := ts.dial(t, "bob")
	b.status("away")

	code, body := ts.do("GET", "/v1/users/nobody/presence", "")
	if code != 200 || !strings.Contains(body, `"state":"offline"`) || !strings.Contains(body, `"last_seen":null`) {
		t.Fatalf("never seen: %d %s", code, body)
	}
	checkFor(t, 2*time.Second, func() error {
		_, body := ts.do("POST", "/v1/presence/query", `{"user_ids":["alice","bob","nobody"]}`)
		var r struct {
			Users []struct {
				UserID string `json:"user_id"`
				State  string `json:"state"`
			} `json:"users"`
		}
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			return err
		}
		if len(r.Users) != 3 || r.Users[0].State != "online" || r.Users[1].State != "away" || r.Users[2].State != "offline" {
			return errorf("query = %s", body)
		}
		return nil
	})
	code, body = ts.do("GET", "/v1/teams/t1/presence", "")
	var team struct {
		TeamID      string `json:"team_id"`
		MemberCount int    `json:"member_count"`
		Online      []struct {
			UserID  string `json:"user_id"`
			State   string `json:"state"`
			Version int    `json:"version"`
		} `json:"online"`
	}
	if err := json.Unmarshal([]byte(body), &team); err != nil || code != 200 {
		t.Fatalf("team: %d %s", code, body)
	}
	if team.TeamID != "t1" || team.MemberCount != 3 || len(team.Online) != 2 || team.Online[0].UserID != "alice" || team.Online[1].State != "away" {
		t.Fatalf("team = %+v", team)
	}
}

func TestMetricsExposed(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob")
	ts.dial(t, "alice")
	ts.dial(t, "bob")
	checkFor(t, 2*time.Second, func() error {
		_, body := ts.do("GET", "/metrics", "")
		for _, want := range []string{
			"greendot_connections 2", "greendot_users_online 2", "greendot_heartbeats_total",
			"greendot_heartbeat_gap_seconds_bucket", "greendot_expirations_total",
			"greendot_grace_cancellations_total", "greendot_fanout_connections_bucket",
			"greendot_deliveries_coalesced_total", "greendot_deliveries_dropped_total",
			"greendot_offline_detection_lag_seconds", "greendot_offline_grace_lag_seconds_bucket",
			"greendot_store_operation_seconds",
			"greendot_process_resident_memory_bytes", "go_memstats_heap_alloc_bytes",
		} {
			if !strings.Contains(body, want) {
				return errorf("metrics lack %q", want)
			}
		}
		return nil
	})
}

func TestHealthAndReady(t *testing.T) {
	ts := startServer(t)
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := ts.do("GET", path, ""); code != 200 {
			t.Fatalf("%s: %d %s", path, code, body)
		}
	}
}

// A clean close is a sign of life; a dropped socket is not.
func TestLastSeenCleanCloseVersusDrop(t *testing.T) {
	ts := startServer(t)
	for _, clean := range []bool{true, false} {
		user := fmt.Sprint("u-", clean)
		c := ts.dialSilent(t, user)
		lastFrame := time.Now().UnixMilli()
		time.Sleep(500 * time.Millisecond)
		closedAt := time.Now().UnixMilli()
		if clean {
			_ = c.conn.Close(websocket.StatusNormalClosure, "bye")
		} else {
			_ = c.conn.CloseNow()
		}
		checkFor(t, 3*time.Second, func() error {
			p := ts.presenceOf(user)
			if p["state"] != "offline" {
				return errorf("%s = %v", user, p)
			}
			last := int64(p["last_seen"].(float64))
			want := lastFrame
			if clean {
				want = closedAt
			}
			if last < want-100 || last > want+100 {
				return errorf("clean=%v: last_seen %d, want ~%d", clean, last, want)
			}
			return nil
		})
	}
}

func TestZeroGracePublishesOfflineAtOnce(t *testing.T) {
	ts := startServer(t, func(c *server.Config) {
		st, _ := memstore.New(memstore.Config{TTL: testTTL})
		c.Store, c.Grace = st, 0
	})
	ts.join("t1", "alice", "bob")
	alice := ts.dial(t, "alice")
	bob := ts.dial(t, "bob")
	alice.expectChanges(time.Second, "bob=online")
	start := time.Now()
	bob.close()
	alice.expectChanges(time.Second, "bob=offline")
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("offline after %v with no grace", d)
	}
}

// An offline published at the end of a grace is counted, with how late it
// was decided (the cases it leaves out: presence's TestGraceLag…).
func TestGraceEndedOfflineIsCounted(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob")
	alice := ts.dial(t, "alice")
	bob := ts.dial(t, "bob")
	alice.expectChanges(time.Second, "bob=online")
	bob.close()
	alice.expectChanges(5*time.Second, "bob=offline")
	checkFor(t, 2*time.Second, func() error {
		_, body := ts.do("GET", "/metrics", "")
		if !strings.Contains(body, "greendot_offline_grace_lag_seconds_count 1\n") {
			return errorf("grace end not counted once")
		}
		return nil
	})
}

// Expiry of a silent connection is counted as an expiration.
func TestExpiryIsCounted(t *testing.T) {
	ts := startServer(t)
	ts.dialSilent(t, "bob")
	checkFor(t, 5*time.Second, func() error {
		_, body := ts.do("GET", "/metrics", "")
		if !strings.Contains(body, "greendot_expirations_total 1") || !strings.Contains(body, "greendot_offline_detection_lag_seconds_count 1") {
			return errorf("expiry not counted")
		}
		return nil
	})
}

// A grace end is a known deadline: the memory store's is swept when due,
// not at the next tick (here an hour away).
func TestGraceEndsWithoutWaitingForTheTick(t *testing.T) {
	ts := startServer(t, func(c *server.Config) { c.SweepInterval = time.Hour })
	ts.join("eng", "ann", "ben")
	ben := ts.dial(t, "ben")
	ann := ts.dial(t, "ann")
	ben.expectChanges(5*time.Second, "ann=online")
	ann.close()
	ben.expectChanges(5*time.Second, "ann=offline")
}

// A user in more teams than the team they join has members: the joiner's
// catch-up reads the members' teams instead of every other team's members,
// and still sends only those it could not see before (dave), not those it
// sees through another team (carol).
func TestJoinCatchUpOfAUserInManyTeams(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "bob", "carol")
	for _, team := range []string{"t2", "t3", "t4", "t5", "t6"} {
		ts.join(team, "bob")
	}
	ts.join("x", "carol", "dave")
	carol := ts.dial(t, "carol")
	dave := ts.dial(t, "dave")
	carol.expectChanges(time.Second, "dave=online")
	bob := ts.dial(t, "bob")
	if got := snapshotUsers(bob.snap); len(got) != 1 || got["carol"] != "online" {
		t.Fatalf("bob's snapshot %v, want carol online alone", got)
	}
	dave.expectChanges(time.Second) // nothing: no team shared yet
	ts.join("x", "bob")
	bob.expectChanges(time.Second, "dave=online")
	bob.expectQuiet(300 * time.Millisecond)
	dave.expectChanges(time.Second, "bob=online")

	// bob leaves x: dave is no longer seen, carol still is (through t1).
	ts.leave("x", "bob") // the memory store hands the hub the removal before it answers
	dave.status("away")
	carol.status("away")
	bob.expectChanges(time.Second, "carol=away")
	bob.expectQuiet(300 * time.Millisecond)
}
