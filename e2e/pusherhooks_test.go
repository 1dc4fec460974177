package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/hooktest"
	"github.com/greendot/greendot/internal/nodetest"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

func pusherHookFlags(recv *hooktest.PusherReceiver) []string {
	return []string{"--pusher-app-id", "1", "--pusher-key", hooktest.PusherKey,
		"--pusher-secret", hooktest.PusherSecret, "--pusher-webhook-url", recv.URL()}
}

// pusherEvents lists the events delivered to recv as "name channel user".
func pusherEvents(recv *hooktest.PusherReceiver) []string {
	var out []string
	for _, h := range recv.Delivered() {
		for _, e := range h.Events {
			out = append(out, strings.TrimSpace(e.Name+" "+e.Channel+" "+e.UserID))
		}
	}
	return out
}

// expectPusherEvents waits until recv has been delivered exactly want,
// in that order.
func expectPusherEvents(t *testing.T, recv *hooktest.PusherReceiver, want ...string) {
	t.Helper()
	w := strings.Join(want, ", ")
	checkFor(t, 20*time.Second, func() error {
		if got := strings.Join(pusherEvents(recv), ", "); got != w {
			return fmt.Errorf("Pusher events\n  %s\nwant\n  %s", got, w)
		}
		return nil
	})
	recv.Check(t)
}

// One node on the memory store: a native client's first connection is a
// member_added on each of its user's teams, the close a member_removed
// once the grace is over.
func TestPusherWebhooksOneNode(t *testing.T) {
	recv := hooktest.StartPusher(t)
	p := nodetest.Start(t, binary, "m", append([]string{"--offline-grace", "1s"}, pusherHookFlags(recv)...)...)
	n := &node{t: t, name: "m", addr: p.Addr, proc: p, cmd: p.Cmd, done: p.Done, log: p.Log}
	n.join("eng", "alice")
	n.join("ops", "alice")
	v := connect(t, n, "alice", "web")
	added := []string{"channel_occupied presence-eng", "member_added presence-eng alice",
		"channel_occupied presence-ops", "member_added presence-ops alice"}
	expectPusherEvents(t, recv, added...)
	phone := connect(t, n, "alice", "phone") // a second device: nothing
	_ = v.c.Close()
	_ = phone.c.Close()
	expectPusherEvents(t, recv, append(added, "member_removed presence-eng alice", "channel_vacated presence-eng",
		"member_removed presence-ops alice", "channel_vacated presence-ops")...)
	if n := len(recv.All()); n != 2 {
		t.Fatalf("%d requests, want 2 (one per change)", n)
	}
}

