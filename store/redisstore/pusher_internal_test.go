package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// pxNode is a store whose channel-counts ttl is short, for the tests of
// node loss.
func pxNode(t *testing.T, url, node string, countsTTL time.Duration) *Store {
	t.Helper()
	s, _ := mkWith(t, Config{URL: url, Node: node, TTL: time.Second, ChannelCountsTTL: countsTTL, Broadcasts: true,
		NodeTTL: 600 * time.Millisecond, HoldOff: 300 * time.Millisecond})
	return s
}

// expectCountsOn waits until s reads want (err: a read that fails counts
// as not yet).
func expectCountsOn(t *testing.T, s *Store, within time.Duration, want map[string]int, refresh ...*Store) {
	t.Helper()
	ctx := context.Background()
	testwait.For(t, within, func() error {
		for _, n := range refresh { // nodes that live keep refreshing, as servers do
			if err := n.SetChannelCounts(ctx, n.lastCounts(t)); err != nil {
				return err
			}
		}
		got, err := s.ChannelCounts(ctx, "")
		if err != nil {
			return err
		}
		if !maps.Equal(got, want) {
			return fmt.Errorf("%s reads channel counts %v, want %v", s.cfg.Node, got, want)
		}
		return nil
	})
}

// lastCounts reads back this node's own counts, as it last set them.
func (s *Store) lastCounts(t *testing.T) map[string]int {
	t.Helper()
	m, err := s.rdb.HGetAll(context.Background(), pxCountsKey(s.cfg.Node)).Result()
	must(t, err)
	out := make(map[string]int, len(m))
	for k, v := range m {
		var n int
		fmt.Sscan(v, &n)
		out[k] = n
	}
	return out
}

// A node that stops refreshing (it crashed) stops counting after the ttl,
// and its keys are deleted by the read that finds it so; set again, its
// counts are back.
func TestChannelCountsOfAStoppedNode(t *testing.T) {
	const ttl = time.Second
	ctx := context.Background()
	r := redistest.Start(t)
	a, b := pxNode(t, r.URL(), "a", ttl), pxNode(t, r.URL(), "b", ttl)
	must(t, a.SetChannelCounts(ctx, map[string]int{"x": 1}))
	must(t, b.SetChannelCounts(ctx, map[string]int{"x": 2, "y": 1}))
	expectCountsOn(t, a, 0, map[string]int{"x": 3, "y": 1})
	stopped := time.Now()
	kill9(b)
	expectCountsOn(t, a, ttl+3*time.Second, map[string]int{"x": 1}, a)
	if d := time.Since(stopped); d < ttl-100*time.Millisecond {
		t.Fatalf("b's counts stopped counting %v after its last refresh, before the ttl (%v)", d, ttl)
	}
	for _, k := range []string{pxCountsKey("b"), pxStampKey("b")} {
		if n, err := r.Do("EXISTS", k); err != nil || n != "0" {
			t.Fatalf("EXISTS %s = %s, %v: the dead node's counts were not deleted", k, n, err)
		}
	}
	if score, err := r.Do("ZSCORE", pxNodesKey, "b"); err != nil || score != "" {
		t.Fatalf("b still in %s (score %q, %v)", pxNodesKey, score, err)
	}
	b2 := pxNode(t, r.URL(), "b", ttl) // restarted under the same id
	must(t, b2.SetChannelCounts(ctx, map[string]int{"y": 4}))
	expectCountsOn(t, b2, 0, map[string]int{"x": 1, "y": 4}, a)
}

// A node closed cleanly releases its channels at once.
func TestChannelCountsReleasedOnClose(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	a, b := pxNode(t, r.URL(), "a", 0), pxNode(t, r.URL(), "b", 0)
	must(t, a.SetChannelCounts(ctx, map[string]int{"x": 1}))
	must(t, b.SetChannelCounts(ctx, map[string]int{"x": 2}))
	expectCountsOn(t, a, 0, map[string]int{"x": 3})
	must(t, b.Close())
	expectCountsOn(t, a, 0, map[string]int{"x": 1})
}

// The deletion of a dead node's counts spares the counts it wrote since
// it was found dead: they carry a later expiry.
func TestChannelCountsDropSparesAFreshRefresh(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	a := pxNode(t, r.URL(), "a", 0)
	must(t, a.SetChannelCounts(ctx, map[string]int{"x": 1}))
	old, err := r.Do("GET", pxStampKey("a"))
	must(t, err)
	// Refreshed meanwhile, at a later millisecond of Redis's clock (two
	// writes within one carry the same stamp).
	testwait.For(t, 5*time.Second, func() error {
		must(t, a.SetChannelCounts(ctx, map[string]int{"x": 2}))
		if cur, err := r.Do("GET", pxStampKey("a")); err != nil || cur == old {
			return fmt.Errorf("stamp %s still %s (%v)", pxStampKey("a"), old, err)
		}
		return nil
	})
	v, err := a.sc.pxDrop.Run(ctx, a.rdb, []string{pxCountsKey("a"), pxStampKey("a")}, old).Result()
	must(t, err)
	if toInt(v) != 0 {
		t.Fatalf("the drop with the old stamp %s deleted fresh counts", old)
	}
	expectCountsOn(t, a, 0, map[string]int{"x": 2})
}

