package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/store/redisstore/redistest"
)

var quick = timing{ttl: 10 * time.Second, heartbeat: 2 * time.Second, grace: 1500 * time.Millisecond}

func TestAcrossNodes(t *testing.T) {
	t.Run("redis", func(t *testing.T) { testAcrossNodes(t, redistest.Start(t).URL()) })
	t.Run("cluster", func(t *testing.T) { testAcrossNodes(t, redistest.StartCluster(t, 3).URL()) })
}

func testAcrossNodes(t *testing.T, url string) {
	a := startNode(t, url, "a", quick)
	b := startNode(t, url, "b", quick)
	a.join("t1", "alice", "bob")
	b.join("t2", "alice", "bob") // a second shared team: still one change each

	alice := connect(t, a, "alice", "web")
	bobWeb := connect(t, b, "bob", "web")
	alice.expect(3*time.Second, "bob=online")
	bobPhone := connect(t, a, "bob", "ios") // a second device, on the other node
	alice.still(time.Second, "bob=online")

	// Both nodes answer the same.
	for _, n := range []*node{a, b} {
		p := n.presence("bob")
		if p["state"] != "online" || p["connection_count"] != float64(2) || fmt.Sprint(p["devices"]) != "[ios web]" {
			t.Fatalf("bob on %s = %v", n.name, p)
		}
	}
	_, ta := a.get("/v1/teams/t1/presence")
	_, tb := b.get("/v1/teams/t1/presence")
	if ta != tb {
		t.Fatalf("team presence differs: %s vs %s", ta, tb)
	}

	// A membership change on one node applies on the other, both ways.
	carol := connect(t, b, "carol", "web")
	alice.still(500*time.Millisecond, "bob=online")
	b.join("t1", "carol")
	alice.expect(3*time.Second, "bob=online", "carol=online")
	checkFor(t, 3*time.Second, func() error {
		if s, ok := carol.c.Get("alice"); !ok || s.State != "online" {
			return fmt.Errorf("carol does not see alice: %+v", s)
		}
		return nil
	})

	// The last device leaves: one offline, after the grace.
	_ = bobWeb.c.Close()
	alice.still(quick.grace/2, "bob=online", "carol=online")
	_ = bobPhone.c.Close()
	alice.expect(quick.grace+3*time.Second, "bob=online", "carol=online", "bob=offline")
	alice.still(time.Second, "bob=online", "carol=online", "bob=offline")
}

// A node killed with kill -9: its users go offline well before their ttl.
func TestKilledNodeUsersGoOffline(t *testing.T) {
	quick := timing{ttl: 25 * time.Second, heartbeat: 10 * time.Second, grace: 1500 * time.Millisecond}
	url := redistest.Start(t).URL()
	a := startNode(t, url, "a", quick)
	b := startNode(t, url, "b", quick)
	a.join("t1", "alice", "bob")
	alice := connect(t, a, "alice", "web")
	connect(t, b, "bob", "web")
	alice.expect(3*time.Second, "bob=online")

	killed := time.Now()
	b.kill()
	alice.expect(quick.ttl, "bob=online", "bob=offline")
	if took := time.Since(killed); took > quick.ttl/3 {
		t.Fatalf("offline %v after the kill; want well before the %v ttl", took, quick.ttl)
	}
	if p := a.presence("bob"); p["last_seen"] == nil || p["connection_count"] != float64(0) {
		t.Fatalf("bob = %v", p)
	}
}

// Redis away for longer than the ttl, then back with its data: nobody is
// shown offline, clients stay connected, and presence works again.
func TestRedisOutageLongerThanTTL(t *testing.T) {
	r, a, b := twoNodes(t, "--appendonly", "yes", "--appendfsync", "always")
	a.join("t1", "alice", "bob")
	alice := connect(t, a, "alice", "web")
	bob := connect(t, b, "bob", "web")
	alice.expect(3*time.Second, "bob=online")

	r.Stop()
	checkFor(t, 3*time.Second, func() error {
		if code, _ := a.get("/readyz"); code != 503 {
			return fmt.Errorf("readyz = %d while redis is down, want 503", code)
		}
		return nil
	})
	time.Sleep(short.ttl + short.grace + time.Second)
	r.Restart()

	checkFor(t, 5*time.Second, func() error {
		for _, n := range []*node{a, b} {
			if code, body := n.get("/readyz"); code != 200 {
				return fmt.Errorf("%s readyz = %d %s", n.name, code, body)
			}
		}
		if p := a.presence("bob"); p["state"] != "online" || p["connection_count"] != float64(1) {
			return fmt.Errorf("bob = %v", p)
		}
		return nil
	})
	alice.still(short.ttl+short.grace+time.Second, "bob=online")
	if bob.c.State().String() != "connected" {
		t.Fatalf("bob's client is %v, want connected throughout", bob.c.State())
	}
	_ = bob.c.Close()
	alice.expect(short.grace+3*time.Second, "bob=online", "bob=offline")
}

