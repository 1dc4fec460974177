package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/greendot/greendot/store/redisstore/redistest"
)

// Large teams (DESIGN.md Part 1b, "Watching users in large teams") across
// two nodes on Redis, over real WebSockets.

// untilFrame reads frames until stop holds for one, and returns them all.
func (u *wsUser) untilFrame(what string, stop func(map[string]any) bool) []map[string]any {
	u.t.Helper()
	var out []map[string]any
	deadline := time.After(15 * time.Second)
	for {
		select {
		case f, ok := <-u.frames:
			if !ok {
				u.t.Fatalf("%s: closed waiting for %s; got %v", u.name, what, out)
			}
			out = append(out, f)
			if stop(f) {
				return out
			}
		case <-deadline:
			u.t.Fatalf("%s: no %s within 15s; got %v", u.name, what, out)
		}
	}
}

// statesOf lists the states of user in the presence frames of fs.
func statesOf(fs []map[string]any, user string) []string {
	var out []string
	for _, f := range fs {
		if f["type"] != "presence" {
			continue
		}
		for _, ch := range f["changes"].([]any) {
			if m := ch.(map[string]any); m["user_id"] == user {
				out = append(out, m["state"].(string))
			}
		}
	}
	return out
}

func changed(user, state string) func(map[string]any) bool {
	return func(f map[string]any) bool {
		got := statesOf([]map[string]any{f}, user)
		return len(got) > 0 && got[len(got)-1] == state
	}
}

func counted(team string, members, online int) func(map[string]any) bool {
	return func(f map[string]any) bool {
		if f["type"] != "team_counts" {
			return false
		}
		for _, e := range f["teams"].([]any) {
			m := e.(map[string]any)
			if m["team_id"] == team && num(m["member_count"]) == int64(members) && num(m["online_count"]) == int64(online) {
				return true
			}
		}
		return false
	}
}

func mustNotSee(t *testing.T, fs []map[string]any, users ...string) {
	t.Helper()
	for _, u := range users {
		if got := statesOf(fs, u); len(got) > 0 {
			t.Fatalf("got %v of %s, not watched: %v", got, u, fs)
		}
	}
}

// published waits until the store holds user in state: its change is
// published then, on the team channels, before any change sent after.
func published(t *testing.T, n *node, user, state string) {
	t.Helper()
	checkFor(t, 10*time.Second, func() error {
		if got := n.presence(user)["state"]; got != state {
			return fmt.Errorf("%s is %v, want %s", user, got, state)
		}
		return nil
	})
}