// On Redis, both formats on: member_added then member_removed after the
// grace; then the node holding a user's only connection, and that user's
// member_added undelivered (the receiver refusing it), is killed with
// kill -9: the other node claims the member_added, and its release of
// the connection is one member_removed. The native webhooks of the same
// changes arrive too, each once.
func TestPusherWebhooksOnRedis(t *testing.T) {
	r := redistest.Start(t)
	url := r.URL()
	recv := hooktest.Start(t)
	precv := hooktest.StartPusher(t)
	tm := timing{ttl: 25 * time.Second, heartbeat: 10 * time.Second, grace: time.Second}
	flags := append([]string{"--webhook-url", recv.URL(), "--webhook-secret", hooktest.Secret}, pusherHookFlags(precv)...)
	a := startNode(t, url, "a", tm, flags...)
	a.join("eng", "alice", "carol")

	v := connect(t, a, "alice", "web")
	expectPusherEvents(t, precv, "channel_occupied presence-eng", "member_added presence-eng alice")
	_ = v.c.Close()
	expectPusherEvents(t, precv, "channel_occupied presence-eng", "member_added presence-eng alice",
		"member_removed presence-eng alice", "channel_vacated presence-eng")

	// The Pusher receiver refuses carol's member_added while a, the only
	// node yet, holds it: killed, a leaves it pending, for b to claim.
	var down atomic.Bool
	down.Store(true)
	precv.Answer(func(h hooktest.PusherHook) int {
		if down.Load() && strings.Contains(h.Body, `"user_id":"carol"`) {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	connect(t, a, "carol", "web")
	checkFor(t, 20*time.Second, func() error {
		tries := 0
		for _, h := range precv.All() {
			if strings.Contains(h.Body, `"member_added","channel":"presence-eng","user_id":"carol"`) {
				tries++
			}
		}
		if tries < 2 {
			return fmt.Errorf("%d tries of carol's member_added, want a's retries", tries)
		}
		return nil
	})
	b := startNode(t, url, "b", tm, flags...)
	a.kill()
	down.Store(false)
	// b releases a's connections once a is seen dead, then the grace ends;
	// a's undelivered events, if any, are claimed by b after the claim
	// idle. Once the streams are empty (an entry leaves only when both
	// formats are done with it), nothing more can arrive.
	checkFor(t, 40*time.Second, func() error {
		added, removed := 0, 0
		for _, e := range pusherEvents(precv) {
			switch e {
			case "member_added presence-eng carol":
				added++
			case "member_removed presence-eng carol":
				removed++
			}
		}
		if added == 0 || removed == 0 {
			return fmt.Errorf("carol's member_added or member_removed not delivered yet: %v", pusherEvents(precv))
		}
		for sh := range 32 {
			if n, err := r.Do("XLEN", fmt.Sprintf("gd:{gd%d}:wh", sh)); err != nil || n != "0" {
				return fmt.Errorf("shard %d's webhook stream: XLEN %s (%v)", sh, n, err)
			}
		}
		return nil
	})
	precv.Check(t)
	removed := 0
	for _, e := range pusherEvents(precv) {
		if e == "member_removed presence-eng carol" {
			removed++
		}
	}
	if removed != 1 {
		t.Fatalf("carol's member_removed delivered %d times: %v", removed, pusherEvents(precv))
	}
	// The claimed member_added may arrive after the member_removed b
	// published itself; time_ms, the time of each change, orders them.
	var addedAt, removedAt int64
	for _, h := range precv.Delivered() {
		for _, e := range h.Events {
			if e.UserID == "carol" && e.Name == "member_added" {
				addedAt = h.TimeMs
			}
			if e.UserID == "carol" && e.Name == "member_removed" {
				removedAt = h.TimeMs
			}
		}
	}
	if addedAt >= removedAt {
		t.Fatalf("carol's member_added at time_ms %d, member_removed at %d", addedAt, removedAt)
	}
	if !strings.Contains(b.log.String(), "claimed the events of a consumer gone silent") {
		t.Fatalf("b did not log the claim:\n%s", b.log.String())
	}
	recv.Check(t)
	ids := map[string]bool{}
	per := map[string][]string{}
	for _, h := range recv.Delivered() {
		if !ids[h.ID] { // at least once: a claimed event may come twice, with one id
			ids[h.ID] = true
			per[h.Data.UserID] = append(per[h.Data.UserID], h.Data.PreviousState+">"+h.Data.State)
		}
	}
	for _, u := range []string{"alice", "carol"} {
		if s := strings.Join(per[u], " "); s != "offline>online online>offline" {
			t.Fatalf("%s: native webhooks %q", u, s)
		}
	}
}

// channel_occupied comes with the member_added of a team's first present
// member and channel_vacated with the member_removed of its last, across
// two nodes, on one Redis and on a cluster (where the team's record and the
// users' changes live in different slots); a node killed with -9 vacates
// the teams of its users once.
func TestPusherOccupancyWebhooks(t *testing.T) {
	t.Run("redis", func(t *testing.T) { testPusherOccupancy(t, redistest.Start(t)) })
	t.Run("cluster", func(t *testing.T) { testPusherOccupancy(t, redistest.StartCluster(t, 3).Nodes...) })
}

// webhookStreamsEmpty fails unless every shard's webhook stream is empty
// (on a cluster, asked of each master until one holds the key).
func webhookStreamsEmpty(servers ...*redistest.Server) error {
	for sh := range 32 {
		key := fmt.Sprintf("gd:{gd%d}:wh", sh)
		var n string
		var err error
		for _, r := range servers {
			if n, err = r.Do("XLEN", key); err == nil {
				break
			}
		}
		if err != nil || n != "0" {
			return fmt.Errorf("shard %d's webhook stream: XLEN %s (%v)", sh, n, err)
		}
	}
	return nil
}

func testPusherOccupancy(t *testing.T, servers ...*redistest.Server) {
	redisURL := servers[0].URL()
	recv := hooktest.StartPusher(t)
	tm := timing{ttl: 2 * time.Second, heartbeat: 500 * time.Millisecond, grace: time.Second}
	n1 := startNode(t, redisURL, "o1", tm, pusherHookFlags(recv)...)
	n2 := startNode(t, redisURL, "o2", tm, pusherHookFlags(recv)...)
	n1.join("qa", "alice", "bob")
	n1.join("ops", "carol")

	var want []string
	step := func(more ...string) {
		t.Helper()
		want = append(want, more...)
		expectPusherEvents(t, recv, want...)
	}
	alice := connect(t, n1, "alice", "web")
	step("channel_occupied presence-qa", "member_added presence-qa alice")
	bob := connect(t, n2, "bob", "web")
	step("member_added presence-qa bob")
	_ = alice.c.Close()
	step("member_removed presence-qa alice")
	_ = bob.c.Close()
	step("member_removed presence-qa bob", "channel_vacated presence-qa")

	connect(t, n1, "carol", "web")
	step("channel_occupied presence-ops", "member_added presence-ops carol")
	// Delivered and removed from the queue before the kill, so that no
	// claim of n1's events can send them again (at least once).
	checkFor(t, 20*time.Second, func() error { return webhookStreamsEmpty(servers...) })
	n1.kill()
	step("member_removed presence-ops carol", "channel_vacated presence-ops")
	checkFor(t, 20*time.Second, func() error { return webhookStreamsEmpty(servers...) })
	expectPusherEvents(t, recv, want...)
}