// FLUSHALL (or a failover to an empty Redis): the nodes put their live
// connections back, and nothing false is published.
func TestFlushAllIsRebuiltFromTheNodes(t *testing.T) {
	r, a, b := twoNodes(t)
	a.join("t1", "alice", "bob")
	alice := connect(t, a, "alice", "web")
	bob := connect(t, b, "bob", "web")
	alice.expect(3*time.Second, "bob=online")

	if _, err := r.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	// Reads are refused (503) until the hold-off after the loss is over:
	// node ttl (= ttl) + 2 s.
	checkFor(t, short.ttl+2*time.Second+short.heartbeat+3*time.Second, func() error {
		code, body := a.get("/v1/users/bob/presence")
		if code != 200 || !strings.Contains(body, `"state":"online"`) || !strings.Contains(body, `"connection_count":1`) {
			return fmt.Errorf("bob = %d %s", code, body)
		}
		return nil
	})
	alice.still(short.ttl+short.grace, "bob=online")
	// Membership is gone with the data (docs/operations.md: use AOF); put it back.
	a.join("t1", "alice", "bob")
	_ = bob.c.Close()
	alice.expect(short.grace+3*time.Second, "bob=online", "bob=offline")
}

// After Redis lost its data, no node serves a snapshot or an answer
// before every live node has written its connections back: until then a
// reader would be told that their users are offline. Connects and reads
// are refused with 503 (and a reason) instead, and what is served is whole.
func TestDataLossServesNoPartialSnapshot(t *testing.T) {
	r, a, b := twoNodes(t)
	a.join("t1", "alice", "bob", "carol")
	connect(t, a, "alice", "web")
	bob := connect(t, b, "bob", "web")
	bob.expect(3*time.Second, "alice=online")

	if _, err := r.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	a.join("t1", "alice", "bob", "carol") // membership back at once, as from AOF
	refused, served := 0, 0
	// Refused until each node's own resync after the loss: the 5 s hold-off
	// (node liveness 3 s + 2 s) from when its beat (every second) found the
	// loss; then served for 2 s.
	end := time.Now().Add(5*time.Second + time.Second + 2*time.Second)
	for time.Now().Before(end) {
		for _, n := range []*node{a, b} {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			users, status, err := snapshotOf(ctx, n, "carol")
			cancel()
			switch {
			case status == http.StatusServiceUnavailable || status == int(websocket.StatusTryAgainLater):
				refused++
			case err != nil:
				t.Fatalf("connect to %s: %v (status %d)", n.name, err, status)
			default:
				served++
				if users["alice"] != "online" || users["bob"] != "online" {
					t.Fatalf("a snapshot from %s %d connects after the FLUSHALL lacks live users: %v", n.name, refused+served, users)
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if refused == 0 || served == 0 {
		t.Fatalf("refused %d, served %d: want connects refused during the hold-off, then served", refused, served)
	}
	t.Logf("refused %d connects during the hold-off, then served %d whole snapshots", refused, served)
}

// Redis restarted without its data: the nodes get it back before they
// learn that it is empty, and a resync then would read every user of the
// other node as offline. Nobody is told anything false: the resync waits
// for the nodes to write their connections back.
func TestRestartEmptyTellsNothingFalse(t *testing.T) {
	r, a, b := twoNodes(t)
	a.join("t1", "alice", "bob", "carol")
	alice := connect(t, a, "alice", "web")
	bob := connect(t, b, "bob", "web")
	carol := connect(t, b, "carol", "web")
	alice.expect(3*time.Second, "bob=online", "carol=online")
	bob.expect(3*time.Second, "alice=online", "carol=online")
	carol.expect(3*time.Second, "alice=online", "bob=online")

	r.Stop()
	// The nodes notice before Redis comes back empty.
	checkFor(t, 3*time.Second, func() error {
		for _, n := range []*node{a, b} {
			if code, _ := n.get("/readyz"); code != 503 {
				return fmt.Errorf("%s readyz = %d while redis is down, want 503", n.name, code)
			}
		}
		return nil
	})
	r.Restart()
	a.join("t1", "alice", "bob", "carol") // membership back, as from AOF
	// Past the hold-off (node ttl + 2 s) and a resync.
	alice.still(short.ttl+2*time.Second+2*time.Second, "bob=online", "carol=online")
	bob.still(0, "alice=online", "carol=online")
	carol.still(0, "alice=online", "bob=online")
	_ = bob.c.Close()
	alice.expect(short.grace+3*time.Second, "bob=online", "carol=online", "bob=offline")
}

// A viewer keeps a removed teammate's last state; when they share a team
// again it must hear the offline, even after Redis lost its data and reads
// the teammate as never seen (version 0, below what the viewer holds).
func TestRejoinAfterDataLossCorrectsAStaleState(t *testing.T) {
	r, a, b := twoNodes(t)
	a.join("t1", "alice", "bob")
	alice := connect(t, a, "alice", "web")
	bob := connect(t, b, "bob", "web")
	alice.expect(3*time.Second, "bob=online")
	if code, body := a.do("DELETE", "/v1/teams/t1/members/bob"); code != 204 {
		t.Fatalf("remove bob: %d %s", code, body)
	}
	_ = bob.c.Close()
	checkFor(t, short.grace+3*time.Second, func() error {
		if p := a.presence("bob"); p["state"] != "offline" {
			return fmt.Errorf("bob = %v", p)
		}
		return nil
	})

	r.Stop()
	r.Restart()
	a.join("t1", "alice", "bob") // membership back, as from AOF
	alice.expect(short.ttl+2*time.Second+3*time.Second, "bob=online", "bob=offline")
}

// snapshotOf connects as user (dev mode), reads the snapshot and closes:
// the users it lists and their states, or the HTTP status of a refusal
// (1013 for a close "try again later" after the upgrade).
func snapshotOf(ctx context.Context, n *node, user string) (map[string]string, int, error) {
	conn, resp, err := websocket.Dial(ctx, n.ws()+"?user="+user, nil)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		return nil, status, err
	}
	defer conn.CloseNow()
	for {
		_, b, err := conn.Read(ctx)
		if websocket.CloseStatus(err) == websocket.StatusTryAgainLater {
			return nil, int(websocket.StatusTryAgainLater), err
		}
		if err != nil {
			return nil, http.StatusSwitchingProtocols, err
		}
		var f struct {
			Type  string `json:"type"`
			Users []struct {
				UserID string `json:"user_id"`
				State  string `json:"state"`
			} `json:"users"`
		}
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, http.StatusSwitchingProtocols, err
		}
		if f.Type == "snapshot" {
			users := make(map[string]string, len(f.Users))
			for _, u := range f.Users {
				users[u.UserID] = u.State
			}
			return users, http.StatusSwitchingProtocols, nil
		}
	}
}

// SIGTERM of a node in a rolling deploy: its clients move to another node
// within the grace and nobody sees them go offline.
func TestRollingDeployFlipsNoDot(t *testing.T) {
	url := redistest.Start(t).URL()
	a := startNode(t, url, "a", quick)
	b := startNode(t, url, "b", quick)
	a.join("t1", "alice", "bob")
	alice := connect(t, b, "alice", "web")
	bobOnA := connect(t, a, "bob", "web")
	alice.expect(3*time.Second, "bob=online")

	a.sigterm()
	checkFor(t, 5*time.Second, func() error {
		if bobOnA.c.State().String() == "connected" {
			return fmt.Errorf("bob is still connected to the draining node")
		}
		return nil
	})
	// The load balancer sends bob's reconnect to b.
	connect(t, b, "bob", "web")
	select {
	case <-a.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the drained node did not exit")
	}
	_ = bobOnA.c.Close()
	alice.still(quick.grace+2*time.Second, "bob=online")
}

// A slow link between a node and Redis (here 350 ms each way, for twice
// the node liveness) is lateness, not death: the node's liveness beats
// must still land, or the others take it for dead and its users go
// offline (chaos: 276 ms for 4.5 s made one user offline for everyone).
func TestSlowRedisLinkKeepsNodeAlive(t *testing.T) {
	tm := timing{ttl: 3 * time.Second, heartbeat: time.Second, grace: 1500 * time.Millisecond}
	r := redistest.Start(t)
	p := newFaultProxy(t)
	p.SetUpstream(r.Addr())
	a := startNode(t, r.URL(), "a", tm)
	b := startNode(t, "redis://"+p.Addr(), "b", tm)
	a.join("t1", "alice", "bob")
	alice := connect(t, a, "alice", "web")
	bob := connect(t, b, "bob", "web")
	alice.expect(3*time.Second, "bob=online")
	bob.expect(3*time.Second, "alice=online")

	p.SetLatency(350 * time.Millisecond)
	alice.still(2*3*time.Second, "bob=online")
	p.SetLatency(0)
	alice.still(tm.grace+time.Second, "bob=online")
}

// short are the timings of the fault tests on two nodes.
var short = timing{ttl: 2 * time.Second, heartbeat: 500 * time.Millisecond, grace: time.Second}

// twoNodes starts a redis-server (with extra args) and nodes a and b on it.
func twoNodes(t *testing.T, extra ...string) (*redistest.Server, *node, *node) {
	t.Helper()
	r := redistest.Start(t, extra...)
	return r, startNode(t, r.URL(), "a", short), startNode(t, r.URL(), "b", short)
}
