package redisstore

import (
	"context"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// roundTrips counts the commands and pipelines sent with a context marked
// by counted (the store's own loops use the client meanwhile): one round
// trip each, on one server. It keeps what each was, for a failure to show.
type roundTrips struct {
	n     atomic.Int64
	mu    sync.Mutex
	trips []string // guarded by mu
}

type countedKey struct{}

func counted(ctx context.Context) context.Context { return context.WithValue(ctx, countedKey{}, true) }

func (r *roundTrips) count(ctx context.Context, cmds ...redis.Cmder) {
	if ctx.Value(countedKey{}) == nil || len(cmds) == 0 || handshake(cmds[0]) {
		return
	}
	r.n.Add(1)
	what := fmt.Sprint(cmds[0].Args()[0])
	if len(cmds) > 1 {
		what = fmt.Sprintf("pipeline of %d, first %v", len(cmds), cmds[0].Args()[0])
	}
	if len(cmds[0].Args()) > 1 {
		what += fmt.Sprint(" ", cmds[0].Args()[1])
	}
	r.mu.Lock()
	r.trips = append(r.trips, what)
	r.mu.Unlock()
}

// handshake reports a command go-redis sends to set up a new connection of
// its pool (HELLO, then CLIENT SETINFO in a pipeline), with the context of
// the call that needed the connection. A call that finds the pool's
// connections busy (the store's loops use them too, and under load hold
// them longer) dials one: its setup is not a round trip of the call's own
// (TestMissingHeartbeatsReassertInOnePipeline counted 6 so, under load).
func handshake(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "auth", "select", "readonly":
		return true
	case "client":
		args := cmd.Args()
		return len(args) > 1 && strings.EqualFold(fmt.Sprint(args[1]), "setinfo")
	}
	return false
}

// String lists the round trips counted.
func (r *roundTrips) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.trips, "; ")
}

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.count(ctx, cmd)
		return next(ctx, cmd)
	}
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.count(ctx, cmds...)
		return next(ctx, cmds)
	}
}

// ConnectRead registers the connection and reads the user's own presence
// and the members of its teams in one round trip, plus one to publish the
// change the connect made; what it reads is what Connect, Presence and
// MembersOfMany one after the other read. With the scripts lost (Redis
// restarted), it still works, one call at a time.
func TestConnectReadIsOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", time.Second, 0)
	must(t, s.AddMember(ctx, "t1", "alice"))
	must(t, s.AddMember(ctx, "t1", "bob"))
	must(t, s.AddMember(ctx, "t2", "alice"))
	must(t, s.AddMember(ctx, "t2", "carol"))
	must(t, s.SetUserStatus(ctx, "alice", presence.Status{Mode: presence.ModeDND, Text: "focus"}))
	// Redis is given the scripts on their first use.
	if _, _, err := s.ConnectRead(ctx, presence.Conn{ID: "c0", UserID: "zed", Device: "web"}, nil); err != nil {
		t.Fatal(err)
	}
	rt := &roundTrips{}
	s.rdb.AddHook(rt)

	teams := []string{"t1", "t2", "t3"}
	read, registered, err := s.ConnectRead(counted(ctx), presence.Conn{ID: "c1", UserID: "alice", Device: "web"}, teams)
	if err != nil || !registered {
		t.Fatalf("ConnectRead: registered %v, err %v", registered, err)
	}
	if n := rt.n.Load(); n != 2 {
		t.Fatalf("ConnectRead took %d round trips, want 2 (the pipeline, the publish)", n)
	}
	check := func(read store.ConnectReads, conns int) {
		t.Helper()
		own, members := read.Own, read.Members
		if own.UserID != "alice" || own.State != presence.DND || own.ConnectionCount != conns ||
			own.Status.Mode != presence.ModeDND || own.Status.Text != "focus" {
			t.Fatalf("own presence %+v, want alice dnd with %d connections, \"focus\"", own, conns)
		}
		want := [][]string{{"alice", "bob"}, {"alice", "carol"}, nil}
		if !slices.EqualFunc(members, want, slices.Equal) {
			t.Fatalf("members %q, want %q", members, want)
		}
		if want := []string{"t1", "t2"}; !slices.Equal(read.Teams, want) {
			t.Fatalf("teams %q, want %q", read.Teams, want)
		}
	}
	check(read, 1)

	_, err = r.Do("SCRIPT", "FLUSH")
	must(t, err)
	read, registered, err = s.ConnectRead(ctx, presence.Conn{ID: "c2", UserID: "alice", Device: "ios"}, teams)
	if err != nil || !registered {
		t.Fatalf("ConnectRead with the scripts lost: registered %v, err %v", registered, err)
	}
	check(read, 2)

	// Another user's id is refused, as by Connect.
	if _, registered, err := s.ConnectRead(ctx, presence.Conn{ID: "c1", UserID: "bob"}, nil); err == nil || registered {
		t.Fatalf("a duplicate id: registered %v, err %v; want refused", registered, err)
	}
}

