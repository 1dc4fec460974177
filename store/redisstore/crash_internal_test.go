package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// A node killed between a script and its publish (here: bob's active
// device ended, bob now away, nothing published) took the change with it:
// every viewer kept bob online. Nothing else sends it before bob's next
// change, so once a sweep finds the node dead every live node resyncs.
func TestCrashedNodeMakesEveryNodeResync(t *testing.T) {
	r := redistest.Start(t)
	ctx := context.Background()
	a, _ := mkResync(t, r.URL(), "a")
	b, hb := mkResync(t, r.URL(), "b")
	_, hc := mkResync(t, r.URL(), "c")
	must(t, a.AddMember(ctx, "t", "bob"))
	must(t, a.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	must(t, a.Connect(ctx, presence.Conn{ID: "c2", UserID: "bob", Device: "phone", Idle: true}))
	dc := a.disconnectCall("c1", "bob", "a", presence.Closed, true, noneHeard)
	if _, err := run(ctx, a.rdb, a.sc.disconnect, dc.keys, dc.args...); err != nil {
		t.Fatal(err)
	}
	kill9(a)
	ps, err := b.Presence(ctx, []string{"bob"})
	if err != nil || ps[0].State != presence.Away {
		t.Fatalf("bob reads %v (%v), want away: the disconnect was written", ps, err)
	}
	b0, c0 := hb.resyncs(), hc.resyncs()
	testwait.For(t, 10*time.Second, func() error {
		must(t, b.Sweep(ctx)) // the servers' sweep tick; c never sweeps
		if hb.resyncs() == b0 || hc.resyncs() == c0 {
			return fmt.Errorf("resyncs since the kill: b %d, c %d; want both", hb.resyncs()-b0, hc.resyncs()-c0)
		}
		return nil
	})
}

// A node that left cleanly published all it wrote: the sweeps that release
// what it left do not take it for a crash.
func TestNodeThatLeftIsNoCrash(t *testing.T) {
	r := redistest.Start(t)
	ctx := context.Background()
	a, _ := mkResync(t, r.URL(), "a")
	b, _ := mkResync(t, r.URL(), "b")
	must(t, a.AddMember(ctx, "t", "bob"))
	must(t, a.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	must(t, a.Close())
	testwait.For(t, 10*time.Second, func() error {
		must(t, b.Sweep(ctx))
		if n, err := r.Do("ZSCORE", shardKeys(shardOf("bob"))[2], "a"); err == nil && n != "" {
			return fmt.Errorf("a still in bob's shard's nodes (%s)", n)
		}
		return nil
	})
	b.crashes.mu.Lock()
	defer b.crashes.mu.Unlock()
	if len(b.crashes.seen) != 0 {
		t.Fatalf("b took a, which left, for crashed: %v", b.crashes.seen)
	}
}

// A node killed and started again under its id quicker than the node ttl
// is never found dead: the new process's first beat finds its id live,
// and has every node resync.
func TestRestartUnderItsIdMakesEveryNodeResync(t *testing.T) {
	r := redistest.Start(t)
	a, _ := mkResync(t, r.URL(), "a")
	_, hb := mkResync(t, r.URL(), "b")
	kill9(a) // nobody sweeps here: a stays listed
	b0 := hb.resyncs()
	_, ha := mkResync(t, r.URL(), "a")
	testwait.For(t, 10*time.Second, func() error {
		if hb.resyncs() == b0 || ha.resyncs() == 0 {
			return fmt.Errorf("resyncs since the restart: b %d, a %d; want both", hb.resyncs()-b0, ha.resyncs())
		}
		return nil
	})
}

// A node stopped cleanly and started again under its id before any sweep
// dropped its entry left a 0 there, not a beat: it published all it wrote,
// and its first beat tells nobody to resync (a drain's restart in the chaos
// test, a rolling deploy with fixed node ids).
func TestRestartAfterACleanStopIsNoCrash(t *testing.T) {
	r := redistest.Start(t)
	a, _ := mkResync(t, r.URL(), "a")
	must(t, a.Close()) // nobody sweeps here: a stays listed, at 0
	a2, _ := mkResync(t, r.URL(), "a")
	testwait.For(t, 10*time.Second, func() error {
		if !a2.beaten.Load() {
			return fmt.Errorf("no first beat yet")
		}
		return nil
	})
	if n := counterValue(t, a2.m.crashesTold); n != 0 {
		t.Fatalf("the restart told %v crashes, want none: a left cleanly", n)
	}
}

// counterValue reads a counter as /metrics would.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 {
		t.Fatalf("gather: %v, %d families", err, len(mfs))
	}
	return mfs[0].GetMetric()[0].GetCounter().GetValue()
}

// The store's loops run from New on and report outcomes (the write-back
// after a data loss, the retried disconnects), so the observer may be set
// while they write: here, a connect stands in for them.
func TestSetObserverWhileTheStoreRuns(t *testing.T) {
	r := redistest.Start(t)
	ctx := context.Background()
	s, _ := mkResync(t, r.URL(), "a")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 20 { // reports an outcome, as the loops' writes do
			must(t, s.Connect(ctx, presence.Conn{ID: fmt.Sprint("c", i), UserID: "bob", Device: "web"}))
		}
	}()
	for range 20 {
		s.SetObserver(&resyncRec{})
	}
	<-done
}
