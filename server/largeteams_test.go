package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/server"
	"github.com/greendot/greendot/store/memstore"
)

// largeAt3 makes a team of more than 3 members large.
func largeAt3(c *server.Config) { c.LargeTeam = 3 }

// stamped is a frame with the time the test read it.
type stamped struct {
	f  frame
	at time.Time
}

// until reads frames until one satisfies stop, and returns them all
// (stop's included), with the time each was read.
func (c *wsClient) until(what string, stop func(frame) bool) []stamped {
	c.t.Helper()
	var out []stamped
	deadline := time.After(10 * time.Second)
	for {
		select {
		case f, ok := <-c.frames:
			if !ok {
				c.t.Fatalf("%s: closed (%v) waiting for %s; got %v", c.name, c.closeStatus(), what, out)
			}
			out = append(out, stamped{f, time.Now()})
			if stop(f) {
				return out
			}
		case <-deadline:
			c.t.Fatalf("%s: no %s within 10s; got %v", c.name, what, out)
		}
	}
}

// hasChange is a stop for until: a presence frame with user=state.
func hasChange(user, state string) func(frame) bool {
	return func(f frame) bool {
		return len(changesOf(f, user)) > 0 && changesOf(f, user)[len(changesOf(f, user))-1] == state
	}
}

// changesOf lists the states of user in a presence frame.
func changesOf(f frame, user string) []string {
	if f.typ() != "presence" {
		return nil
	}
	var out []string
	for _, ch := range f["changes"].([]any) {
		m := ch.(map[string]any)
		if m["user_id"] == user {
			out = append(out, m["state"].(string))
		}
	}
	return out
}

// noChangesOf fails if any of frames carries a change of user.
func noChangesOf(t *testing.T, frames []stamped, users ...string) {
	t.Helper()
	for _, s := range frames {
		for _, u := range users {
			if got := changesOf(s.f, u); len(got) > 0 {
				t.Fatalf("got changes %v of %s, who is not watched: %v", got, u, s.f)
			}
		}
	}
}

// ack sends a heartbeat with an id and waits for its ack: the server has
// handled every frame sent before it (it reads a connection's frames in
// order).
func (c *wsClient) ack(id string) []stamped {
	c.t.Helper()
	c.send(fmt.Sprintf(`{"type":"heartbeat","id":%q}`, id))
	return c.until("heartbeat_ack "+id, func(f frame) bool { return f.typ() == "heartbeat_ack" && f["id"] == id })
}

func countsOf(f frame, team string) (members, online int, ok bool) {
	if f.typ() != "team_counts" {
		return 0, 0, false
	}
	for _, e := range f["teams"].([]any) {
		m := e.(map[string]any)
		if m["team_id"] == team {
			return int(m["member_count"].(float64)), int(m["online_count"].(float64)), true
		}
	}
	return 0, 0, false
}

func hasCounts(team string, members, online int) func(frame) bool {
	return func(f frame) bool {
		m, o, ok := countsOf(f, team)
		return ok && m == members && o == online
	}
}

