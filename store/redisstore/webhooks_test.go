package redisstore_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/hooktest"
	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/redisstore"
	"github.com/greendot/greendot/store/redisstore/redistest"
	"github.com/greendot/greendot/store/storetest"
	"github.com/greendot/greendot/webhook"
)

type nopHandler struct{}

func (nopHandler) OnPresence(store.PresenceEvent)     {}
func (nopHandler) OnMembership(store.MembershipEvent) {}

// whNode is a Redis store with webhooks on and its Sender, swept as a
// server would sweep it.
type whNode struct {
	st     *redisstore.Store
	sender *webhook.Sender
}

func startWHNode(t *testing.T, url, name, hookURL string) *whNode {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := redisstore.New(ctx, redisstore.Config{URL: url, Node: name, TTL: 5 * time.Second,
		Grace: 100 * time.Millisecond, NodeTTL: 600 * time.Millisecond, HoldOff: 300 * time.Millisecond,
		WebhookQueue: 1000, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	st.Subscribe(nopHandler{})
	key, err := webhook.ParseSecret(hooktest.Secret)
	if err != nil {
		t.Fatal(err)
	}
	sender, err := webhook.NewSender(webhook.Config{URL: hookURL, Secret: key, Logger: quiet,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Poll: 20 * time.Millisecond,
		KeepEvery: 200 * time.Millisecond, StatsEvery: 50 * time.Millisecond}, st.Webhooks())
	if err != nil {
		t.Fatal(err)
	}
	sender.Start()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				_ = st.Sweep(context.Background())
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
		sender.Stop()
		_ = st.Close()
	})
	return &whNode{st: st, sender: sender}
}

// The transitions of each user on two nodes, while the receiver is down:
// once it is back, every change arrives, once per id (both nodes live, so
// nobody claims another's), each user's in version order with the right
// previous state, and the streams are empty after.
func testWebhooksTwoNodes(t *testing.T, url string, streams func() int) {
	recv := hooktest.Start(t)
	var up atomic.Bool
	recv.Answer(func(hooktest.Hook) int {
		if up.Load() {
			return http.StatusOK
		}
		return http.StatusServiceUnavailable
	})
	nodes := []*whNode{startWHNode(t, url, "a", recv.URL()), startWHNode(t, url, "b", recv.URL())}
	ctx := context.Background()
	users := []string{"u0", "u1", "u2", "u3", "u4", "u5"}
	for i, u := range users {
		st := nodes[i%2].st
		must(t, st.AddMember(ctx, "team", u))
		must(t, st.AddMember(ctx, "alpha", u))
		id := u + "-c"
		must(t, st.Connect(ctx, presence.Conn{ID: id, UserID: u, Device: "web"}))
		must(t, st.SetStatus(ctx, id, false))
		must(t, st.SetStatus(ctx, id, true))
		must(t, st.Disconnect(ctx, id, presence.Closed))
	}
	want := len(users) * 4
	// Each node holds a user's later changes behind the first until it is
	// delivered: while down, every user's first change is retried.
	testwait.For(t, 10*time.Second, func() error {
		tried := map[string]int{}
		for _, h := range recv.All() {
			tried[h.Data.UserID]++
		}
		for _, u := range users {
			if tried[u] < 3 {
				return fmt.Errorf("tries while down: %v, want 3 each", tried)
			}
		}
		return nil
	})
	up.Store(true)
	testwait.For(t, 15*time.Second, func() error {
		if n := len(recv.Delivered()); n < want {
			return fmt.Errorf("%d delivered, want %d", n, want)
		}
		return nil
	})
	recv.Check(t)
	got := recv.Delivered()
	ids := map[string]bool{}
	per := map[string][]hooktest.Hook{}
	for _, h := range got {
		if ids[h.ID] {
			t.Fatalf("%s delivered twice", h.ID)
		}
		ids[h.ID] = true
		per[h.Data.UserID] = append(per[h.Data.UserID], h)
	}
	for _, u := range users {
		hs := per[u]
		sort.Slice(hs, func(i, j int) bool { return hs[i].Data.Version < hs[j].Data.Version })
		var seq []string
		for _, h := range hs {
			seq = append(seq, h.Data.PreviousState+">"+h.Data.State)
			if fmt.Sprint(h.Data.Teams) != "[alpha team]" {
				t.Fatalf("%s teams %v", u, h.Data.Teams)
			}
		}
		if s := strings.Join(seq, " "); s != "offline>online online>away away>online online>offline" {
			t.Fatalf("%s: %s", u, s)
		}
		if hs[3].Data.LastSeen == nil {
			t.Fatalf("%s offline without last_seen: %s", u, hs[3].Body)
		}
	}
	if len(got) != want {
		t.Fatalf("%d delivered, want %d", len(got), want)
	}
	testwait.For(t, 5*time.Second, func() error {
		if n := streams(); n != 0 {
			return fmt.Errorf("%d entries left in the streams", n)
		}
		return nil
	})
}

