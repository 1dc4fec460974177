package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/hooktest"
	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/memstore"
	"github.com/greendot/greendot/webhook"
)

var pusherFormat = webhook.Pusher{Key: hooktest.PusherKey, Secret: hooktest.PusherSecret}

// A change is a Pusher event only when it enters or leaves offline, one per
// team whose presence channel a Pusher client could subscribe to.
func TestPusherBody(t *testing.T) {
	at := time.UnixMilli(1764500000123)
	for _, tc := range []struct {
		name              string
		prev, next        presence.State
		teams             []string
		occupied, vacated []string
		want              string // "" for no request
	}{
		{"online", presence.Offline, presence.Online, []string{"eng", "support"}, nil, nil,
			`{"time_ms":1764500000123,"events":[{"name":"member_added","channel":"presence-eng","user_id":"bob"},{"name":"member_added","channel":"presence-support","user_id":"bob"}]}`},
		{"dnd from offline", presence.Offline, presence.DND, []string{"eng"}, nil, nil,
			`{"time_ms":1764500000123,"events":[{"name":"member_added","channel":"presence-eng","user_id":"bob"}]}`},
		{"offline", presence.Away, presence.Offline, []string{"eng"}, nil, nil,
			`{"time_ms":1764500000123,"events":[{"name":"member_removed","channel":"presence-eng","user_id":"bob"}]}`},
		{"away", presence.Online, presence.Away, []string{"eng"}, nil, nil, ""},
		{"dnd", presence.Away, presence.DND, []string{"eng"}, nil, nil, ""},
		{"text alone", presence.Online, presence.Online, []string{"eng"}, nil, nil, ""},
		{"no team", presence.Offline, presence.Online, nil, nil, nil, ""},
		{"no channel for the team", presence.Offline, presence.Online, []string{"a team", "ops"}, nil, nil,
			`{"time_ms":1764500000123,"events":[{"name":"member_added","channel":"presence-ops","user_id":"bob"}]}`},
		{"occupies", presence.Offline, presence.Online, []string{"eng", "ops"}, []string{"ops"}, nil,
			`{"time_ms":1764500000123,"events":[{"name":"member_added","channel":"presence-eng","user_id":"bob"},{"name":"channel_occupied","channel":"presence-ops"},{"name":"member_added","channel":"presence-ops","user_id":"bob"}]}`},
		{"vacates", presence.Online, presence.Offline, []string{"eng", "ops"}, nil, []string{"eng", "ops"},
			`{"time_ms":1764500000123,"events":[{"name":"member_removed","channel":"presence-eng","user_id":"bob"},{"name":"channel_vacated","channel":"presence-eng"},{"name":"member_removed","channel":"presence-ops","user_id":"bob"},{"name":"channel_vacated","channel":"presence-ops"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := &webhook.Event{UserID: "bob", Previous: tc.prev, State: tc.next, Version: 7, At: at, Teams: tc.teams,
				Occupied: tc.occupied, Vacated: tc.vacated}
			got := pusherFormat.Body(ev)
			if tc.want == "" {
				if got != nil {
					t.Fatalf("body %s, want none", got)
				}
				return
			}
			if string(got) != tc.want {
				t.Fatalf("body\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

// The headers Pusher's libraries check. The signature below was checked
// with the official pusher npm SDK (pusher@5.3.4, whose webhook check is
// what Pusher's Node users run), outside the tests:
//
//	cd /tmp/pxhook-npm && npm install pusher@5
//	node check.cjs < requests.json
//
// where check.cjs does, for each {body, headers} read,
// new Pusher({appId: "1", key: "hookkey", secret: "hooksecret"})
// .webhook({headers, rawBody: body}).isValid(): it printed valid for this
// body and signature, and invalid for the body with bob replaced by eve.
func TestPusherSignature(t *testing.T) {
	ev := &webhook.Event{UserID: "bob", Previous: presence.Offline, State: presence.Online,
		At: time.UnixMilli(1764500000123), Teams: []string{"eng", "support"}}
	body := pusherFormat.Body(ev)
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	pusherFormat.Sign(h, ev, body, time.Now())
	if err := hooktest.VerifyPusher(body, h); err != nil {
		t.Fatal(err)
	}
	const want = "ff9f7c149a7f96dce71003494db8c11f2b594d1bf7a5928c7e508d4ce0218d72"
	if got := h.Get("X-Pusher-Signature"); got != want {
		t.Fatalf("X-Pusher-Signature %s, want %s (as checked by pusher@5)", got, want)
	}
	if got := h.Get("X-Pusher-Key"); got != hooktest.PusherKey {
		t.Fatalf("X-Pusher-Key %q", got)
	}
}

// A Sender in the Pusher format, fed by a memory store: member_added when
// the first device comes online, nothing for a second device or away, and
// member_removed once the grace ends; the events that mean nothing in
// Pusher's format leave the queue without a request. A receiver down is
// retried as for the native format.
func TestPusherSender(t *testing.T) {
	recv := hooktest.StartPusher(t)
	fail := true // the receiver calls Answer's func under its lock
	recv.Answer(func(hooktest.PusherHook) int {
		if fail {
			fail = false
			return http.StatusBadGateway
		}
		return http.StatusOK
	})
	q := webhook.NewMemQueue(100)
	c := &clock{t: time.Now()}
	st, err := memstore.New(memstore.Config{Grace: 5 * time.Second, Now: c.now, OnChange: q.Add})
	if err != nil {
		t.Fatal(err)
	}
	s, err := webhook.NewSender(webhook.Config{URL: recv.URL(), Format: pusherFormat, Logger: quiet,
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 40 * time.Millisecond, Poll: 10 * time.Millisecond,
		StatsEvery: 10 * time.Millisecond, Metrics: webhook.NewPusherMetrics()}, q)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(s.Stop)
	ctx := context.Background()
	for _, team := range []string{"t2", "t1"} {
		if err := st.AddMember(ctx, team, "alice"); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"c1", "c2"} {
		if err := st.Connect(ctx, presence.Conn{ID: id, UserID: "alice", Device: "web"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"c1", "c2"} {
		if err := st.SetStatus(ctx, id, false); err != nil { // away: no Pusher event
			t.Fatal(err)
		}
	}
	for _, id := range []string{"c1", "c2"} {
		if err := st.Disconnect(ctx, id, presence.Closed); err != nil {
			t.Fatal(err)
		}
	}
	c.add(6 * time.Second)
	if err := st.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	var got []hooktest.PusherHook
	testwait.For(t, 10*time.Second, func() error {
		got = recv.Delivered()
		if depth, _, _ := q.Stats(ctx); len(got) < 2 || depth != 0 {
			return fmt.Errorf("%d delivered, %d queued; want 2 and 0", len(got), depth)
		}
		return nil
	})
	recv.Check(t)
	var lines []string
	for _, h := range got {
		for _, e := range h.Events {
			lines = append(lines, e.Name+" "+e.Channel+" "+e.UserID)
		}
	}
	want := "channel_occupied presence-t1 ,member_added presence-t1 alice,channel_occupied presence-t2 ,member_added presence-t2 alice," +
		"member_removed presence-t1 alice,channel_vacated presence-t1 ,member_removed presence-t2 alice,channel_vacated presence-t2 "
	if s := strings.Join(lines, ","); s != want {
		t.Fatalf("events %s, want %s", s, want)
	}
	if n := len(recv.All()); n != 3 {
		t.Fatalf("%d requests, want 3 (one failed, retried, then one)", n)
	}
}

// A Pusher Sender needs no Standard Webhooks secret; a native one does.
func TestSenderNeedsASecretOrAFormat(t *testing.T) {
	q := webhook.NewMemQueue(1)
	if _, err := webhook.NewSender(webhook.Config{URL: "http://x/"}, q); err == nil {
		t.Fatal("a native Sender without a secret was made")
	}
	if _, err := webhook.NewSender(webhook.Config{URL: "http://x/", Format: pusherFormat}, q); err != nil {
		t.Fatal(err)
	}
}

// preparingQueue is a MemQueue whose events a Prepare completes, the way
// the Redis store's Pusher queue sets Occupied and Vacated: it fails the
// first call, then counts the teams of every event it is asked about.
type preparingQueue struct {
	*webhook.MemQueue
	mu    sync.Mutex
	calls int
}

func (q *preparingQueue) Prepare(_ context.Context, ev *webhook.Event) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.calls++
	if q.calls == 1 {
		return errors.New("store unavailable")
	}
	ev.Occupied = ev.Teams
	return nil
}

// A Sender prepares an event before its first request and sends the same
// body on every attempt after; a Prepare that fails is retried like a
// failed request.
func TestSenderPreparesOnce(t *testing.T) {
	recv := hooktest.StartPusher(t)
	fail := true
	recv.Answer(func(hooktest.PusherHook) int {
		if fail {
			fail = false
			return http.StatusBadGateway
		}
		return http.StatusOK
	})
	q := &preparingQueue{MemQueue: webhook.NewMemQueue(10)}
	s, err := webhook.NewSender(webhook.Config{URL: recv.URL(), Format: pusherFormat, Logger: quiet,
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, Poll: 10 * time.Millisecond,
		Metrics: webhook.NewPusherMetrics()}, q)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(s.Stop)
	at := time.Now() // within the retry window
	q.Add(store.PresenceEvent{Change: presence.Change{UserID: "bob", State: presence.Online, Previous: presence.Offline,
		Version: 1, At: at}, Teams: []string{"eng"}})
	testwait.For(t, 10*time.Second, func() error {
		if n := len(recv.Delivered()); n != 1 {
			return fmt.Errorf("%d delivered, want 1", n)
		}
		return nil
	})
	recv.Check(t)
	all := recv.All()
	want := `{"time_ms":` + fmt.Sprint(at.UnixMilli()) + `,"events":[{"name":"channel_occupied","channel":"presence-eng"},{"name":"member_added","channel":"presence-eng","user_id":"bob"}]}`
	if len(all) != 2 || all[0].Body != want || all[1].Body != want {
		t.Fatalf("%d requests, want 2 with the prepared body %s: %+v", len(all), want, all)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.calls != 2 {
		t.Fatalf("Prepare called %d times, want 2 (a failure, then once for both requests)", q.calls)
	}
}
