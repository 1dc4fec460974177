package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/redisstore"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// A viewer connecting as Redis loses its data: its teams are read before
// the FLUSHALL, their members after it (none), so the snapshot has nobody's
// state to read, and no read to check. It must be refused, not sent empty:
// the viewer would take every teammate for offline.
// lossServer is a socketless server on its own store on topo ("redis" or
// "cluster"), with a hold-off longer than any test: a loss that flush
// makes stays marked.
func lossServer(t *testing.T, topo string) (*Server, *redisstore.Store, func()) {
	t.Helper()
	url, flush := redistest.StartTopology(t, topo)
	rs, err := redisstore.New(context.Background(), redisstore.Config{URL: url, Node: "n1", TTL: time.Minute, HoldOff: time.Minute,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Close() })
	s := socketlessServer()
	s.cfg.NodeID = "n1"
	s.store = rs
	s.hub = newHub(s)
	return s, rs, flush
}

func TestSnapshotWithItsMembersLostIsRefused(t *testing.T) {
	for _, topo := range []string{"redis", "cluster"} {
		t.Run(topo, func(t *testing.T) {
			ctx := context.Background()
			s, rs, flush := lossServer(t, topo)
			for _, u := range []string{"viewer", "bob"} {
				if err := rs.AddMember(ctx, "t", u); err != nil {
					t.Fatal(err)
				}
			}
			if err := rs.Connect(ctx, presence.Conn{ID: "cb", UserID: "bob", Device: "web"}); err != nil {
				t.Fatal(err)
			}

			// The connect's reads, as ws.go runs them, with the FLUSHALL
			// between the viewer's teams and their members.
			c := &client{srv: s, id: "cv", user: "viewer", device: "web"}
			c.closed.Store(true) // no socket
			teams, err := s.hub.add(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			flush()
			small := s.hub.smallTeams(teams)
			registered, reads, err := s.register(ctx, c, small)
			if !registered || err != nil {
				t.Fatalf("register: %v %v", registered, err)
			}
			snap, members, err := s.snapshot(ctx, c.user, small, reads.members)
			switch {
			case errors.Is(err, store.ErrRecovering):
				return
			case err != nil:
				t.Fatal(err)
			}
			for _, p := range snap {
				if p.UserID == "bob" && p.State == presence.Online {
					return
				}
			}
			t.Fatalf("the snapshot %v (members %v) came without an error: it shows bob, live, offline", snap, members)
		})
	}
}
