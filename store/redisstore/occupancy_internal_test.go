package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store/redisstore/redistest"
	"github.com/greendot/greendot/webhook"
)

// occ prepares a member event of user in teams at version v on s, and
// returns what it occupies and vacates as "+team"/"-team".
func occ(t *testing.T, s *Store, user string, joins bool, v uint64, teams ...string) string {
	t.Helper()
	ev := &webhook.Event{UserID: user, Version: v, Teams: teams, State: presence.Online, Previous: presence.Offline}
	if !joins {
		ev.State, ev.Previous = presence.Offline, presence.Online
	}
	if err := s.occupancy(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, x := range ev.Occupied {
		out = append(out, "+"+x)
	}
	for _, x := range ev.Vacated {
		out = append(out, "-"+x)
	}
	return fmt.Sprint(out)
}

func expectOcc(t *testing.T, got, want string) {
	t.Helper()
	if got != want {
		t.Fatalf("occupancy %s, want %s", got, want)
	}
}

// The first member present occupies a team, the last one gone vacates it;
// the same event asked again (a retry, or a node claiming it) gets the same
// answer, from either node, and an overtaken one changes nothing.
func TestOccupancyCountsMemberEvents(t *testing.T) {
	r := redistest.Start(t)
	a, _ := mk(t, r.URL(), "a", time.Second, 0)
	b, _ := mk(t, r.URL(), "b", time.Second, 0)
	ctx := context.Background()
	for _, u := range []string{"ann", "bob"} {
		must(t, a.AddMember(ctx, "eng", u))
	}
	must(t, a.AddMember(ctx, "ops", "ann"))

	expectOcc(t, occ(t, a, "ann", true, 10, "eng", "ops"), "[+eng +ops]")
	expectOcc(t, occ(t, b, "ann", true, 10, "eng", "ops"), "[+eng +ops]") // claimed by b
	expectOcc(t, occ(t, a, "bob", true, 20, "eng"), "[]")
	expectOcc(t, occ(t, a, "ann", false, 30, "eng", "ops"), "[-ops]")
	expectOcc(t, occ(t, a, "ann", true, 5, "eng", "ops"), "[]") // older than the removal
	expectOcc(t, occ(t, b, "bob", false, 40, "eng"), "[-eng]")
	expectOcc(t, occ(t, a, "bob", false, 40, "eng"), "[-eng]") // a retry
	// The first answer of an event that later ones overtook stays its own:
	// a node that held ann's join and died has it claimed after her leave.
	expectOcc(t, occ(t, b, "ann", true, 10, "eng", "ops"), "[+eng +ops]")
	expectOcc(t, occ(t, a, "bob", true, 50, "eng"), "[+eng]")
}

// occNode is a store with Pusher webhooks on, whose removals keep the
// teams' occupancy records right.
func occNode(t *testing.T, r *redistest.Server, name string) *Store {
	t.Helper()
	s, _ := mkWith(t, Config{URL: r.URL(), Node: name, TTL: 10 * time.Second,
		NodeTTL: 600 * time.Millisecond, HoldOff: 300 * time.Millisecond,
		WebhookQueue: 100, WebhookGroups: []string{PusherWebhookGroup}})
	return s
}

// Joins are counted as told: the first one the record gets occupies the
// team, even when an older one of another member comes after it (events
// of two users are prepared in any order), and then that one does not.
// A leave that would vacate the team is checked against the truth first:
// a member present before it whose events the record never saw (a full
// queue dropped them, Redis lost the record, or it was made after they
// came) keeps the team occupied.
func TestOccupancyCatchesUpWithTheTruth(t *testing.T) {
	r := redistest.Start(t)
	s := occNode(t, r, "a")
	ctx := context.Background()
	for _, u := range []string{"ann", "bob", "cid", "dan"} {
		must(t, s.AddMember(ctx, "eng", u))
	}
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	p, err := s.Presence(ctx, []string{"bob"})
	must(t, err)
	bobV := p[0].Version
	if p[0].State != presence.Online || bobV == 0 {
		t.Fatalf("bob: %+v, want online", p[0])
	}
	// bob's join never reaches the record; ann's does, and is the first.
	expectOcc(t, occ(t, s, "ann", true, bobV+10, "eng"), "[+eng]")
	// ann leaves: bob, present since before, keeps the team occupied.
	expectOcc(t, occ(t, s, "ann", false, bobV+20, "eng"), "[]")
	// bob's own join, late: counted by the check already.
	expectOcc(t, occ(t, s, "bob", true, bobV, "eng"), "[]")

	// Two joins prepared newest first: one channel_occupied all the same.
	for _, u := range []string{"cid", "dan"} {
		must(t, s.AddMember(ctx, "ops", u))
	}
	expectOcc(t, occ(t, s, "dan", true, 20, "ops"), "[+ops]")
	expectOcc(t, occ(t, s, "cid", true, 10, "ops"), "[]")
	expectOcc(t, occ(t, s, "cid", false, 30, "ops"), "[]")
	expectOcc(t, occ(t, s, "dan", false, 40, "ops"), "[-ops]")

	// A user counted who is no longer a member (a removal the record
	// missed) does not keep the team occupied past the check.
	must(t, s.AddMember(ctx, "qa", "ann"))
	expectOcc(t, occ(t, s, "ann", true, 50, "qa"), "[+qa]")
	if _, err := r.Do("HSET", teamOccKey("qa"), "u:ghost", "45:1", "n", "2"); err != nil {
		t.Fatal(err)
	}
	expectOcc(t, occ(t, s, "ann", false, 60, "qa"), "[-qa]")
}

// A present member removed from a team leaves its count at once, and the
// member's older events, delivered after the removal, do not count them
// again; a re-added member counts from their next event. A leave published
// before the removal, delivered after it, still vacates the team it left
// empty.
func TestOccupancyFollowsRemovals(t *testing.T) {
	r := redistest.Start(t)
	s := occNode(t, r, "a")
	ctx := context.Background()
	must(t, s.AddMember(ctx, "eng", "ann"))
	must(t, s.AddMember(ctx, "eng", "bob"))
	now := uint64(time.Now().UnixMicro())
	expectOcc(t, occ(t, s, "ann", true, now, "eng"), "[+eng]")
	must(t, s.RemoveMember(ctx, "eng", "ann"))
	if n, err := r.Do("HGET", teamOccKey("eng"), "n"); err != nil || n != "0" {
		t.Fatalf("eng counts %s present after ann's removal (%v), want 0", n, err)
	}
	// bob's join, published before the removal and delivered after it.
	expectOcc(t, occ(t, s, "bob", true, now+1, "eng"), "[+eng]")
	expectOcc(t, occ(t, s, "ann", true, now+2, "eng"), "[]") // before the removal: not counted
	must(t, s.AddMember(ctx, "eng", "ann"))
	expectOcc(t, occ(t, s, "bob", false, uint64(time.Now().UnixMicro())+10, "eng"), "[-eng]")
	if n, err := r.Do("HGET", teamOccKey("eng"), "n"); err != nil || n != "0" {
		t.Fatalf("eng counts %s present (%v), want 0", n, err)
	}

	// carol leaves, and is removed before her leave is delivered.
	must(t, s.AddMember(ctx, "qa", "carol"))
	now = uint64(time.Now().UnixMicro())
	expectOcc(t, occ(t, s, "carol", true, now-2000, "qa"), "[+qa]")
	must(t, s.RemoveMember(ctx, "qa", "carol"))
	expectOcc(t, occ(t, s, "carol", false, now-1000, "qa"), "[-qa]")
	expectOcc(t, occ(t, s, "carol", false, now-1000, "qa"), "[-qa]") // a retry
}

// Without Pusher webhooks, removals leave no occupancy record behind.
func TestNoOccupancyRecordWithoutPusherWebhooks(t *testing.T) {
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", time.Second, 0)
	ctx := context.Background()
	must(t, s.AddMember(ctx, "eng", "ann"))
	must(t, s.RemoveMember(ctx, "eng", "ann"))
	if n, err := r.Do("EXISTS", teamOccKey("eng")); err != nil || n != "0" {
		t.Fatalf("EXISTS %s = %s (%v), want 0", teamOccKey("eng"), n, err)
	}
}
