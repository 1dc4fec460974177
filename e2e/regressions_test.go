package e2e

// Faults found in review, kept as regression tests.

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/greendot/greendot/store/redisstore/redistest"
)

// A node that stalls (GC, CPU starvation, VM pause; here SIGSTOP) for longer
// than the 3 s node liveness but less than liveness + grace: survivors rightly
// release its connections into the grace, but when the node resumes it only
// re-asserts the connections whose clients send a frame, so idle users flip
// offline and back online at their next heartbeat.
func TestNodeStallFalseOffline(t *testing.T) {
	tm := timing{ttl: 40 * time.Second, heartbeat: 15 * time.Second, grace: 2500 * time.Millisecond}
	url := redistest.Start(t).URL()
	a := startNode(t, url, "a", tm)
	b := startNode(t, url, "b", tm)
	a.join("t1", "alice", "bob")
	alice := connect(t, a, "alice", "web")
	connect(t, b, "bob", "web") // first heartbeat 10.5-15 s from now
	alice.expect(3*time.Second, "bob=online")

	t.Logf("%s stop", time.Now().Format("05.000"))
	_ = b.cmd.Process.Signal(syscall.SIGSTOP)
	for i := 0; i < 7; i++ {
		time.Sleep(500 * time.Millisecond)
		p := a.presence("bob")
		t.Logf("%s (stopped) bob: %v conns=%v", time.Now().Format("05.000"), p["state"], p["connection_count"])
	}
	_ = b.cmd.Process.Signal(syscall.SIGCONT)
	for i := 0; i < 12; i++ {
		p := a.presence("bob")
		t.Logf("%s bob: %v conns=%v alice=%v", time.Now().Format("05.000"), p["state"], p["connection_count"], alice.changes())
		time.Sleep(500 * time.Millisecond)
	}
	alice.still(time.Second, "bob=online")
	t.Logf("b log:\n%s", b.log.String())
}

// kill -9 of b and a restart with the same --node-id, as operations.md
// recommends ("$(hostname)"): bob, whose client cannot reach b any more,
// should be offline after node liveness (3 s) + grace (1.5 s).
func TestSameNodeIDRestart(t *testing.T) {
	url := redistest.Start(t).URL()
	a := startNode(t, url, "a", quick)
	b := startNode(t, url, "b", quick)
	a.join("t1", "alice", "bob")
	alice := connect(t, a, "alice", "web")
	connect(t, b, "bob", "web")
	alice.expect(3*time.Second, "bob=online")
	b.kill()
	killed := time.Now()
	startNode(t, url, "b", quick) // new address: bob's client cannot come back to it
	alice.expect(quick.ttl, "bob=online", "bob=offline")
	if took := time.Since(killed); took > 6*time.Second {
		t.Fatalf("bob offline %v after the kill; want ~4.5s (node ttl + grace)", took.Round(100*time.Millisecond))
	}
}

// A viewer joins a team it shares with a subject it already sees through
// another team. Its node receives each change of the subject once per team
// channel; when the viewer was indexed under the new team between two
// copies, each copy went to the members whose first shared team was the
// copy's, and the viewer got neither: lost for good. (The hub-level test
// TestCopiesReachViewerOnceAcrossAJoin pins the race down; this one checks
// it end to end, waiting for each change rather than for a fixed time.)
func TestJoinWindowLosesChange(t *testing.T) {
	url := redistest.Start(t).URL()
	a := startNode(t, url, "a", quick)
	b := startNode(t, url, "b", quick)
	a.join("t1", "alice", "bob")
	a.join("a0", "bob")
	alice := connect(t, a, "alice", "web")
	bob := connect(t, b, "bob", "web")
	alice.expect(3*time.Second, "bob=online")
	state := "online"
	for i := 0; i < 25; i++ {
		a.join("a0", "alice")
		if state == "online" {
			state = "away"
		} else {
			state = "online"
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = bob.c.SetStatus(ctx, state)
		cancel()
		checkFor(t, 5*time.Second, func() error {
			if s, _ := alice.c.Get("bob"); s.State != state {
				return fmt.Errorf("iteration %d: alice holds bob=%s, truth %s", i, s.State, state)
			}
			return nil
		})
		if code, body := a.do("DELETE", "/v1/teams/a0/members/alice"); code != 204 {
			t.Fatal(code, body)
		}
	}
}
