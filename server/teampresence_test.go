package server_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// teamPresence is the body of GET /v1/teams/{team}/presence.
type teamPresence struct {
	TeamID      string `json:"team_id"`
	MemberCount int    `json:"member_count"`
	Online      []struct {
		UserID  string `json:"user_id"`
		State   string `json:"state"`
		Version uint64 `json:"version"`
	} `json:"online"`
	Offline []struct {
		UserID   string `json:"user_id"`
		Version  uint64 `json:"version"`
		LastSeen *int64 `json:"last_seen"`
	} `json:"offline"`
}

func (ts *testServer) teamPresence(team string) (teamPresence, string) {
	ts.t.Helper()
	code, body := ts.do("GET", "/v1/teams/"+team+"/presence", "")
	var tp teamPresence
	if err := json.Unmarshal([]byte(body), &tp); err != nil || code != 200 {
		ts.t.Fatalf("team %s: %d %s (%v)", team, code, body, err)
	}
	return tp, body
}

// The team route names its offline members too: one seen, with the time it
// was last live, and one never seen, with a null last_seen.
func TestTeamPresenceListsOfflineMembers(t *testing.T) {
	ts := startServer(t)
	// Joined out of order: both lists come sorted by user id.
	ts.join("t1", "zed", "dave", "bob", "alice", "carol")

	tp, body := ts.teamPresence("t1")
	if tp.MemberCount != 5 || len(tp.Online) != 0 || len(tp.Offline) != 5 {
		t.Fatalf("nobody seen yet: %s", body)
	}
	for _, m := range tp.Offline {
		if m.LastSeen != nil || m.Version != 0 {
			t.Fatalf("never seen %s: %s", m.UserID, body)
		}
	}
	if !strings.Contains(body, `{"user_id":"carol","version":0,"last_seen":null}`) {
		t.Fatalf("a member never seen is written with a null last_seen: %s", body)
	}

	ts.dial(t, "alice")
	ts.dial(t, "zed").status("away")
	before := time.Now().UnixMilli()
	bob := ts.dial(t, "bob", "ios")
	// A clean close: bob's last sign of life is the close itself.
	if err := bob.conn.Close(websocket.StatusNormalClosure, "bye"); err != nil {
		t.Fatalf("bob close: %v", err)
	}
	closed := time.Now().UnixMilli()

	// bob goes offline once the grace is over; zed's away lands on its own.
	checkFor(t, 5*time.Second, func() error {
		tp, body = ts.teamPresence("t1")
		if len(tp.Offline) != 3 || len(tp.Online) != 2 || tp.Online[1].State != "away" {
			return errorf("want alice online, zed away, bob offline: %s", body)
		}
		return nil
	})
	if tp.TeamID != "t1" || tp.MemberCount != 5 {
		t.Fatalf("team = %s", body)
	}
	if tp.Online[0].UserID != "alice" || tp.Online[0].State != "online" || tp.Online[1].UserID != "zed" {
		t.Fatalf("online, sorted: %s", body)
	}
	var ids []string
	for _, m := range tp.Offline {
		ids = append(ids, m.UserID)
	}
	if strings.Join(ids, ",") != "bob,carol,dave" {
		t.Fatalf("offline = %v, want bob,carol,dave (sorted): %s", ids, body)
	}
	b := tp.Offline[0]
	if b.LastSeen == nil || *b.LastSeen < before || *b.LastSeen > closed+1000 {
		t.Fatalf("bob's last_seen %v, want between %d and about %d: %s", b.LastSeen, before, closed, body)
	}
	if b.Version == 0 {
		t.Fatalf("bob was seen: his version is not 0: %s", body)
	}
	for _, m := range tp.Offline[1:] {
		if m.LastSeen != nil || m.Version != 0 {
			t.Fatalf("%s was never seen: %s", m.UserID, body)
		}
	}

	// The same last_seen and version as the user route gives.
	p := ts.presenceOf("bob")
	if p["last_seen"] != float64(*b.LastSeen) || p["version"] != float64(b.Version) {
		t.Fatalf("user route says %v, team route %+v", p, b)
	}

	// An unknown team still has the empty lists, not null.
	if _, body := ts.teamPresence("none"); strings.TrimSpace(body) != `{"team_id":"none","member_count":0,"online":[],"offline":[]}` {
		t.Fatalf("unknown team: %s", body)
	}
}
