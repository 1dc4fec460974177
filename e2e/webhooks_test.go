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

// The node that published changes and holds their webhooks, failing
// against a receiver that is down, is killed with kill -9 before it
// delivers: the other node claims the events and delivers them, with the
// same webhook-ids, once each. Changes published meanwhile by the survivor
// (its own users coming and going, the offline of the dead node's users
// once it releases their connections) wait for the receiver too, and
// everything arrives once it is back.
func TestWebhooksSurviveKill9AndAReceiverDown(t *testing.T) {
	url := redistest.Start(t).URL()
	recv := hooktest.Start(t)
	var up atomic.Bool
	recv.Answer(func(hooktest.Hook) int {
		if up.Load() {
			return http.StatusOK
		}
		return http.StatusServiceUnavailable
	})
	onA := []string{"alice", "amy", "anna"}
	onB := []string{"bob", "ben", "bill"}
	a := startHookNode(t, url, "a", recv)
	a.join("t1", append(onA, onB...)...)
	for _, u := range onA {
		connect(t, a, u, "web")
	}
	// a is the only node: it published its users' online and holds their
	// webhooks, retrying them.
	firstID := map[string]string{}
	checkFor(t, 10*time.Second, func() error {
		tries := map[string]int{}
		for _, h := range recv.All() {
			tries[h.Data.UserID]++
			if _, ok := firstID[h.Data.UserID]; !ok && h.Data.State == "online" {
				firstID[h.Data.UserID] = h.ID
			}
		}
		for _, u := range onA {
			if tries[u] < 2 {
				return fmt.Errorf("tries %v, want a's retries for each of %v", tries, onA)
			}
		}
		return nil
	})
	b := startHookNode(t, url, "b", recv)
	for _, u := range onB {
		v := connect(t, b, u, "web")
		_ = v.c.Close()
	}
	a.kill()
	// Down a while longer: until b's users' offline (after the grace) and
	// the offline of a's users (released by b) have been tried.
	checkFor(t, 30*time.Second, func() error {
		offline := map[string]bool{}
		for _, h := range recv.All() {
			if h.Data.State == "offline" {
				offline[h.Data.UserID] = true
			}
		}
		if len(offline) < len(onB) {
			return fmt.Errorf("offline tried for %v, want each of %v", offline, onB)
		}
		return nil
	})
	up.Store(true)

	all := append(append([]string(nil), onA...), onB...)
	want := 2 * len(all)
	checkFor(t, 40*time.Second, func() error {
		if n := len(recv.Delivered()); n < want {
			return fmt.Errorf("%d delivered, want %d", n, want)
		}
		return nil
	})
	recv.Check(t)
	got := recv.Delivered()
	sort.Slice(got, func(i, j int) bool { return got[i].Data.Version < got[j].Data.Version })
	per := map[string][]string{}
	count := map[string]int{}
	for _, h := range got {
		per[h.Data.UserID] = append(per[h.Data.UserID], h.Data.PreviousState+">"+h.Data.State)
		count[h.ID]++
		if h.Data.State == "online" && firstID[h.Data.UserID] != "" && h.ID != firstID[h.Data.UserID] {
			t.Fatalf("%s's online arrived as %s, was tried as %s", h.Data.UserID, h.ID, firstID[h.Data.UserID])
		}
	}
	for _, u := range all {
		if s := strings.Join(per[u], " "); s != "offline>online online>offline" {
			t.Fatalf("%s: delivered %q", u, s)
		}
	}
	for id, n := range count {
		if n != 1 {
			t.Fatalf("%s delivered %d times", id, n)
		}
	}
	if len(got) != want {
		t.Fatalf("%d delivered, want %d", len(got), want)
	}
	if !strings.Contains(b.log.String(), "claimed the events of a consumer gone silent") {
		t.Fatalf("b did not log the claim:\n%s", b.log.String())
	}
}