// After Redis restarts without its data the counts are gone, and back once
// the node sets them again; a set while Redis is down fails.
func TestChannelCountsAfterRedisRestart(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	a := pxNode(t, r.URL(), "a", 0)
	must(t, a.SetChannelCounts(ctx, map[string]int{"x": 1, "presence-y": 2}))
	expectCountsOn(t, a, 0, map[string]int{"x": 1, "presence-y": 2})
	r.Stop()
	testwait.For(t, 5*time.Second, func() error {
		if err := a.SetChannelCounts(ctx, map[string]int{"x": 1}); !errors.Is(err, ErrUnavailable) {
			return fmt.Errorf("set with Redis down: %v, want ErrUnavailable", err)
		}
		return nil
	})
	r.Restart() // empty: no persistence
	expectCountsOn(t, a, 5*time.Second, map[string]int{})
	must(t, a.SetChannelCounts(ctx, map[string]int{"presence-y": 1}))
	expectCountsOn(t, a, 0, map[string]int{"presence-y": 1})
}

// pxRec records the app messages a node receives.
type pxRec struct {
	mu  sync.Mutex
	got []string
}

func (p *pxRec) handle(b []byte) {
	p.mu.Lock()
	p.got = append(p.got, string(b))
	p.mu.Unlock()
}

func (p *pxRec) all() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.got)
}

// After a Redis restart the subscription resumes by itself: messages sent
// while Redis was down failed to send and never arrive; later ones reach
// both nodes.
func TestBroadcastResumesAfterRedisRestart(t *testing.T) {
	r := redistest.Start(t)
	broadcastAcrossRestart(t, r.URL(), r)
}

// The same on a cluster, with the master of gd:{px}:ev's slot restarted.
func TestBroadcastResumesAfterClusterMasterRestart(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	var owner *redistest.Server
	for _, n := range c.Nodes {
		if _, err := n.Do("SPUBLISH", pxChannel, "where"); err == nil { // the others answer MOVED
			owner = n
		}
	}
	if owner == nil {
		t.Fatalf("no cluster node serves %s", pxChannel)
	}
	broadcastAcrossRestart(t, c.URL(), owner)
}

// broadcastAcrossRestart runs two nodes on url across a restart of r,
// the Redis that serves pxChannel.
func broadcastAcrossRestart(t *testing.T, url string, r *redistest.Server) {
	ctx := context.Background()
	a, b := pxNode(t, url, "a", 0), pxNode(t, url, "b", 0)
	ra, rb := &pxRec{}, &pxRec{}
	a.OnBroadcast(ra.handle)
	b.OnBroadcast(rb.handle)
	must(t, a.Broadcast(ctx, []byte("before")))
	for _, rc := range []*pxRec{ra, rb} {
		testwait.For(t, 2*time.Second, func() error {
			if got := rc.all(); !slices.Equal(got, []string{"before"}) {
				return fmt.Errorf("received %q, want [before]", got)
			}
			return nil
		})
	}
	r.Stop()
	testwait.For(t, 5*time.Second, func() error {
		if err := a.Broadcast(ctx, []byte("while down")); !errors.Is(err, ErrUnavailable) {
			return fmt.Errorf("broadcast with Redis down: %v, want ErrUnavailable", err)
		}
		return nil
	})
	r.Restart()
	// Until a node's subscription is back, probes miss it. Each node's
	// go-redis subscribes again on its own schedule (its dial retries and
	// their backoff), so both must have heard one: a message sent once only
	// b was back would be lost to a, as messages are delivered at most once.
	probe := 0
	testwait.For(t, 20*time.Second, func() error {
		probe++
		if err := a.Broadcast(ctx, []byte(fmt.Sprint("probe", probe))); err != nil {
			return err
		}
		for name, rc := range map[string]*pxRec{"a": ra, "b": rb} {
			if !slices.ContainsFunc(rc.all(), func(p string) bool { return strings.HasPrefix(p, "probe") }) {
				return fmt.Errorf("%s received %q: no probe yet", name, rc.all())
			}
		}
		return nil
	})
	must(t, b.Broadcast(ctx, []byte("after")))
	for name, rc := range map[string]*pxRec{"a": ra, "b": rb} {
		testwait.For(t, 5*time.Second, func() error {
			got := rc.all()
			if !slices.Contains(got, "after") {
				return fmt.Errorf("%s received %q, want after", name, got)
			}
			if slices.Contains(got, "while down") {
				return fmt.Errorf("%s received %q: a message whose send failed arrived", name, got)
			}
			return nil
		})
	}
}

func TestNegativeChannelCountsTTLRefused(t *testing.T) {
	_, err := New(context.Background(), Config{URL: "redis://127.0.0.1:1", Node: "a", ChannelCountsTTL: -time.Second})
	if err == nil || !strings.Contains(err.Error(), "channel-counts ttl") {
		t.Fatalf("New with a negative channel-counts ttl: %v", err)
	}
}

// Only a node with Broadcasts on subscribes to app messages, on a
// connection of its own: a node without Pusher holds none.
func TestBroadcastSubscriptionOnlyWhenAsked(t *testing.T) {
	r := redistest.Start(t)
	subscribers := func() string {
		t.Helper()
		got, err := r.DoList("PUBSUB", "SHARDNUMSUB", pxChannel)
		must(t, err)
		if len(got) != 2 {
			t.Fatalf("PUBSUB SHARDNUMSUB %s: %q", pxChannel, got)
		}
		return got[1]
	}
	mk(t, r.URL(), "off", time.Second, 0)
	if n := subscribers(); n != "0" {
		t.Fatalf("%s subscribers of app messages with Broadcasts off, want 0", n)
	}
	pxNode(t, r.URL(), "on", time.Minute)
	if n := subscribers(); n != "1" {
		t.Fatalf("%s subscribers of app messages with one node's Broadcasts on, want 1", n)
	}
}
