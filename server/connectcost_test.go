package server_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/server"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/redisstore"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// readCounted is the Redis store with the calls that cost the connect path
// a round trip recorded, by name.
type readCounted struct {
	*redisstore.Store
	mu    sync.Mutex
	calls []string
}

func (s *readCounted) note(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, name)
}

func (s *readCounted) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.calls
	s.calls = nil
	return out
}

func (s *readCounted) TeamsOf(ctx context.Context, user string) ([]string, error) {
	s.note("TeamsOf")
	return s.Store.TeamsOf(ctx, user)
}

func (s *readCounted) Connect(ctx context.Context, c presence.Conn) error {
	s.note("Connect")
	return s.Store.Connect(ctx, c)
}

func (s *readCounted) ConnectRead(ctx context.Context, c presence.Conn, teams []string) (store.ConnectReads, bool, error) {
	s.note("ConnectRead")
	return s.Store.ConnectRead(ctx, c, teams)
}

func (s *readCounted) Presence(ctx context.Context, users []string) ([]presence.Presence, error) {
	s.note("Presence")
	return s.Store.Presence(ctx, users)
}

func (s *readCounted) Members(ctx context.Context, team string) ([]string, error) {
	s.note("Members")
	return s.Store.Members(ctx, team)
}

func (s *readCounted) MembersOfMany(ctx context.Context, teams []string) ([][]string, error) {
	s.note("MembersOfMany")
	return s.Store.MembersOfMany(ctx, teams)
}

func (s *readCounted) MemberCount(ctx context.Context, team string) (int, error) {
	s.note("MemberCount")
	return s.Store.MemberCount(ctx, team)
}

func (s *readCounted) WholeStates(ctx context.Context, users []string) ([]presence.Presence, error) {
	s.note("WholeStates")
	return s.Store.WholeStates(ctx, users)
}

type nopHandler struct{}

func (nopHandler) OnPresence(store.PresenceEvent)     {}
func (nopHandler) OnMembership(store.MembershipEvent) {}

// A connect on Redis of a user whose teams this node watches already reads
// their teams, registers the connection with its own status and the teams'
// members in one pipeline, and reads the members' states: three store
// calls, one round trip each (and one more to publish the online). It was
// five: Connect, Presence and Members one after the other.
func TestRedisConnectStoreCalls(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	open := func(node string) *redisstore.Store {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		rs, err := redisstore.New(sctx, redisstore.Config{URL: r.URL(), Node: node, TTL: testTTL, Grace: testGrace,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rs.Close() })
		return rs
	}
	// Written by another node, closed before this one starts: no membership
	// event reaches this node to read the store while connects are counted.
	seed := open("seed")
	seed.Subscribe(nopHandler{})
	for _, m := range [][2]string{{"t1", "alice"}, {"t1", "bob"}, {"t1", "carol"}, {"t2", "alice"}, {"t2", "dave"}} {
		if err := seed.AddMember(ctx, m[0], m[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := seed.SetUserStatus(ctx, "alice", presence.Status{Mode: presence.ModeDND, Text: "focus"}); err != nil {
		t.Fatal(err)
	}
	if err := seed.Close(); err != nil {
		t.Fatal(err)
	}
	rs := open("test")
	cs := &readCounted{Store: rs}
	ts := startServer(t, func(c *server.Config) { c.Store = cs })
	ts.dial(t, "bob")
	ts.dial(t, "dave")
	cs.take()

	alice, my := ts.dialStatus(t, "alice")
	if got := cs.take(); len(got) != 3 {
		t.Fatalf("store calls for one connect: %q, want TeamsOf, ConnectRead, WholeStates", got)
	}
	if m := my; m == nil || m["mode"] != "dnd" || m["text"] != "focus" {
		t.Fatalf("my_status %v, want dnd \"focus\"", m)
	}
	if got := snapshotUsers(alice.snap); len(got) != 2 || got["bob"] != "online" || got["dave"] != "online" {
		t.Fatalf("snapshot %v, want bob and dave online", got)
	}
}