func TestWebhooksTwoNodes(t *testing.T) {
	r := redistest.Start(t)
	testWebhooksTwoNodes(t, r.URL(), func() int { return streamEntries(t, r) })
}

func TestWebhooksCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	testWebhooksTwoNodes(t, c.URL(), func() int {
		n := 0
		for _, s := range c.Nodes {
			n += streamEntries(t, s)
		}
		return n
	})
}

// streamEntries counts the entries of the webhook streams on one server.
func streamEntries(t *testing.T, r *redistest.Server) int {
	t.Helper()
	n := 0
	for sh := range 32 {
		key := fmt.Sprintf("gd:{gd%d}:wh", sh)
		v, err := r.Do("XLEN", key)
		if err != nil {
			if strings.Contains(err.Error(), "MOVED") {
				continue // another master's slot
			}
			t.Fatal(err)
		}
		var k int
		fmt.Sscan(v, &k)
		n += k
	}
	return n
}

// Webhooks off: the scripts add nothing to any stream.
func TestWebhooksOffQueueNothing(t *testing.T) {
	r := redistest.Start(t)
	st := newStore(t, r.URL(), storetest.Config{TTL: time.Second, Grace: time.Second, Node: "a"})
	st.Subscribe(nopHandler{})
	if st.Webhooks() != nil {
		t.Fatal("a queue without WebhookQueue")
	}
	ctx := context.Background()
	must(t, st.Connect(ctx, presence.Conn{ID: "c", UserID: "bob", Device: "web"}))
	must(t, st.SetStatus(ctx, "c", false))
	if n := streamEntries(t, r); n != 0 {
		t.Fatalf("%d stream entries with webhooks off", n)
	}
	if v, _ := r.Do("EXISTS", "gd:{gd"+fmt.Sprint(0)+"}:wh"); v != "0" {
		t.Fatalf("a stream exists with webhooks off")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// On Redis too, a webhook is what viewers see: dnd, the status text and
// emoji (a change of text alone is an event), invisible as offline.
func TestWebhooksFollowTheStatus(t *testing.T) {
	r := redistest.Start(t)
	recv := hooktest.Start(t)
	n := startWHNode(t, r.URL(), "a", recv.URL())
	ctx := context.Background()
	must(t, n.st.AddMember(ctx, "t1", "alice"))
	must(t, n.st.Connect(ctx, presence.Conn{ID: "c1", UserID: "alice", Device: "web"}))
	for _, st := range []presence.Status{
		{Mode: presence.ModeDND, Text: "In a meeting", Emoji: "📅"},
		{Mode: presence.ModeDND, Text: "Focus", Emoji: "📅"},
		{Mode: presence.ModeDND, Text: "Focus", Emoji: "📅"}, // the same: nothing
		{Mode: presence.ModeInvisible},
		{Mode: presence.ModeAuto},
	} {
		must(t, n.st.SetUserStatus(ctx, "alice", st))
	}
	want := []string{
		`offline->online "" ""`,
		`online->dnd "In a meeting" "📅"`,
		`dnd->dnd "Focus" "📅"`,
		`dnd->offline "" ""`,
		`offline->online "" ""`,
	}
	var got []string
	testwait.For(t, 10*time.Second, func() error {
		got = got[:0]
		hs := recv.Delivered()
		sort.Slice(hs, func(i, j int) bool { return hs[i].Data.Version < hs[j].Data.Version })
		for _, h := range hs {
			got = append(got, fmt.Sprintf("%s->%s %q %q", h.Data.PreviousState, h.Data.State, h.Data.Text, h.Data.Emoji))
		}
		if strings.Join(got, "; ") != strings.Join(want, "; ") {
			return fmt.Errorf("webhooks %q, want %q", got, want)
		}
		return nil
	})
	recv.Check(t)
	hs := recv.Delivered()
	sort.Slice(hs, func(i, j int) bool { return hs[i].Data.Version < hs[j].Data.Version })
	if hs[3].Data.LastSeen == nil {
		t.Fatal("going invisible sent offline without last_seen")
	}
}