// A viewer of a large team is sent none of its members in the snapshot
// nor their changes, but those it watches; a teammate of a small team as
// usual. unwatch stops the changes, and so do the subject's and the
// watcher's leaving the team.
func TestLargeTeamWatch(t *testing.T) {
	ts := startServer(t, largeAt3)
	ts.join("big", "v", "a", "b", "c", "d", "s")
	ts.join("small", "v", "s")
	a := ts.dial(t, "a")
	b := ts.dial(t, "b")
	s := ts.dial(t, "s")
	v := ts.dial(t, "v")
	if got := snapshotUsers(v.snap); len(got) != 1 || got["s"] != "online" {
		t.Fatalf("snapshot: %v, want only s, the small team's", got)
	}
	v.until("team_counts", hasCounts("big", 6, 4))

	v.send(map[string]any{"type": "watch", "id": "w1", "user_ids": []string{"a", "c", "zz", "v"}})
	r := v.until("watch_result", func(f frame) bool { return f.typ() == "watch_result" })
	res := r[len(r)-1].f
	if res["id"] != "w1" {
		t.Fatalf("watch_result id: %v", res)
	}
	users := res["users"].([]any)
	want := [][2]string{{"a", "online"}, {"c", "offline"}, {"zz", "unknown"}, {"v", "online"}}
	if len(users) != len(want) {
		t.Fatalf("watch_result: %v", res)
	}
	for i, w := range want {
		m := users[i].(map[string]any)
		if m["user_id"] != w[0] || m["state"] != w[1] {
			t.Fatalf("watch_result entry %d = %v, want %v", i, m, w)
		}
	}
	if _, has := users[2].(map[string]any)["version"]; has {
		t.Fatalf("a non-teammate is only unknown: %v", users[2])
	}

	// b is not watched: its change comes before a's, and must not reach v.
	b.status("away")
	a.status("away")
	noChangesOf(t, v.until("a=away", hasChange("a", "away")), "b")
	c := ts.dial(t, "c")
	noChangesOf(t, v.until("c=online", hasChange("c", "online")), "b")

	// unwatch: nothing more of a.
	v.send(map[string]any{"type": "unwatch", "user_ids": []string{"a"}})
	noChangesOf(t, v.ack("1"), "b")
	a.status("online")
	c.status("away")
	noChangesOf(t, v.until("c=away", hasChange("c", "away")), "a", "b")

	// The subject leaves: nothing more of c, though still watched. s (the
	// small team) is the sentinel.
	ts.leave("big", "c")
	c.status("online")
	s.status("away")
	noChangesOf(t, v.until("s=away", hasChange("s", "away")), "a", "b", "c")

	// The watcher leaves: nothing more of d.
	v.send(map[string]any{"type": "watch", "id": "w2", "user_ids": []string{"d"}})
	v.until("watch_result", func(f frame) bool { return f.typ() == "watch_result" })
	d := ts.dial(t, "d")
	v.until("d=online", hasChange("d", "online"))
	ts.leave("big", "v")
	d.status("away")
	s.status("online")
	noChangesOf(t, v.until("s=online", hasChange("s", "online")), "a", "b", "c", "d")
}

// A viewer who shares a small team with a member of a large one sees them
// as usual, unwatched; a small team is sent whole.
func TestLargeTeamSmallTeamStillSeen(t *testing.T) {
	ts := startServer(t, largeAt3)
	ts.join("big", "v", "a", "b", "c", "d")
	ts.join("small", "v", "a")
	a := ts.dial(t, "a")
	b := ts.dial(t, "b")
	v := ts.dial(t, "v")
	if got := snapshotUsers(v.snap); len(got) != 1 || got["a"] != "online" {
		t.Fatalf("snapshot: %v, want a alone", got)
	}
	b.status("away")
	a.status("away")
	got := v.until("a=away", hasChange("a", "away"))
	noChangesOf(t, got, "b")
	// Watching a teammate of a small team sends its changes once.
	v.send(map[string]any{"type": "watch", "id": 7, "user_ids": []string{"a"}})
	v.until("watch_result", func(f frame) bool { return f.typ() == "watch_result" && f["id"] == float64(7) })
	a.status("online")
	seen := 0
	for _, s := range v.until("a=online", hasChange("a", "online")) {
		seen += len(changesOf(s.f, "a"))
	}
	if seen != 1 {
		t.Fatalf("a's change reached v %d times", seen)
	}
}

// slowTeamStore reads one team's members only once released: the node
// counts that team late.
type slowTeamStore struct {
	*memstore.Store
	team    string
	release chan struct{}
}

