package e2e

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/hooktest"
	"github.com/greendot/greendot/internal/nodetest"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// startHookNode starts a node on redisURL that sends webhooks to recv.
func startHookNode(t *testing.T, redisURL, name string, recv *hooktest.Receiver) *node {
	t.Helper()
	p := nodetest.Start(t, binary, name, "--store", "redis", "--redis-url", redisURL,
		"--node-id", name, "--ttl", "25s", "--heartbeat-interval", "10s", "--offline-grace", "1s",
		"--webhook-url", recv.URL(), "--webhook-secret", hooktest.Secret)
	return &node{t: t, name: name, addr: p.Addr, proc: p, cmd: p.Cmd, done: p.Done, log: p.Log}
}

// The node that published a change and holds its webhook, failing against
// a receiver that is down, is killed with kill -9 before it delivers: the
// other node claims the event and delivers it, with the same webhook-id,
// once; and the offline that follows (published by the survivor, which
// releases the dead node's connection) arrives too.
func TestWebhookSurvivesKill9OfItsNode(t *testing.T) {
	url := redistest.Start(t).URL()
	recv := hooktest.Start(t)
	var up atomic.Bool
	recv.Answer(func(hooktest.Hook) int {
		if up.Load() {
			return http.StatusOK
		}
		return http.StatusServiceUnavailable
	})
	a := startHookNode(t, url, "a", recv)
	a.join("t1", "bob")
	connect(t, a, "bob", "web")
	// a is the only node: it published bob's online and holds its webhook.
	var first hooktest.Hook
	checkFor(t, 10*time.Second, func() error {
		all := recv.All()
		if len(all) < 2 {
			return fmt.Errorf("%d attempts, want a's retries", len(all))
		}
		first = all[0]
		return nil
	})
	if first.Data.UserID != "bob" || first.Data.State != "online" {
		t.Fatalf("first webhook %s", first.Body)
	}
	b := startHookNode(t, url, "b", recv)
	a.kill()
	up.Store(true)

	checkFor(t, 40*time.Second, func() error {
		var seq []string
		for _, h := range recv.Delivered() {
			seq = append(seq, h.Data.PreviousState+">"+h.Data.State)
		}
		if len(seq) < 2 {
			return fmt.Errorf("delivered %v, want bob's online and offline", seq)
		}
		return nil
	})
	recv.Check(t)
	got := recv.Delivered()
	sort.Slice(got, func(i, j int) bool { return got[i].Data.Version < got[j].Data.Version })
	var seq []string
	count := map[string]int{}
	for _, h := range got {
		seq = append(seq, h.Data.UserID+":"+h.Data.PreviousState+">"+h.Data.State)
		count[h.ID]++
	}
	if s := strings.Join(seq, " "); s != "bob:offline>online bob:online>offline" {
		t.Fatalf("delivered %s", s)
	}
	if got[0].ID != first.ID || got[0].Body != first.Body {
		t.Fatalf("the claimed webhook changed: %s %s, was %s %s", got[0].ID, got[0].Body, first.ID, first.Body)
	}
	for id, n := range count {
		if n != 1 {
			t.Fatalf("%s delivered %d times", id, n)
		}
	}
	if !strings.Contains(b.log.String(), "claimed the events of a consumer gone silent") {
		t.Fatalf("b did not log the claim:\n%s", b.log.String())
	}
}
