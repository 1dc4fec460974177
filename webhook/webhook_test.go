package webhook_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/greendot/greendot/internal/hooktest"
	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store/memstore"
	"github.com/greendot/greendot/webhook"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// clock is a settable clock for the memory store.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type rig struct {
	st     *memstore.Store
	q      *webhook.MemQueue
	sender *webhook.Sender
	recv   *hooktest.Receiver
	clock  *clock
}

func secret(t *testing.T) webhook.Secret {
	t.Helper()
	k, err := webhook.ParseSecret(hooktest.Secret)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// newRig runs a memory store (grace 5s, on a clock the test moves) whose
// changes go to a Sender and a real receiver; cfg adjusts the Sender.
func newRig(t *testing.T, queue int, cfg func(*webhook.Config)) *rig {
	t.Helper()
	r := &rig{recv: hooktest.Start(t), q: webhook.NewMemQueue(queue), clock: &clock{t: time.Now()}}
	st, err := memstore.New(memstore.Config{Grace: 5 * time.Second, Now: r.clock.now, OnChange: r.q.Add})
	if err != nil {
		t.Fatal(err)
	}
	r.st = st
	c := webhook.Config{URL: r.recv.URL(), Secret: secret(t), Logger: quiet,
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 40 * time.Millisecond, Poll: 10 * time.Millisecond,
		StatsEvery: 10 * time.Millisecond}
	if cfg != nil {
		cfg(&c)
	}
	r.sender, err = webhook.NewSender(c, r.q)
	if err != nil {
		t.Fatal(err)
	}
	r.sender.Start()
	t.Cleanup(r.sender.Stop)
	return r
}

func (r *rig) conn(t *testing.T, id, user string) {
	t.Helper()
	if err := r.st.Connect(context.Background(), presence.Conn{ID: id, UserID: user, Device: "web"}); err != nil {
		t.Fatal(err)
	}
}

func (r *rig) waitDelivered(t *testing.T, n int) []hooktest.Hook {
	t.Helper()
	var got []hooktest.Hook
	testwait.For(t, 10*time.Second, func() error {
		if got = r.recv.Delivered(); len(got) < n {
			return fmt.Errorf("%d webhooks delivered, want %d (%d requests)", len(got), n, len(r.recv.All()))
		}
		return nil
	})
	return got
}

func summary(hs []hooktest.Hook) string {
	var b []string
	for _, h := range hs {
		b = append(b, fmt.Sprintf("%s:%s->%s", h.Data.UserID, h.Data.PreviousState, h.Data.State))
	}
	return strings.Join(b, " ")
}

// One webhook per transition, with the right previous state, signed so
// that the Standard Webhooks library verifies it; none for a reconnect
// within the grace; the offline one after the grace with last_seen.
func TestOneWebhookPerTransition(t *testing.T) {
	r := newRig(t, 100, nil)
	ctx := context.Background()
	for _, team := range []string{"t2", "t1"} {
		if err := r.st.AddMember(ctx, team, "alice"); err != nil {
			t.Fatal(err)
		}
	}
	r.conn(t, "c1", "alice")
	r.conn(t, "c2", "alice") // a second device: no change
	if err := r.st.SetStatus(ctx, "c1", false); err != nil {
		t.Fatal(err)
	}
	if err := r.st.SetStatus(ctx, "c2", false); err != nil { // both idle: away
		t.Fatal(err)
	}
	r.waitDelivered(t, 2)
	// A reload: the last connection closes and a new one comes within the
	// grace. The new device is active, so away -> online is a real change.
	for _, id := range []string{"c1", "c2"} {
		if err := r.st.Disconnect(ctx, id, presence.Closed); err != nil {
			t.Fatal(err)
		}
	}
	r.clock.add(2 * time.Second)
	_ = r.st.Sweep(ctx)
	r.conn(t, "c3", "alice")
	r.waitDelivered(t, 3)
	// Another reload within the grace, same state: nothing.
	if err := r.st.Disconnect(ctx, "c3", presence.Closed); err != nil {
		t.Fatal(err)
	}
	closedAt := r.clock.now()
	r.clock.add(time.Second)
	_ = r.st.Sweep(ctx)
	r.conn(t, "c4", "alice")
	// Gone for good: offline after the grace, last seen at the close.
	if err := r.st.Disconnect(ctx, "c4", presence.Closed); err != nil {
		t.Fatal(err)
	}
	closedAt = r.clock.now()
	r.clock.add(6 * time.Second)
	if err := r.st.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	got := r.waitDelivered(t, 4)
	r.recv.Check(t)
	if s, want := summary(got), "alice:offline->online alice:online->away alice:away->online alice:online->offline"; s != want {
		t.Fatalf("webhooks = %s, want %s", s, want)
	}
	if n := len(r.recv.All()); n != 4 {
		t.Fatalf("%d requests, want 4", n)
	}
	ids := map[string]bool{}
	for i, h := range got {
		if ids[h.ID] || !strings.HasPrefix(h.ID, "msg_") {
			t.Fatalf("webhook-id %q repeated or malformed", h.ID)
		}
		ids[h.ID] = true
		if i > 0 && h.Data.Version <= got[i-1].Data.Version {
			t.Fatalf("versions not increasing: %v then %v", got[i-1].Data.Version, h.Data.Version)
		}
		if fmt.Sprint(h.Data.Teams) != "[t1 t2]" {
			t.Fatalf("teams = %v", h.Data.Teams)
		}
		if ts, err := time.Parse(time.RFC3339, h.Timestamp); err != nil || ts.UnixMilli() != h.Data.At {
			t.Fatalf("timestamp %q (%v) is not at %d", h.Timestamp, err, h.Data.At)
		}
		if (h.Data.LastSeen != nil) != (h.Data.State == "offline") {
			t.Fatalf("last_seen %v with state %s", h.Data.LastSeen, h.Data.State)
		}
	}
	if ls := got[3].Data.LastSeen; *ls != closedAt.UnixMilli() {
		t.Fatalf("last_seen %d, want the close at %d", *ls, closedAt.UnixMilli())
	}
	if !strings.Contains(got[0].Body, `"last_seen":null`) {
		t.Fatalf("online body without last_seen null: %s", got[0].Body)
	}
}

// A status is what viewers see: dnd is a state, a text or emoji change
// alone is an event of its own, and invisible is offline (last seen the
// moment of going invisible), back to the real state after it.
func TestWebhooksFollowTheStatus(t *testing.T) {
	r := newRig(t, 100, nil)
	ctx := context.Background()
	if err := r.st.AddMember(ctx, "t1", "alice"); err != nil {
		t.Fatal(err)
	}
	r.conn(t, "c1", "alice")
	set := func(st presence.Status) {
		t.Helper()
		if err := r.st.SetUserStatus(ctx, "alice", st); err != nil {
			t.Fatal(err)
		}
	}
	set(presence.Status{Mode: presence.ModeDND, Text: "In a meeting", Emoji: "📅"})
	set(presence.Status{Mode: presence.ModeDND, Text: "Focus", Emoji: "📅"})
	set(presence.Status{Mode: presence.ModeDND, Text: "Focus", Emoji: "📅"}) // the same: nothing
	hiddenAt := r.clock.now()
	set(presence.Status{Mode: presence.ModeInvisible})
	set(presence.Status{Mode: presence.ModeAuto})
	got := r.waitDelivered(t, 5)
	r.recv.Check(t)
	var b []string
	for _, h := range got {
		b = append(b, fmt.Sprintf("%s->%s %q %q", h.Data.PreviousState, h.Data.State, h.Data.Text, h.Data.Emoji))
	}
	want := []string{
		`offline->online "" ""`,
		`online->dnd "In a meeting" "📅"`,
		`dnd->dnd "Focus" "📅"`,
		`dnd->offline "" ""`,
		`offline->online "" ""`,
	}
	if strings.Join(b, "; ") != strings.Join(want, "; ") {
		t.Fatalf("webhooks:\n%s\nwant:\n%s", strings.Join(b, "\n"), strings.Join(want, "\n"))
	}
	if n := len(r.recv.All()); n != 5 {
		t.Fatalf("%d requests, want 5: a status written again sent one", n)
	}
	if ls := got[3].Data.LastSeen; ls == nil || *ls != hiddenAt.UnixMilli() {
		t.Fatalf("going invisible: last_seen %v, want the moment %d", ls, hiddenAt.UnixMilli())
	}
	if strings.Contains(got[0].Body, `"text"`) {
		t.Fatalf("a body without a status text carries one: %s", got[0].Body)
	}
}

// A failing receiver is retried, with the same webhook-id and body, after
// a non-2xx and after a timeout, until it answers 2xx.
func TestRetriesKeepTheID(t *testing.T) {
	r := newRig(t, 100, func(c *webhook.Config) { c.Timeout = 100 * time.Millisecond })
	answers := []int{http.StatusInternalServerError, hooktest.Hang, http.StatusServiceUnavailable, http.StatusFound}
	r.recv.Answer(func(hooktest.Hook) int {
		if len(answers) == 0 {
			return http.StatusOK
		}
		a := answers[0]
		answers = answers[1:]
		return a
	})
	r.conn(t, "c1", "bob")
	r.waitDelivered(t, 1)
	all := r.recv.All()
	r.recv.Check(t)
	if len(all) != 5 {
		t.Fatalf("%d requests, want 5 (4 failures, then the 2xx)", len(all))
	}
	for _, h := range all[1:] {
		if h.ID != all[0].ID || h.Body != all[0].Body {
			t.Fatalf("retry changed the id or body: %s %s vs %s %s", h.ID, h.Body, all[0].ID, all[0].Body)
		}
	}
	m := r.sender.Metrics()
	testwait.For(t, 5*time.Second, func() error {
		if v := counter(t, m, "greendot_webhook_retries_total", ""); v != 4 {
			return fmt.Errorf("retries = %v, want 4", v)
		}
		if v := counter(t, m, "greendot_webhook_attempts_total", "timeout"); v != 1 {
			return fmt.Errorf("timeouts = %v, want 1", v)
		}
		if v := counter(t, m, "greendot_webhook_deliveries_total", "delivered"); v != 1 {
			return fmt.Errorf("delivered = %v, want 1", v)
		}
		if v := counter(t, m, "greendot_webhook_queue_depth", ""); v != 0 {
			return fmt.Errorf("queue depth = %v, want 0", v)
		}
		return nil
	})
}

// An event still failing after RetryFor is dropped, counted and logged;
// the next one is delivered.
func TestDroppedAfterRetryFor(t *testing.T) {
	var logs syncBuf
	r := newRig(t, 100, func(c *webhook.Config) {
		c.RetryFor = 300 * time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	r.recv.Answer(func(h hooktest.Hook) int {
		if h.Data.UserID == "carol" {
			return http.StatusBadGateway
		}
		return http.StatusOK
	})
	r.conn(t, "c1", "carol")
	m := r.sender.Metrics()
	testwait.For(t, 10*time.Second, func() error {
		if v := counter(t, m, "greendot_webhook_deliveries_total", "expired"); v != 1 {
			return fmt.Errorf("expired = %v, want 1", v)
		}
		return nil
	})
	if !strings.Contains(logs.String(), "webhooks dropped") || !strings.Contains(logs.String(), "carol") {
		t.Fatalf("no log line for the drop: %s", logs.String())
	}
	n := len(r.recv.All())
	if n < 2 {
		t.Fatalf("%d attempts before the drop, want retries", n)
	}
	r.conn(t, "c2", "dave")
	got := r.waitDelivered(t, 1)
	if got[0].Data.UserID != "dave" {
		t.Fatalf("delivered %v", got)
	}
}

// A full queue drops its oldest event, with the overflow counted, and
// delivers the rest once the receiver is back, each user's in order.
func TestQueueBoundAndOrderAfterOutage(t *testing.T) {
	r := newRig(t, 20, nil)
	var down sync.Mutex
	up := false
	r.recv.Answer(func(hooktest.Hook) int {
		down.Lock()
		defer down.Unlock()
		if up {
			return http.StatusOK
		}
		return http.StatusServiceUnavailable
	})
	ctx := context.Background()
	// 4 users, 6 changes each (online, away, online...): 24 events, 4 over.
	for u := range 4 {
		user := fmt.Sprintf("u%d", u)
		r.conn(t, user+"c", user)
		for i := range 5 {
			if err := r.st.SetStatus(ctx, user+"c", i%2 == 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	m := r.sender.Metrics()
	testwait.For(t, 5*time.Second, func() error {
		if v := counter(t, m, "greendot_webhook_deliveries_total", "overflow"); v != 4 {
			return fmt.Errorf("overflow = %v, want 4", v)
		}
		if v := counter(t, m, "greendot_webhook_retries_total", ""); v < 4 {
			return fmt.Errorf("retries = %v, want some while down", v)
		}
		return nil
	})
	down.Lock()
	up = true
	down.Unlock()
	got := r.waitDelivered(t, 20)
	r.recv.Check(t)
	last := map[string]uint64{}
	ids := map[string]bool{}
	for _, h := range got {
		if ids[h.ID] {
			t.Fatalf("%s delivered twice", h.ID)
		}
		ids[h.ID] = true
		if h.Data.Version <= last[h.Data.UserID] {
			t.Fatalf("%s: version %d after %d", h.Data.UserID, h.Data.Version, last[h.Data.UserID])
		}
		last[h.Data.UserID] = h.Data.Version
	}
	if len(got) != 20 {
		t.Fatalf("%d delivered, want 20", len(got))
	}
}

// Bad configuration is refused with a reason.
func TestConfigErrors(t *testing.T) {
	for _, s := range []string{"", "whsec_", "whsec_!!!", "whsec_c2hvcnQ="} {
		if _, err := webhook.ParseSecret(s); err == nil {
			t.Fatalf("secret %q accepted", s)
		}
	}
	for _, u := range []string{"", "ftp://x", "/relative", "http://"} {
		if _, err := webhook.NewSender(webhook.Config{URL: u, Secret: secret(t)}, webhook.NewMemQueue(1)); err == nil {
			t.Fatalf("url %q accepted", u)
		}
	}
	if _, err := webhook.NewSender(webhook.Config{URL: "http://x"}, webhook.NewMemQueue(1)); err == nil {
		t.Fatal("no secret accepted")
	}
}

// Our signature is the one the Standard Webhooks library computes.
func TestSignMatchesTheStandard(t *testing.T) {
	ev := webhook.FromChange(presence.Change{UserID: "ünï", State: presence.Online, Version: 3,
		At: time.UnixMilli(1764500000123)}, nil, "")
	body := ev.Body()
	want := `{"type":"presence.changed","timestamp":"2025-11-30T10:53:20.123Z","data":{"user_id":"ünï","state":"online","previous_state":"offline","version":3,"at":1764500000123,"last_seen":null,"teams":[]}}`
	if string(body) != want {
		t.Fatalf("body\n%s\nwant\n%s", body, want)
	}
	ts := time.Unix(1764500000, 0)
	h := http.Header{}
	h.Set("webhook-id", ev.ID())
	h.Set("webhook-timestamp", fmt.Sprint(ts.Unix()))
	h.Set("webhook-signature", secret(t).Sign(ev.ID(), ts, body))
	if err := hooktest.VerifyIgnoringTimestamp(body, h); err != nil {
		t.Fatal(err)
	}
	h.Set("webhook-signature", secret(t).Sign(ev.ID(), ts, append(body, ' ')))
	if err := hooktest.VerifyIgnoringTimestamp(body, h); err == nil {
		t.Fatal("a signature of another body verified")
	}
}

func counter(t *testing.T, m *webhook.Metrics, name, label string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			if label != "" && (len(mt.GetLabel()) == 0 || mt.GetLabel()[0].GetValue() != label) {
				continue
			}
			if c := mt.GetCounter(); c != nil {
				return c.GetValue()
			}
			return mt.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s{%s}", name, label)
	return 0
}

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// A receiver that never answers does not hold presence up: every
// transition returns while the events queue, and exactly as many requests
// are open as the Sender's concurrency, no more.
func TestHangingReceiverDoesNotSlowPresence(t *testing.T) {
	r := newRig(t, 100000, func(c *webhook.Config) {
		c.Concurrency = 3
		c.Timeout = time.Hour // the requests stay open until the test ends
	})
	r.recv.Answer(func(hooktest.Hook) int { return hooktest.Hang })
	ctx := context.Background()
	const users = 300
	for i := range users {
		id := fmt.Sprintf("c%d", i)
		r.conn(t, id, fmt.Sprintf("user%d", i))
		if err := r.st.SetStatus(ctx, id, false); err != nil {
			t.Fatal(err)
		}
	}
	if depth, _, _ := r.q.Stats(ctx); depth != 2*users {
		t.Fatalf("queue depth %d, want %d: every change queued", depth, 2*users)
	}
	testwait.For(t, 10*time.Second, func() error {
		if m := r.recv.MaxOpen(); m != 3 {
			return fmt.Errorf("%d requests open, want the concurrency of 3", m)
		}
		return nil
	})
	// The three workers are stuck: nothing more was sent, nothing will be
	// until one returns.
	if n := len(r.recv.All()); n != 3 {
		t.Fatalf("%d requests made, want 3", n)
	}
}