func (s *slowTeamStore) Members(ctx context.Context, team string) ([]string, error) {
	if team == s.team {
		select {
		case <-s.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.Store.Members(ctx, team)
}

// The first team_counts holds every large team of the viewer, those the
// node is still counting too: sent with the teams counted so far, the
// others came 2 s later (TestLargeTeamCounts under load).
func TestLargeTeamFirstCountsWaitForEveryTeam(t *testing.T) {
	mem, err := memstore.New(memstore.Config{TTL: testTTL, Grace: testGrace})
	if err != nil {
		t.Fatal(err)
	}
	st := &slowTeamStore{Store: mem, team: "other", release: make(chan struct{})}
	ts := startServer(t, largeAt3, func(c *server.Config) { c.Store = st })
	ts.join("big", "v", "a", "b", "c")
	ts.join("other", "v", "x", "y", "z", "w")
	a := ts.dial(t, "a") // big is counted before v comes
	a.until("team_counts", func(f frame) bool { return f.typ() == "team_counts" })
	// "other" is counted once v comes, and late: released while v waits.
	time.AfterFunc(300*time.Millisecond, func() { close(st.release) })
	v := ts.dial(t, "v")
	got := v.until("team_counts", func(f frame) bool { return f.typ() == "team_counts" })
	f := got[len(got)-1].f
	if _, _, ok := countsOf(f, "other"); !ok {
		t.Fatalf("first team_counts %v, want other's too", f)
	}
	if m, o, _ := countsOf(f, "big"); m != 4 || o != 2 {
		t.Fatalf("big: %d members, %d online; want 4, 2: %v", m, o, f)
	}
}

// team_counts follow the snapshot, then come at most every 2 s while a
// count changes, and say the counts right after the changes.
func TestLargeTeamCounts(t *testing.T) {
	ts := startServer(t, largeAt3)
	ts.join("big", "v", "a", "b", "c")
	ts.join("other", "v", "x", "y", "z", "w")
	v := ts.dial(t, "v")
	first := v.until("team_counts", func(f frame) bool { return f.typ() == "team_counts" })
	f := first[len(first)-1].f
	if len(f["teams"].([]any)) != 2 {
		t.Fatalf("both large teams: %v", f)
	}
	if m, o, _ := countsOf(f, "big"); m != 4 || o != 1 {
		t.Fatalf("big: %d members, %d online; want 4, 1: %v", m, o, f)
	}
	// Changes in quick succession: counts come coalesced, 2 s apart.
	a := ts.dial(t, "a")
	b := ts.dial(t, "b")
	ts.join("big", "e")
	got := v.until("big 5/3", hasCounts("big", 5, 3))
	a.close()
	b.status("away") // away still counts as online
	got = append(got, v.until("big 5/2", hasCounts("big", 5, 2))...)
	ts.leave("big", "e")
	got = append(got, v.until("big 4/2", hasCounts("big", 4, 2))...)
	stamps := []time.Time{first[len(first)-1].at}
	for _, s := range got {
		if s.f.typ() == "team_counts" {
			for _, e := range s.f["teams"].([]any) {
				if e.(map[string]any)["team_id"] != "big" {
					t.Fatalf("only changed teams are sent: %v", s.f)
				}
			}
			stamps = append(stamps, s.at)
		}
	}
	if len(stamps) < 3 {
		t.Fatalf("team_counts frames: %d", len(stamps))
	}
	// The server spaces them 2 s apart; the network may bring one a little
	// late and the next on time.
	for i := 1; i < len(stamps); i++ {
		if gap := stamps[i].Sub(stamps[i-1]); gap < 1900*time.Millisecond {
			t.Fatalf("team_counts %d came %v after the one before", i, gap)
		}
	}
}

// Bad watch frames get bad_request and change nothing; a connection
// watches at most 2000 users; a frame takes at most 500.
func TestWatchLimits(t *testing.T) {
	ts := startServer(t, largeAt3, func(c *server.Config) { c.RateBurst = 1000 })
	ts.join("big", "v", "a", "b", "c")
	a := ts.dial(t, "a")
	v := ts.dialSilent(t, "v")
	v.until("team_counts", func(f frame) bool { return f.typ() == "team_counts" })
	for _, bad := range []string{
		`{"type":"watch","id":"x","user_ids":"a"}`,
		`{"type":"watch","id":"x"}`,
		`{"type":"watch","id":"x","user_ids":["a",""]}`,
		`{"type":"watch","id":"x","user_ids":["a",7]}`,
		`{"type":"watch","id":{},"user_ids":["a"]}`,
		`{"type":"watch","id":"x","user_ids":["a","` + strings.Repeat("x", 129) + `"]}`,
		`{"type":"unwatch","user_ids":"a"}`,
	} {
		v.send(bad)
		v.expectError("bad_request")
	}
	big := append(ids(500), "a")
	v.send(map[string]any{"type": "watch", "id": "x", "user_ids": big})
	v.expectError("bad_request")
	// None of those watched a: its change does not come.
	a.status("away")
	v.send(map[string]any{"type": "query", "id": "q", "user_ids": []string{"a"}})
	noChangesOf(t, v.until("query_result", func(f frame) bool { return f.typ() == "query_result" }), "a")

	// 4 × 500 = 2000 watched; the next new one is refused, a repeat is not.
	for i := range 4 {
		batch := make([]string, 500)
		for j := range batch {
			batch[j] = fmt.Sprintf("u%d-%d", i, j)
		}
		v.send(map[string]any{"type": "watch", "id": i, "user_ids": batch})
		r := v.next("watch_result")
		if len(r["users"].([]any)) != 500 {
			t.Fatalf("watch_result of 500: %d", len(r["users"].([]any)))
		}
	}
	v.send(map[string]any{"type": "watch", "id": "over", "user_ids": []string{"a"}})
	v.expectError("bad_request")
	v.send(map[string]any{"type": "watch", "id": "again", "user_ids": []string{"u0-0", "u3-499"}})
	v.next("watch_result")
	// Refused, so a is not watched.
	a.status("online")
	v.send(map[string]any{"type": "query", "id": "q", "user_ids": []string{"a"}})
	noChangesOf(t, v.until("query_result", func(f frame) bool { return f.typ() == "query_result" }), "a")
	// Unwatching frees room.
	v.send(map[string]any{"type": "unwatch", "user_ids": []string{"u0-0"}})
	v.send(map[string]any{"type": "watch", "id": "room", "user_ids": []string{"a"}})
	v.next("watch_result")
	a.status("away")
	v.until("a=away", hasChange("a", "away"))
}

// A watch costs one rate token per 10 ids, as a query.
func TestWatchCostsOneTokenPerTenIDs(t *testing.T) {
	ts := startServer(t, frozen, func(c *server.Config) { c.RateBurst = 60 })
	c := ts.dialSilent(t, "alice")
	c.send(map[string]any{"type": "watch", "id": "w", "user_ids": ids(500)})
	c.next("watch_result") // 50 tokens: 10 left
	c.send(map[string]any{"type": "watch", "id": "w", "user_ids": ids(200)})
	c.expectError("rate_limited") // 20 wanted: the first token spent, 9 left
	c.send(map[string]any{"type": "watch", "id": "w", "user_ids": ids(90)})
	c.next("watch_result") // 9: none left
	c.send(map[string]any{"type": "watch", "id": "w", "user_ids": ids(1)})
	c.expectError("rate_limited")
}

// A viewer who joins a large team while connected gets its counts and the
// changes of whom it watched before; a watched user who leaves and joins
// again is sent at the join, and their changes resume.
func TestLargeTeamJoinedLater(t *testing.T) {
	ts := startServer(t, largeAt3)
	ts.join("big", "a", "b", "c", "d")
	ts.join("small", "v", "s")
	a := ts.dial(t, "a")
	s := ts.dial(t, "s")
	v := ts.dial(t, "v")
	v.send(map[string]any{"type": "watch", "id": "w", "user_ids": []string{"a"}})
	r := v.until("watch_result", func(f frame) bool { return f.typ() == "watch_result" })
	if st := r[len(r)-1].f["users"].([]any)[0].(map[string]any)["state"]; st != "unknown" {
		t.Fatalf("a shares no team with v yet: %v", st)
	}
	ts.join("big", "v")
	v.until("team_counts", hasCounts("big", 5, 2)) // a and v online
	// The watch made before holds: a's changes come now.
	a.status("away")
	v.until("a=away", hasChange("a", "away"))

	ts.leave("big", "a")
	a.status("online")
	s.status("away")
	noChangesOf(t, v.until("s=away", hasChange("s", "away")), "a")
	ts.join("big", "a") // a's state comes with the join
	v.until("a=online", hasChange("a", "online"))
	a.status("away")
	v.until("a=away", hasChange("a", "away"))
}
