package presence

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func (w *world) setStatus(user string, st Status) Outcome {
	w.t.Helper()
	out, err := w.tr.SetUserStatus(w.now, user, st)
	if err != nil {
		w.t.Fatalf("set status of %s: %v", user, err)
	}
	return out
}

func onlyChange(t *testing.T, out Outcome) Change {
	t.Helper()
	if len(out.Changes) != 1 {
		t.Fatalf("changes = %+v, want exactly one", out.Changes)
	}
	return out.Changes[0]
}

func TestDNDIsShownWhileOnlineOrAway(t *testing.T) {
	w := newWorld(t)
	on := onlyChange(t, w.connect("c1", "bob", "web"))
	w.now = w.now.Add(time.Second)
	out := w.setStatus("bob", Status{Mode: ModeDND})
	c := onlyChange(t, out)
	if c.State != DND || c.Version <= on.Version || !c.Since.Equal(w.now) {
		t.Fatalf("dnd change = %+v", c)
	}
	if len(out.Statuses) != 1 || out.Statuses[0].Version != c.Version || out.Statuses[0].Status.Mode != ModeDND {
		t.Fatalf("statuses = %+v, want dnd at version %d", out.Statuses, c.Version)
	}
	// All devices idle: still dnd, nothing to publish.
	expectChanges(t, w.status("c1", false))
	p := w.tr.Presence("bob")
	if p.State != DND || p.Actual != DND || p.Status.Mode != ModeDND {
		t.Fatalf("presence = %+v", p)
	}
	// Back to auto: the real state, away.
	expectChanges(t, w.setStatus("bob", Status{}), "bob=away")
}

func TestDNDWhileOfflineChangesOnlyTheStatus(t *testing.T) {
	w := newWorld(t)
	w.connect("c1", "bob", "web")
	w.disconnect("c1")
	w.advance(grace)
	v := w.tr.Presence("bob").Version
	out := w.setStatus("bob", Status{Mode: ModeDND})
	expectChanges(t, out)
	if len(out.Statuses) != 1 || out.Statuses[0].Version <= v {
		t.Fatalf("statuses = %+v, want one above %d", out.Statuses, v)
	}
	// Connecting shows dnd right away, with no online in between.
	expectChanges(t, w.connect("c2", "bob", "web"), "bob=dnd")
}

func TestInvisibleIsOfflineToViewersAndLeavingShowsTheTruth(t *testing.T) {
	w := newWorld(t)
	w.connect("c1", "bob", "web")
	w.now = w.now.Add(3 * time.Second)
	went := w.now
	c := onlyChange(t, w.setStatus("bob", Status{Mode: ModeInvisible, Text: "hidden"}))
	if c.State != Offline || !c.LastSeen.Equal(went) || !c.Since.Equal(went) || c.Text != "" {
		t.Fatalf("going invisible = %+v, want offline, last seen and since %v, no text", c, went)
	}
	// Activity while invisible moves nothing viewers see.
	w.now = w.now.Add(time.Second)
	expectChanges(t, w.status("c1", false))
	expectChanges(t, w.connect("c2", "bob", "ios"))
	p := w.tr.Presence("bob")
	v := p.Visible()
	if v.State != Offline || v.ConnectionCount != 0 || v.Devices != nil || !v.LastSeen.Equal(went) || v.Status.Text != "" {
		t.Fatalf("visible = %+v, want offline with nothing of the truth", v)
	}
	if p.Actual != Online || p.ConnectionCount != 2 || p.Status.Mode != ModeInvisible || p.Status.Text != "hidden" {
		t.Fatalf("truth = %+v, want online on two devices, invisible", p)
	}
	// Leaving it publishes the real state.
	w.now = w.now.Add(time.Second)
	c = onlyChange(t, w.setStatus("bob", Status{}))
	if c.State != Online || !c.Since.Equal(w.now) {
		t.Fatalf("leaving invisible = %+v, want online since now", c)
	}
}

func TestInvisibleUserGoingOfflinePublishesNothing(t *testing.T) {
	w := newWorld(t)
	w.connect("c1", "bob", "web")
	w.setStatus("bob", Status{Mode: ModeInvisible})
	w.now = w.now.Add(time.Second)
	expectChanges(t, w.disconnect("c1"))
	expectChanges(t, w.advance(grace))
	if p := w.tr.Presence("bob"); p.Actual != Offline || p.State != Offline {
		t.Fatalf("presence = %+v, want offline", p)
	}
	// Leaving invisibility while offline: still offline, with the last
	// seen viewers hold; the own devices learn the status all the same.
	out := w.setStatus("bob", Status{})
	expectChanges(t, out)
	if len(out.Statuses) != 1 {
		t.Fatalf("statuses = %+v, want one", out.Statuses)
	}
}

func TestTextChangeIsOneChangeWithSinceKept(t *testing.T) {
	w := newWorld(t)
	on := onlyChange(t, w.connect("c1", "bob", "web"))
	w.now = w.now.Add(time.Minute)
	c := onlyChange(t, w.setStatus("bob", Status{Text: "In a meeting", Emoji: "📅"}))
	if c.State != Online || c.Text != "In a meeting" || c.Emoji != "📅" || !c.Since.Equal(on.At) || c.Version <= on.Version {
		t.Fatalf("text change = %+v, want online since %v with the text", c, on.At)
	}
	// The same status again: nothing at all.
	out := w.setStatus("bob", Status{Text: "In a meeting", Emoji: "📅"})
	if len(out.Changes) != 0 || len(out.Statuses) != 0 {
		t.Fatalf("same status again = %+v, want nothing", out)
	}
	if p := w.tr.Presence("bob"); p.Version != c.Version {
		t.Fatalf("version moved to %d without a change", p.Version)
	}
}

