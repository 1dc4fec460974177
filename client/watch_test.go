package client

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/greendot/greendot/protocol"
)

// Watching users of a large team through a real server: the answer, the
// changes, the counts, unwatch, and the watches sent again after the
// server restarted.
func TestWatchThroughTheServer(t *testing.T) {
	srv := startServer(t, "--large-team", "2")
	srv.join("big", "v", "a", "b", "c")
	ctx := context.Background()
	a := dial(t, srv.url(), testOptions(t, "a"))
	b := dial(t, srv.url(), testOptions(t, "b"))
	v := dial(t, srv.url(), testOptions(t, "v"))
	if got := v.All(); len(got) != 0 {
		t.Fatalf("snapshot of a large team: %v, want nothing", got)
	}
	users, err := v.Watch(ctx, []string{"a", "zz"})
	if err != nil {
		t.Fatal(err)
	}
	if len(users) != 2 || users[0].State != protocol.StateOnline || users[1].State != protocol.StateUnknown {
		t.Fatalf("watch: %v", users)
	}
	expectState(t, v, "a", protocol.StateOnline)
	checkFor(t, 5*time.Second, func() error {
		if got := fmt.Sprint(v.TeamCounts()); got != "[{big 4 3}]" {
			return fmt.Errorf("team counts %s", got)
		}
		return nil
	})
	if err := a.SetStatus(ctx, protocol.StateAway); err != nil {
		t.Fatal(err)
	}
	expectState(t, v, "a", protocol.StateAway)

	// Unwatched (the server has it once a ping came back), a's change does
	// not come; b's, watched after it, does.
	if err := v.Unwatch(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.SetStatus(ctx, protocol.StateOnline); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Watch(ctx, []string{"b"}); err != nil {
		t.Fatal(err)
	}
	if err := b.SetStatus(ctx, protocol.StateAway); err != nil {
		t.Fatal(err)
	}
	expectState(t, v, "b", protocol.StateAway)
	if s, _ := v.Get("a"); s.State != protocol.StateAway {
		t.Fatalf("a after unwatch: %v", s)
	}
	if got := fmt.Sprint(v.Watched()); got != "[b zz]" {
		t.Fatalf("watched %s", got)
	}

	// A new server (memory store: teams added again): v watches b again.
	// Frozen, the clients reconnect only once the team is back, and large
	// (a node decides when the team's first member connects).
	for _, c := range []*Client{a, b, v} {
		c.Freeze(true)
	}
	srv.kill()
	srv.start()
	srv.join("big", "v", "a", "b", "c")
	for _, c := range []*Client{a, b, v} {
		c.Freeze(false)
		expectConnState(t, c, Connected)
	}
	expectConnState(t, b, Connected)
	if err := b.SetStatus(ctx, protocol.StateOnline); err != nil {
		t.Fatal(err)
	}
	expectState(t, v, "b", protocol.StateOnline)
	// a, not watched, is not sent: v still holds what it had.
	if err := a.SetStatus(ctx, protocol.StateAway); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.SetStatus(ctx, protocol.StateAway); err != nil {
		t.Fatal(err)
	}
	expectState(t, v, "b", protocol.StateAway)
	checkFor(t, 5*time.Second, func() error {
		if got := fmt.Sprint(v.TeamCounts()); got != "[{big 4 3}]" {
			return fmt.Errorf("team counts after the restart %s", got)
		}
		return nil
	})

	if _, err := v.Watch(ctx, ids(501)); err == nil {
		t.Fatal("a watch of 501 ids passed")
	}
}

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprint("u", i)
	}
	return out
}
