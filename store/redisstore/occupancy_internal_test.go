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

// The record catches up with the truth when an event would take a team
// across zero: members present before the event, whose events it never saw
// (a full queue dropped them, Redis lost the record), count; members whose
// present state is newer than the event are left to their own events.
func TestOccupancyCatchesUpWithTheTruth(t *testing.T) {
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", 10*time.Second, 0)
	ctx := context.Background()
	for _, u := range []string{"ann", "bob", "cid"} {
		must(t, s.AddMember(ctx, "eng", u))
	}
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	p, err := s.Presence(ctx, []string{"bob"})
	must(t, err)
	bobV := p[0].Version
	if p[0].State != presence.Online || bobV == 0 {
		t.Fatalf("bob: %+v, want online", p[0])
	}
	// ann arrives after bob, whose event the record never got: not the
	// first member present.
	expectOcc(t, occ(t, s, "ann", true, bobV+10, "eng"), "[]")
	// ann leaves: bob is still present, so the team is not vacated.
	expectOcc(t, occ(t, s, "ann", false, bobV+20, "eng"), "[]")
	// On another team, cid's event is older than bob's state: bob came
	// after cid, so cid's arrival occupies the team.
	must(t, s.AddMember(ctx, "ops", "cid"))
	must(t, s.AddMember(ctx, "ops", "bob"))
	expectOcc(t, occ(t, s, "cid", true, bobV-10, "ops"), "[+ops]")
	if n, err := r.Do("HGET", teamOccKey("ops"), "n"); err != nil || n != "1" {
		t.Fatalf("ops counts %s present (%v), want cid alone until bob's own event", n, err)
	}
}

// A present member removed from a team leaves its count at once, and the
// member's older events, delivered after the removal, do not count them
// again; a re-added member counts from their next event.
func TestOccupancyFollowsRemovals(t *testing.T) {
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", time.Second, 0)
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
}