// Keys name users' shards by crc32 of the id: the in-place hash and the
// prefix table must name the same keys as ever, or a node would not find
// what an older one wrote.
func TestShardOfIsCRC32(t *testing.T) {
	for _, u := range []string{"", "alice", "bob", "ünïcode", strings.Repeat("x", 128)} {
		if got, want := shardOf(u), int(crc32.ChecksumIEEE([]byte(u))%numShards); got != want {
			t.Errorf("shardOf(%q) = %d, want %d", u, got, want)
		}
	}
	for sh := range numShards {
		if got, want := prefix(sh), fmt.Sprintf("gd:{gd%d}:", sh); got != want {
			t.Errorf("prefix(%d) = %q, want %q", sh, got, want)
		}
	}
}

// A team-mate who never connected is read in the snapshot's one MGET per
// shard, offline at version 0, as the fallback read of their state found
// them: joining a team gave them the copy. A user with a state of their
// own keeps it.
func TestNeverSeenMemberReadInOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", time.Second, 0)
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "alice", Device: "web"}))
	must(t, s.AddMember(ctx, "t1", "alice"))
	must(t, s.AddMember(ctx, "t1", "ghost"))
	must(t, s.AddMember(ctx, "t2", "ghost")) // a second join changes nothing
	rt := &roundTrips{}
	s.rdb.AddHook(rt)
	ps, err := s.WholeStates(counted(ctx), []string{"alice", "ghost"})
	must(t, err)
	if n := rt.n.Load(); n != 1 {
		t.Fatalf("a snapshot read of alice and a never-seen ghost took %d round trips, want 1", n)
	}
	if ps[0].State != presence.Online || ps[0].Version == 0 {
		t.Fatalf("alice %+v, want online with her version", ps[0])
	}
	if g := ps[1]; g.State != presence.Offline || g.Version != 0 || !g.Since.IsZero() || !g.ShownLastSeen.IsZero() {
		t.Fatalf("ghost %+v, want offline at version 0, nothing else", g)
	}
	// The copy goes with the ghost's last membership.
	key := prefix(shardOf("ghost")) + "sv:ghost"
	must(t, s.RemoveMember(ctx, "t1", "ghost"))
	if n, err := r.Do("EXISTS", key); err != nil || n != "1" {
		t.Fatalf("EXISTS %s after leaving one of two teams: %v %v, want 1", key, n, err)
	}
	must(t, s.RemoveMember(ctx, "t2", "ghost"))
	if n, err := r.Do("EXISTS", key); err != nil || n != "0" {
		t.Fatalf("EXISTS %s after leaving the last team: %v %v, want 0", key, n, err)
	}
	// alice's copy, written by her connect, is not overwritten by a join.
	must(t, s.AddMember(ctx, "t3", "alice"))
	ps, err = s.WholeStates(ctx, []string{"alice"})
	must(t, err)
	if ps[0].State != presence.Online || ps[0].Version == 0 {
		t.Fatalf("alice after another join: %+v, want online with her version", ps[0])
	}
	// Nor dropped by a leave.
	must(t, s.RemoveMember(ctx, "t3", "alice"))
	must(t, s.RemoveMember(ctx, "t1", "alice"))
	ps, err = s.WholeStates(ctx, []string{"alice"})
	must(t, err)
	if ps[0].State != presence.Online || ps[0].Version == 0 {
		t.Fatalf("alice after leaving her teams: %+v, want online with her version", ps[0])
	}
	// Nor is a state written without its copy (before the copy existed):
	// it is read from the user's hash.
	_, err = r.Do("DEL", prefix(shardOf("alice"))+"sv:alice")
	must(t, err)
	must(t, s.AddMember(ctx, "t4", "alice"))
	ps, err = s.WholeStates(ctx, []string{"alice"})
	must(t, err)
	if ps[0].State != presence.Online || ps[0].Version == 0 {
		t.Fatalf("alice without her copy, after a join: %+v, want online with her version", ps[0])
	}
}
