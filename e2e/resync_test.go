package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/client"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// rawViewer records every change its client reports, restatements (a newer
// version of the state held) included.
type rawViewer struct {
	c  *client.Client
	mu sync.Mutex
	ch []string
}

func connectRaw(t *testing.T, n *node, user string) *rawViewer {
	t.Helper()
	v := &rawViewer{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, n.ws(), client.Options{
		User: user, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnChange: func(ch client.Change) {
			if ch.FromSnapshot {
				return
			}
			v.mu.Lock()
			v.ch = append(v.ch, fmt.Sprintf("%s=%s(was %q)", ch.UserID, ch.State, ch.Previous))
			v.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatalf("%s on %s: %v", user, n.name, err)
	}
	v.c = c
	t.Cleanup(func() { _ = c.Close() })
	return v
}

func (v *rawViewer) changes() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.ch...)
}

// After a Redis outage every node resyncs its viewers. A resync must only
// deliver what differs from what each viewer holds: it used to send every
// offline teammate again at the floor version, so a viewer's callbacks
// fired "carol went offline" once more (and "dave went offline" for a
// teammate never seen), once per resync.
func TestResyncAfterOutageChangesNothingViewersHold(t *testing.T) {
	short := timing{ttl: 2 * time.Second, heartbeat: 500 * time.Millisecond, grace: 500 * time.Millisecond}
	r := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	a := startNode(t, r.URL(), "a", short)
	b := startNode(t, r.URL(), "b", short)
	a.join("t1", "alice", "bob", "carol", "dave")
	alice := connectRaw(t, a, "alice")
	connect(t, b, "bob", "web")
	carol := connect(t, b, "carol", "web")
	checkFor(t, 3*time.Second, func() error {
		if s, _ := alice.c.Get("carol"); s.State != "online" {
			return fmt.Errorf("alice holds carol=%s", s.State)
		}
		if s, _ := alice.c.Get("bob"); s.State != "online" {
			return fmt.Errorf("alice holds bob=%s", s.State)
		}
		return nil
	})
	_ = carol.c.Close()
	checkFor(t, 3*time.Second, func() error {
		if s, _ := alice.c.Get("carol"); s.State != "offline" {
			return fmt.Errorf("alice holds carol=%s", s.State)
		}
		return nil
	})
	before := len(alice.changes())

	r.Stop()
	checkFor(t, 3*time.Second, func() error {
		if code, _ := a.get("/readyz"); code != 503 {
			return fmt.Errorf("a ready with Redis down")
		}
		return nil
	})
	r.Restart()
	checkFor(t, 10*time.Second, func() error {
		for _, n := range []*node{a, b} {
			if code, body := n.get("/readyz"); code != 200 {
				return fmt.Errorf("%s readyz = %d %s", n.name, code, body)
			}
			if m := metric(n, "greendot_resyncs_total"); m == "" || m == "0" {
				return fmt.Errorf("%s has not resynced yet", n.name)
			}
		}
		return nil
	})
	// Let the resyncs' deliveries, if any, arrive.
	time.Sleep(time.Second)
	if got := alice.changes()[before:]; len(got) > 0 {
		t.Fatalf("the resync delivered %v to alice, who held all of it already", got)
	}
	if m := metric(a, "greendot_resync_deliveries_total"); m != "0" {
		t.Fatalf("node a queued %s resync deliveries, want 0", m)
	}
}
