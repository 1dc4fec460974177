package redisstore

// Forgetting on Redis (--forget-after): the keys that go and the keys that
// stay, against a real redis-server.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

func TestForgetDropsStateKeepsTeams(t *testing.T) {
	ctx := context.Background()
	const ttl, grace, forgetAfter = 2 * time.Second, 300 * time.Millisecond, 600 * time.Millisecond
	r := redistest.Start(t)
	s, err := New(ctx, Config{URL: r.URL(), Node: "a", TTL: ttl, Grace: grace, ForgetAfter: forgetAfter,
		NodeTTL: 600 * time.Millisecond, HoldOff: 300 * time.Millisecond, Logger: logger()})
	must(t, err)
	t.Cleanup(func() { _ = s.Close() })
	h := &rec{}
	s.Subscribe(h)
	must(t, s.Watch(ctx, []string{"t"}))

	key := func(k string) string { return prefix(shardOf("bob")) + k }
	do := func(args ...string) string {
		t.Helper()
		v, err := r.Do(args...)
		must(t, err)
		return v
	}
	offSince := func() string { return do("ZSCORE", key("off"), "bob") }
	version := func() uint64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.ch[len(h.ch)-1].Version
	}

	must(t, s.AddMember(ctx, "t", "bob"))
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	if offSince() != "" {
		t.Fatal("an online user is in the offline set")
	}
	must(t, s.Disconnect(ctx, "c1", presence.Closed))
	waitHist(t, h, 3*time.Second, s, "bob=online bob=offline")
	last := version()
	if do("EXISTS", key("u:bob"), key("sv:bob")) != "2" || offSince() == "" {
		t.Fatalf("offline: u:, sv: and the offline set entry should all be there")
	}
	// An entry a connection left behind in uc: goes with the user.
	do("HSET", key("uc:bob"), "ghost", "web\na\n1")

	testwait.For(t, 3*time.Second, func() error {
		must(t, s.Sweep(ctx))
		if n := do("EXISTS", key("u:bob"), key("sv:bob"), key("uc:bob")); n != "0" {
			return fmt.Errorf("%s of u:, sv:, uc: still there", n)
		}
		return nil
	})
	if offSince() != "" {
		t.Fatal("a forgotten user is still in the offline set")
	}
	if do("SISMEMBER", key("ut:bob"), "t") != "1" || do("SISMEMBER", teamKey("t"), "bob") != "1" {
		t.Fatal("forgetting lost team membership")
	}
	ps, err := s.Presence(ctx, []string{"bob"})
	must(t, err)
	if p := ps[0]; p.State != presence.Offline || p.Version != 0 || !p.LastSeen.IsZero() || p.ConnectionCount != 0 {
		t.Fatalf("forgotten = %+v, want as never seen", p)
	}

	// Back: Redis's clock makes the version exceed the forgotten one.
	must(t, s.Connect(ctx, presence.Conn{ID: "c2", UserID: "bob", Device: "web"}))
	waitHist(t, h, 3*time.Second, s, "bob=online bob=offline bob=online")
	if v := version(); v <= last {
		t.Fatalf("back with version %d, not above the forgotten %d", v, last)
	}
	// Offline again: armed again; a comeback before forget-after disarms.
	must(t, s.Disconnect(ctx, "c2", presence.Closed))
	waitHist(t, h, 3*time.Second, s, "bob=online bob=offline bob=online bob=offline")
	if offSince() == "" {
		t.Fatal("offline again but not in the offline set")
	}
	must(t, s.Connect(ctx, presence.Conn{ID: "c3", UserID: "bob", Device: "web"}))
	if offSince() != "" {
		t.Fatal("a comeback left the user in the offline set")
	}
	sweepFor(t, s, forgetAfter+300*time.Millisecond)
	if ps, _ := s.Presence(ctx, []string{"bob"}); ps[0].State != presence.Online {
		t.Fatalf("a user who came back was forgotten: %+v", ps[0])
	}
}

func TestForgetAfterNonsenseRefused(t *testing.T) {
	for _, cfg := range []Config{
		{URL: "redis://127.0.0.1:1", Node: "a", ForgetAfter: -time.Second},
		{URL: "redis://127.0.0.1:1", Node: "a", Grace: 5 * time.Second, ForgetAfter: time.Second},
	} {
		if _, err := New(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "forget-after") {
			t.Errorf("%+v: %v, want refused for forget-after", cfg, err)
		}
	}
}
