package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store/redisstore/redistest"
	"github.com/greendot/greendot/webhook"
)

// The webhook queue, step by step, with every script call checked for
// undeclared keys: a full stream drops its oldest entry and says so; the
// events a node holds are not taken by another while it renews them; those
// of a killed node are claimed after the claim idle; a renewal by a node
// that does not hold an event does not take it; done events leave the
// stream.
func TestWebhookQueue(t *testing.T) {
	r := redistest.Start(t)
	g := newKeyGuard(t, r, loadScripts(whShardMax(64)))
	g.names[newWHQueue(&Store{}, WebhookGroup, nil).keep.Hash()] = "wh_keep"
	cfg := Config{TTL: 5 * time.Second, Grace: time.Second, NodeTTL: 600 * time.Millisecond,
		HoldOff: 300 * time.Millisecond, WebhookQueue: 64, WebhookClaimIdle: time.Second}
	cfg.Node = "a"
	a := guarded(t, g, r, cfg)
	cfg.Node = "b"
	b := guarded(t, g, r, cfg)
	cfg.Node = "c"
	c := guarded(t, g, r, cfg)
	for _, s := range []*Store{a, b, c} {
		s.Subscribe(nopHandler{})
	}
	ctx := context.Background()
	must(t, a.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	must(t, a.SetStatus(ctx, "c1", false))
	must(t, a.SetStatus(ctx, "c1", true))
	key := whKey(shardOf("bob"))
	if n, _ := r.Do("XLEN", key); n != "2" {
		t.Fatalf("XLEN %s = %s, want 2 (64 over 32 shards)", key, n)
	}

	evs, err := a.wh[WebhookGroup].Take(ctx, 100)
	must(t, err)
	if len(evs) != 2 || evs[0].State != presence.Away || evs[0].Previous != presence.Online ||
		evs[1].State != presence.Online || evs[1].Previous != presence.Away {
		t.Fatalf("taken %s", show(evs))
	}
	if evs[0].Dropped != 0 || evs[1].Dropped != 1 {
		t.Fatalf("dropped %d, %d; want the entry that made room to say 1", evs[0].Dropped, evs[1].Dropped)
	}
	if more, _ := b.wh[WebhookGroup].Take(ctx, 100); len(more) != 0 {
		t.Fatalf("b took %s, held by a", show(more))
	}
	// a renews for longer than the claim idle: b takes nothing.
	for range 5 {
		lost, err := a.wh[WebhookGroup].Keep(ctx, evs)
		must(t, err)
		if len(lost) != 0 {
			t.Fatalf("a lost %s", show(lost))
		}
		time.Sleep(300 * time.Millisecond) // 1.5 s in all, past the claim idle
		b.wh[WebhookGroup].nextClaim = time.Time{}
		if more, _ := b.wh[WebhookGroup].Take(ctx, 100); len(more) != 0 {
			t.Fatalf("b claimed %s while a renewed them", show(more))
		}
	}

	kill9(a)
	var claimed []*webhook.Event
	testwait.For(t, 5*time.Second, func() error {
		b.wh[WebhookGroup].nextClaim = time.Time{}
		more, err := b.wh[WebhookGroup].Take(ctx, 100)
		claimed = append(claimed, more...)
		if err != nil || len(claimed) < 2 {
			return fmt.Errorf("b claimed %s (%v)", show(claimed), err)
		}
		return nil
	})
	if len(claimed) != 2 || claimed[0].ID() != evs[0].ID() || claimed[1].ID() != evs[1].ID() {
		t.Fatalf("claimed %s, want %s", show(claimed), show(evs))
	}
	if lost, err := c.wh[WebhookGroup].Keep(ctx, claimed); err != nil || len(lost) != 2 {
		t.Fatalf("c renewed events b holds: lost %s, %v", show(lost), err)
	}
	if lost, err := b.wh[WebhookGroup].Keep(ctx, claimed); err != nil || len(lost) != 0 {
		t.Fatalf("b lost %s, %v", show(lost), err)
	}
	depth, oldest, err := b.wh[WebhookGroup].Stats(ctx)
	if err != nil || depth != 2 || !oldest.Equal(evs[0].At) {
		t.Fatalf("stats %d %v %v", depth, oldest, err)
	}
	must(t, b.wh[WebhookGroup].Done(ctx, claimed))
	if depth, oldest, err := b.wh[WebhookGroup].Stats(ctx); err != nil || depth != 0 || !oldest.IsZero() {
		t.Fatalf("stats after done %d %v %v", depth, oldest, err)
	}
	if p, _ := r.DoList("XPENDING", key, WebhookGroup); len(p) > 0 && p[0] != "0" {
		t.Fatalf("pending after done: %v", p)
	}
	g.check(t)
}

// A queue Redis lost (FLUSHALL) is made again by the next read.
func TestWebhookQueueAfterFlush(t *testing.T) {
	r := redistest.Start(t)
	s, _ := mkWith(t, Config{URL: r.URL(), Node: "a", TTL: 5 * time.Second, NodeTTL: 600 * time.Millisecond,
		HoldOff: 300 * time.Millisecond, WebhookQueue: 100})
	ctx := context.Background()
	if _, err := r.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	_, _ = s.wh[WebhookGroup].Take(ctx, 10) // NOGROUP: made again
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	testwait.For(t, 5*time.Second, func() error {
		evs, err := s.wh[WebhookGroup].Take(ctx, 10)
		if err != nil || len(evs) != 1 || evs[0].UserID != "bob" {
			return fmt.Errorf("took %s, %v", show(evs), err)
		}
		return nil
	})
}

func show(evs []*webhook.Event) string {
	s := "["
	for _, e := range evs {
		s += fmt.Sprintf(" %s:%v>%v@%d(dr%d)", e.UserID, e.Previous, e.State, e.Version, e.Dropped)
	}
	return s + " ]"
}

// Two formats read one queue, each in its group: each takes every event
// once, and an event leaves the stream only when both are done with it,
// whichever is done first, and even when the other has not read it yet.
func TestWebhookQueueTwoGroups(t *testing.T) {
	r := redistest.Start(t)
	g := newKeyGuard(t, r, loadScripts(whShardMax(64)))
	q0 := newWHQueue(&Store{}, WebhookGroup, nil)
	g.names[q0.keep.Hash()] = "wh_keep"
	g.names[q0.done.Hash()] = "wh_done"
	s := guarded(t, g, r, Config{Node: "a", TTL: 5 * time.Second, Grace: time.Second,
		NodeTTL: 600 * time.Millisecond, HoldOff: 300 * time.Millisecond, WebhookQueue: 64,
		WebhookGroups: []string{WebhookGroup, PusherWebhookGroup}})
	s.Subscribe(nopHandler{})
	native, px := s.wh[WebhookGroup], s.wh[PusherWebhookGroup]
	ctx := context.Background()
	key := whKey(shardOf("bob"))
	xlen := func() string { n, _ := r.Do("XLEN", key); return n }

	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	first, err := native.Take(ctx, 100)
	must(t, err)
	if len(first) != 1 {
		t.Fatalf("native took %s", show(first))
	}
	// Done natively before the Pusher group read it: it stays for it.
	must(t, native.Done(ctx, first))
	if n := xlen(); n != "1" {
		t.Fatalf("XLEN %s after the native done, want 1 (unread by the Pusher group)", n)
	}
	got, err := px.Take(ctx, 100)
	must(t, err)
	if len(got) != 1 || got[0].ID() != first[0].ID() {
		t.Fatalf("Pusher group took %s, want %s", show(got), show(first))
	}
	must(t, px.Done(ctx, got))
	if n := xlen(); n != "0" {
		t.Fatalf("XLEN %s after both were done, want 0", n)
	}

	// The other order, with both holding it pending.
	must(t, s.SetStatus(ctx, "c1", false))
	a, err := native.Take(ctx, 100)
	must(t, err)
	b, err := px.Take(ctx, 100)
	must(t, err)
	if len(a) != 1 || len(b) != 1 {
		t.Fatalf("took %s and %s", show(a), show(b))
	}
	must(t, px.Done(ctx, b))
	if n := xlen(); n != "1" {
		t.Fatalf("XLEN %s after the Pusher done, want 1 (pending natively)", n)
	}
	if lost, err := native.Keep(ctx, a); err != nil || len(lost) != 0 {
		t.Fatalf("native lost %s (%v) to the Pusher group's done", show(lost), err)
	}
	must(t, native.Done(ctx, a))
	if n := xlen(); n != "0" {
		t.Fatalf("XLEN %s after both were done, want 0", n)
	}
	g.check(t)
}