func TestLargeTeamAcrossNodes(t *testing.T) {
	r := redistest.Start(t)
	a := startNode(t, r.URL(), "a", statusTiming, "--large-team", "3")
	b := startNode(t, r.URL(), "b", statusTiming, "--large-team", "3")
	a.join("big", "v", "p", "q", "r", "s")
	a.join("small", "v", "s")
	p := dialWS(t, a, "p", "web")
	q := dialWS(t, b, "q", "web")
	s := dialWS(t, b, "s", "web")
	v := dialWS(t, a, "v", "web")
	if users := v.snap["users"].([]any); len(users) != 1 || users[0].(map[string]any)["user_id"] != "s" {
		t.Fatalf("snapshot %v, want s alone (the small team)", v.snap)
	}
	v.untilFrame("team_counts 5/4", counted("big", 5, 4))

	v.send(map[string]any{"type": "watch", "id": "w", "user_ids": []string{"q", "r", "zz"}})
	res := v.untilFrame("watch_result", func(f map[string]any) bool { return f["type"] == "watch_result" })
	users := res[len(res)-1]["users"].([]any)
	for i, w := range []string{"q=online", "r=offline", "zz=unknown"} {
		m := users[i].(map[string]any)
		if got := fmt.Sprintf("%s=%s", m["user_id"], m["state"]); got != w {
			t.Fatalf("watch_result %d = %s, want %s", i, got, w)
		}
	}

	// p (unwatched, on v's node) changes first; q (watched, other node) next.
	p.send(map[string]string{"type": "status", "state": "away"})
	published(t, a, "p", "away")
	q.send(map[string]string{"type": "status", "state": "away"})
	mustNotSee(t, v.untilFrame("q=away", changed("q", "away")), "p")
	rr := dialWS(t, b, "r", "web")
	mustNotSee(t, v.untilFrame("r=online", changed("r", "online")), "p")

	// unwatch q: an acked heartbeat says the node has it.
	v.send(map[string]any{"type": "unwatch", "user_ids": []string{"q"}})
	v.send(map[string]any{"type": "heartbeat", "id": "u"})
	v.untilFrame("heartbeat_ack", func(f map[string]any) bool { return f["type"] == "heartbeat_ack" })
	q.send(map[string]string{"type": "status", "state": "online"})
	published(t, a, "q", "online")
	rr.send(map[string]string{"type": "status", "state": "away"})
	mustNotSee(t, v.untilFrame("r=away", changed("r", "away")), "p", "q")

	// r leaves: nothing more of r; s, of the small team too, is seen once.
	if code, body := a.do("DELETE", "/v1/teams/big/members/r"); code != 204 {
		t.Fatalf("leave: %d %s", code, body)
	}
	rr.send(map[string]string{"type": "status", "state": "online"})
	published(t, a, "r", "online")
	s.send(map[string]string{"type": "status", "state": "away"})
	got := v.untilFrame("s=away", changed("s", "away"))
	mustNotSee(t, got, "p", "q", "r")
	if n := len(statesOf(got, "s")); n != 1 {
		t.Fatalf("s's change came %d times: %v", n, got)
	}
	// The counts follow: 4 members; p away counts, r is gone.
	v.untilFrame("team_counts 4/4", counted("big", 4, 4))

	// v leaves: nothing more of q, though watched and though v's node
	// still hears the team for p.
	v.send(map[string]any{"type": "watch", "id": "w2", "user_ids": []string{"q"}})
	v.untilFrame("watch_result", func(f map[string]any) bool { return f["type"] == "watch_result" })
	if code, body := a.do("DELETE", "/v1/teams/big/members/v"); code != 204 {
		t.Fatalf("leave: %d %s", code, body)
	}
	// v's node has applied the leave once a query of q answers unknown
	// (it checks with the node's index, which routing uses).
	for i := 0; ; i++ {
		v.send(map[string]any{"type": "query", "id": i, "user_ids": []string{"q"}})
		fs := v.untilFrame("query_result", func(f map[string]any) bool { return f["type"] == "query_result" })
		if fs[len(fs)-1]["users"].([]any)[0].(map[string]any)["state"] == "unknown" {
			break
		}
		if i == 100 {
			t.Fatalf("v still sees q after leaving: %v", fs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	q.send(map[string]string{"type": "status", "state": "away"})
	published(t, a, "q", "away")
	s.send(map[string]string{"type": "status", "state": "online"})
	mustNotSee(t, v.untilFrame("s=online", changed("s", "online")), "p", "q", "r")
}

// Through a Redis outage: a watched user who leaves meanwhile is seen
// offline by its watcher afterwards, the team's counts follow, and nothing
// of the unwatched members comes.
func TestLargeTeamThroughRedisOutage(t *testing.T) {
	short := timing{ttl: 2 * time.Second, heartbeat: 500 * time.Millisecond, grace: 500 * time.Millisecond}
	r := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	a := startNode(t, r.URL(), "a", short, "--large-team", "3")
	b := startNode(t, r.URL(), "b", short, "--large-team", "3")
	a.join("big", "v", "p", "q", "x")
	dialWS(t, b, "p", "web")
	q := dialWS(t, b, "q", "web")
	v := dialWS(t, a, "v", "web")
	v.untilFrame("team_counts 4/3", counted("big", 4, 3))
	v.send(map[string]any{"type": "watch", "id": "w", "user_ids": []string{"q"}})
	v.untilFrame("watch_result", func(f map[string]any) bool { return f["type"] == "watch_result" })

	r.Stop()
	checkFor(t, 3*time.Second, func() error {
		if code, _ := a.get("/readyz"); code != 503 {
			return fmt.Errorf("a ready with Redis down")
		}
		return nil
	})
	q.close()
	r.Restart()
	got := v.untilFrame("q=offline", changed("q", "offline"))
	mustNotSee(t, got, "p", "x")
	got = v.untilFrame("team_counts 4/2", counted("big", 4, 2))
	mustNotSee(t, got, "p", "x")
	checkFor(t, 10*time.Second, func() error {
		if m := metric(a, "greendot_resyncs_total"); m == "" || m == "0" {
			return fmt.Errorf("a has not resynced yet")
		}
		return nil
	})
	// After the resync the watch holds: q coming back is sent, p and x are not.
	dialWS(t, b, "q", "web")
	got = v.untilFrame("q=online", changed("q", "online"))
	mustNotSee(t, got, "p", "x")
}
