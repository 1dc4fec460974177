package client

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/protocol"
)

// Since is never zero: a snapshot's receipt stands in for the transition
// time it does not carry, and a same-state snapshot keeps the time held.
func TestStateSince(t *testing.T) {
	t0 := time.UnixMilli(1764500000000)
	t1, t2, t3 := t0.Add(time.Second), t0.Add(2*time.Second), t0.Add(3*time.Second)
	m := newPresenceMap()

	changes := m.applySnapshot([]protocol.UserState{{UserID: "bob", State: "online", Version: 3}}, t1)
	bob, _ := m.get("bob")
	if !bob.At.IsZero() || !bob.Since.Equal(t1) || len(changes) != 1 || !changes[0].Since.Equal(t1) {
		t.Fatalf("from a snapshot: %+v, change %+v; want At zero, Since the receipt", bob, changes)
	}

	m.applyChanges([]protocol.Change{{UserID: "bob", State: "away", Version: 4, At: t0.UnixMilli()}}, t2)
	if bob, _ = m.get("bob"); !bob.At.Equal(t0) || !bob.Since.Equal(t0) {
		t.Fatalf("from a change: %+v; want At and Since the server's time", bob)
	}
	m.applyChanges([]protocol.Change{{UserID: "bob", State: "online", Version: 5}}, t2)
	if bob, _ = m.get("bob"); !bob.At.IsZero() || !bob.Since.Equal(t2) {
		t.Fatalf("from a change without at: %+v; want Since the receipt", bob)
	}

	// A reconnect snapshot that shows the same state keeps the time held;
	// one that leaves bob out makes him offline since its receipt.
	m.applySnapshot([]protocol.UserState{{UserID: "bob", State: "online", Version: 5}}, t3)
	if bob, _ = m.get("bob"); !bob.Since.Equal(t2) {
		t.Fatalf("same state in a later snapshot: Since %v, want the %v held", bob.Since, t2)
	}
	changes = m.applySnapshot(nil, t3)
	if len(changes) != 1 || changes[0].State != "offline" || !changes[0].Since.Equal(t3) {
		t.Fatalf("left out of a snapshot: %+v; want offline since its receipt", changes)
	}
}

func TestStrings(t *testing.T) {
	at := time.Date(2025, 11, 30, 10, 4, 5, 123e6, time.UTC)
	for _, tc := range []struct {
		v    fmt.Stringer
		want string
	}{
		{State{UserID: "bob", State: "away", Version: 7, Since: at}, "bob away v7 since 2025-11-30T10:04:05.123Z"},
		{State{UserID: "bob", State: "away", Version: 7}, "bob away v7"},
		{UserPresence{UserID: "bob", State: "online", ConnectionCount: 2, Devices: []string{"ios", "web"}, Version: 7}, "bob online v7 on 2 connections [ios web]"},
		{UserPresence{UserID: "bob", State: "away", ConnectionCount: 1, Devices: []string{"web"}, Version: 8}, "bob away v8 on 1 connection [web]"},
		{UserPresence{UserID: "erin", State: "offline", Devices: []string{}, LastSeen: at, Version: 4}, "erin offline v4 last seen 2025-11-30T10:04:05.123Z"},
		{UserPresence{UserID: "frank", State: "offline", Devices: []string{}}, "frank offline, never seen"},
		{UserPresence{UserID: "carol", State: "unknown"}, "carol unknown"},
	} {
		if got := fmt.Sprint(tc.v); got != tc.want {
			t.Errorf("%#v prints %q, want %q", tc.v, got, tc.want)
		}
	}
	// As a query answers them: last_seen in ms, null for never seen.
	ms := at.UnixMilli()
	p := userPresence(protocol.UserPresence{UserID: "erin", State: "offline", Devices: []string{}, LastSeen: &ms, Version: 4})
	if !p.LastSeen.Equal(at) || strings.Contains(fmt.Sprintf("%+v", p), "0x") {
		t.Errorf("converted %+v, want LastSeen %v and no pointer", p, at)
	}
	if p := userPresence(protocol.UserPresence{UserID: "frank", State: "offline"}); !p.LastSeen.IsZero() {
		t.Errorf("never seen: LastSeen %v, want zero", p.LastSeen)
	}
}

// The map keeps a State compactly: every field reads back as it went in,
// and zero times stay zero.
func TestEntryKeepsEveryField(t *testing.T) {
	t0 := time.UnixMilli(1764500000123)
	for _, s := range []State{
		{UserID: "bob", State: "away", Version: 7, At: t0, Since: t0.Add(-time.Minute),
			Text: "lunch", Emoji: "🥪", ExpiresAt: t0.Add(time.Hour), LastSeen: t0.Add(-time.Second)},
		{UserID: "erin", State: "offline", Version: 1, Since: t0},
		{UserID: "frank", State: "online", Version: 2, Since: t0, Emoji: "🎧"},
		// Past what nanoseconds since 1970 can hold in an int64 (year 2262).
		{UserID: "grace", State: "away", Version: 3, Since: t0, Text: "sabbatical", ExpiresAt: time.UnixMilli(32503680000000)},
	} {
		got := pack(s).unpack(s.UserID)
		same := got.UserID == s.UserID && got.State == s.State && got.Version == s.Version &&
			got.At.Equal(s.At) && got.Since.Equal(s.Since) && got.ExpiresAt.Equal(s.ExpiresAt) &&
			got.LastSeen.Equal(s.LastSeen) && got.Text == s.Text && got.Emoji == s.Emoji &&
			got.At.IsZero() == s.At.IsZero() && got.ExpiresAt.IsZero() == s.ExpiresAt.IsZero() &&
			got.LastSeen.IsZero() == s.LastSeen.IsZero()
		if !same {
			t.Errorf("held %+v, read back %+v", s, got)
		}
	}
}
