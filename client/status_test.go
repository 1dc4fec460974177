package client

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/protocol"
)

// The user's status through a real server: set from one device, seen by a
// viewer with its text, learned by the other device and by a new one right
// after welcome (before the snapshot), and ended by its expiry.
func TestUserStatusThroughTheServer(t *testing.T) {
	srv := startServer(t)
	srv.join("t1", "alice", "bob")
	alice := dial(t, srv.url(), testOptions(t, "alice"))
	var mu sync.Mutex
	var heard []UserStatus
	phoneOpts := testOptions(t, "bob")
	phoneOpts.Device = "ios"
	phoneOpts.OnMyStatus = func(st UserStatus) {
		mu.Lock()
		heard = append(heard, st)
		mu.Unlock()
	}
	web := dial(t, srv.url(), testOptions(t, "bob"))
	phone := dial(t, srv.url(), phoneOpts)
	expectState(t, alice, "bob", protocol.StateOnline)
	if _, ok := web.MyStatus(); ok {
		t.Fatal("a default status was reported")
	}

	until := time.Now().Add(1500 * time.Millisecond)
	ctx := context.Background()
	if err := web.SetUserStatus(ctx, UserStatus{Mode: protocol.ModeDND, Text: "In a meeting", Emoji: "📅", ExpiresAt: until}); err != nil {
		t.Fatal(err)
	}
	s := expectState(t, alice, "bob", protocol.StateDND)
	if s.Text != "In a meeting" || s.Emoji != "📅" || s.ExpiresAt.UnixMilli() != until.UnixMilli() || s.Since.IsZero() {
		t.Fatalf("alice holds %+v", s)
	}
	checkFor(t, 5*time.Second, func() error {
		for _, c := range []*Client{web, phone} {
			if st, ok := c.MyStatus(); !ok || st.Mode != protocol.ModeDND || st.Text != "In a meeting" || st.Version != s.Version {
				return fmt.Errorf("%s: my status %+v, want dnd at v%d", c.opts.Device, st, s.Version)
			}
		}
		return nil
	})
	// A new device gets it right after welcome, before the snapshot.
	desk := testOptions(t, "bob")
	desk.Device = "desktop"
	d := dial(t, srv.url(), desk)
	if st, ok := d.MyStatus(); !ok || st.Mode != protocol.ModeDND {
		t.Fatalf("new device: my status %+v, %v", st, ok)
	}
	if got := alice.All(); len(got) != 1 || got[0].State != protocol.StateDND {
		t.Fatalf("alice's map = %v", got)
	}

	// The expiry, by the server.
	s = expectState(t, alice, "bob", protocol.StateOnline)
	if s.Text != "" || !s.ExpiresAt.IsZero() {
		t.Fatalf("after the expiry alice holds %+v", s)
	}
	checkFor(t, 5*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if n := len(heard); n != 2 || heard[1].Mode != protocol.ModeAuto || heard[1].Text != "" {
			return fmt.Errorf("phone heard %+v, want dnd then auto", heard)
		}
		return nil
	})

	// Refused before sending.
	if err := web.SetUserStatus(ctx, UserStatus{Mode: "busy"}); err == nil {
		t.Fatal("an unknown mode was sent")
	}
	if err := web.SetUserStatus(ctx, UserStatus{Mode: protocol.ModeDND, ExpiresAt: time.Now().Add(-time.Second)}); err == nil {
		t.Fatal("a past expiry was sent")
	}
}