func TestStatusExpiresOnceAtItsDeadline(t *testing.T) {
	w := newWorld(t)
	w.connect("c1", "bob", "web")
	until := w.now.Add(10 * time.Minute)
	// Replaced twice: one queue entry, at the last expiry.
	w.setStatus("bob", Status{Mode: ModeDND, ExpiresAt: w.now.Add(time.Hour)})
	c := onlyChange(t, w.setStatus("bob", Status{Mode: ModeDND, Text: "focus", ExpiresAt: until}))
	if c.State != DND || !c.ExpiresAt.Equal(until) {
		t.Fatalf("change = %+v, want dnd until %v", c, until)
	}
	if w.tr.expires.Len() != 1 {
		t.Fatalf("expiry queue holds %d entries, want 1", w.tr.expires.Len())
	}
	for w.now.Add(ttl / 2).Before(until) {
		_ = w.tr.Heartbeat(w.now, "c1")
		w.now = w.now.Add(ttl / 2)
		expectChanges(t, w.tr.Advance(w.now))
	}
	_ = w.tr.Heartbeat(w.now, "c1")
	w.now = until.Add(-time.Millisecond)
	expectChanges(t, w.tr.Advance(w.now))
	if d := w.tr.NextDeadline(); d.After(until) {
		t.Fatalf("next deadline %v is after the expiry %v", d, until)
	}
	w.now = until
	out := w.tr.Advance(w.now)
	c = onlyChange(t, out)
	if c.State != Online || c.Text != "" || !c.ExpiresAt.IsZero() {
		t.Fatalf("expiry = %+v, want online with nothing", c)
	}
	if out.StatusesExpired != 1 || len(out.Statuses) != 1 || !out.Statuses[0].Status.IsZero() {
		t.Fatalf("outcome = %+v, want one status expired to auto", out)
	}
	expectChanges(t, w.advance(time.Hour))
	if w.tr.expires.Len() != 0 {
		t.Fatalf("expiry queue holds %d entries after the expiry", w.tr.expires.Len())
	}
}

func TestStatusWithoutExpiryLeavesTheQueue(t *testing.T) {
	w := newWorld(t)
	w.setStatus("bob", Status{Text: "x", ExpiresAt: w.now.Add(time.Hour)})
	w.setStatus("bob", Status{Text: "y"})
	if w.tr.expires.Len() != 0 || !w.tr.NextDeadline().IsZero() {
		t.Fatalf("queue %d, next deadline %v: want none", w.tr.expires.Len(), w.tr.NextDeadline())
	}
	expectChanges(t, w.advance(2*time.Hour))
}

func TestStatusOutlivesConnections(t *testing.T) {
	w := newWorld(t)
	w.connect("c1", "bob", "web")
	w.setStatus("bob", Status{Mode: ModeDND, Text: "away from desk"})
	w.disconnect("c1")
	c := onlyChange(t, w.advance(grace))
	if c.State != Offline || c.Text != "away from desk" {
		t.Fatalf("offline = %+v, want offline with the text", c)
	}
	c = onlyChange(t, w.connect("c2", "bob", "ios"))
	if c.State != DND || c.Text != "away from desk" {
		t.Fatalf("back = %+v, want dnd with the text", c)
	}
}

func TestBadStatusChangesNothing(t *testing.T) {
	w := newWorld(t)
	w.connect("c1", "bob", "web")
	w.setStatus("bob", Status{Text: "ok"})
	before := w.tr.Presence("bob")
	bad := []Status{
		{Mode: 7},
		{Text: strings.Repeat("é", MaxTextChars+1)},
		{Text: "evil\u202etxt"},
		{Text: "line\nbreak"},
		{Text: "bad \xff utf8"},
		{Emoji: strings.Repeat("😀", 9)}, // 36 bytes
		{Emoji: "\x00"},
		{ExpiresAt: w.now},
		{ExpiresAt: w.now.Add(-time.Second)},
		{ExpiresAt: w.now.Add(MaxStatusAhead + time.Second)},
	}
	for _, st := range bad {
		out, err := w.tr.SetUserStatus(w.now, "bob", st)
		if !errors.Is(err, ErrBadStatus) || len(out.Changes)+len(out.Statuses) != 0 {
			t.Fatalf("status %+v: err %v, outcome %+v; want ErrBadStatus and nothing", st, err, out)
		}
	}
	if after := w.tr.Presence("bob"); after.Version != before.Version || after.Status != before.Status {
		t.Fatalf("presence moved: %+v, was %+v", after, before)
	}
	good := []Status{
		{Text: strings.Repeat("é", MaxTextChars)},
		{Emoji: "👩\u200d💻"},
		{Emoji: "🏴\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F"},
	}
	for _, st := range good {
		if _, err := w.tr.SetUserStatus(w.now, "bob", st); err != nil {
			t.Fatalf("status %+v refused: %v", st, err)
		}
	}
}

func TestForgottenUserLeavesTheExpiryQueue(t *testing.T) {
	w := newForgettingWorld(t)
	w.goOffline("c1", "bob")
	w.setStatus("bob", Status{Text: "gone", ExpiresAt: w.now.Add(300 * 24 * time.Hour)})
	w.advance(w.tr.cfg.ForgetAfter)
	expectForgotten(t, w.tr, "bob")
	if w.tr.expires.Len() != 0 {
		t.Fatalf("expiry queue keeps %d entries of forgotten users", w.tr.expires.Len())
	}
}
