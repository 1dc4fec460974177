package server

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/greendot/greendot/presence"
)

// A crowd's first read names the team's other connections as holding
// nothing of the subject (TestCrowdConnectingAtOnceLeavesViewsAgreed). These
// are the connections that never note it, which must not be named, or the
// view stays mixed for good.

// Members who are online already (elsewhere, or in their grace) and connect
// to a node at once, as when a node drains onto this one: each is a subject
// the other's snapshot reads, and a user's own connections never note
// themselves.
func TestCrowdOfSubjectsLeavesViewsAgreed(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		h, st, _, _ := catchUpHub(t, kind, [][2]string{{"t", "a"}, {"t", "b"}, {"t", "c"}})
		for _, u := range []string{"a", "b", "c"} {
			online(t, st, u)
		}
		var notes []func()
		for _, u := range []string{"a", "b", "c"} {
			c, teams := addLocal(t, h, u)
			notes = append(notes, func() {
				// As a connect reads it: the user's own presence left out.
				members, ps := readSnapshot(t, st, teams)
				ps = slices.DeleteFunc(ps, func(p presence.Presence) bool { return p.UserID == u })
				h.noteSnapshot(c, members, ps)
			})
		}
		for _, note := range notes {
			note()
		}
		for _, u := range []string{"a", "b", "c"} {
			if cur, _ := h.views.get("t", u); cur.odd != nil || cur.look.State != presence.Online {
				t.Errorf("t's view of %s = %+v, want online and agreed", u, cur)
			}
		}
	})
}

// A Pusher socket's connection is never noted (it is sent every change): it
// must not be named either.
func TestCrowdLeavesPusherSocketsUnnamed(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		h, st, _, _ := catchUpHub(t, kind, [][2]string{{"t", "a"}, {"t", "p"}, {"t", "away"}})
		online(t, st, "away")
		px := &client{srv: h.srv, user: "p", px: &pxConn{}}
		px.closed.Store(true)
		if _, err := h.add(context.Background(), px); err != nil {
			t.Fatal(err)
		}
		_, note := connectLocal(t, h, st, "a")
		note()
		if cur, _ := h.views.get("t", "away"); cur.odd != nil {
			t.Errorf("t's view of away = %+v with a Pusher socket indexed, want agreed", cur)
		}
	})
}

// A connection closed before its snapshot was noted is dropped from the
// odds that named it.
func TestCrowdForgetsAConnectionClosedBeforeItsNote(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		h, st, _, _ := catchUpHub(t, kind, [][2]string{{"t", "a"}, {"t", "b"}, {"t", "away"}})
		online(t, st, "away")
		_, noteA := connectLocal(t, h, st, "a")
		b, _ := connectLocal(t, h, st, "b")
		noteA()
		if cur, _ := h.views.get("t", "away"); cur.odd == nil {
			t.Fatalf("t's view of away = %+v before b is noted, want b named", cur)
		}
		h.remove(b)
		if cur, _ := h.views.get("t", "away"); cur.odd != nil {
			t.Errorf("t's view of away = %+v after b closed unnoted, want agreed", cur)
		}
	})
}

// Past maxOdds others, a crowd's first read names none of them (the odds
// would be unknown, and the reader sent again what it read): it records the
// reader's read, as when the others were not known.
func TestCrowdPastMaxOddsKeepsTheReadersHold(t *testing.T) {
	eachSharedStore(t, func(t *testing.T, kind string) {
		members := [][2]string{{"t", "r"}, {"t", "away"}}
		for i := range maxOdds + 1 {
			members = append(members, [2]string{"t", fmt.Sprintf("m%02d", i)})
		}
		h, st, _, _ := catchUpHub(t, kind, members)
		v := online(t, st, "away")
		for i := range maxOdds + 1 {
			addLocal(t, h, fmt.Sprintf("m%02d", i))
		}
		r, note := connectLocal(t, h, st, "r")
		note()
		cur, _ := h.views.get("t", "away")
		if cur.odd == nil || cur.odd.all {
			t.Fatalf("t's view of away = %+v, want mixed with the reader named", cur)
		}
		if hd, ok := h.views.heldBy("t", "away", r); !ok || hd.version != v || hd.look.State != presence.Online {
			t.Errorf("the reader holds %+v (known %v), want away online at v%d", hd, ok, v)
		}
	})
}
