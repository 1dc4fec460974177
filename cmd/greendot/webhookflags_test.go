package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/internal/hooktest"
	"github.com/greendot/greendot/internal/nodetest"
	"github.com/greendot/greendot/internal/testwait"
)

func TestWebhookFlagsAreChecked(t *testing.T) {
	url := []string{"--webhook-url", "https://hooks.example.com/presence"}
	sec := []string{"--webhook-secret", hooktest.Secret}
	for _, c := range []struct {
		args []string
		want string
	}{
		{url, "greendot: --webhook-url needs --webhook-secret (whsec_<base64>) to sign the webhooks\n"},
		{sec, "greendot: --webhook-secret without --webhook-url: set both to send webhooks\n"},
		{append([]string{"--webhook-url", "hooks.example.com"}, sec...), `greendot: --webhook-url "hooks.example.com": want an absolute http:// or https:// URL` + "\n"},
		{append(url, "--webhook-secret", "whsec_???"), "greendot: --webhook-secret: webhook secret is not whsec_<base64>"},
		{append(append(url, sec...), "--webhook-queue", "0"), "greendot: --webhook-queue must be at least 1, got 0\n"},
		{append(append(url, sec...), "--webhook-retry-for", "0s"), "greendot: --webhook-retry-for must be positive, got 0s\n"},
		{append(append(url, sec...), "--webhook-timeout", "-1s"), "greendot: --webhook-timeout must be positive, got -1s\n"},
	} {
		r := runGreendot(t, nil, append([]string{"serve"}, c.args...)...)
		if r.code != 1 || !strings.HasPrefix(r.stderr, c.want) || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%q: exit %d, stderr:\n%s\nwant exit 1 and %q", c.args, r.code, r.stderr, c.want)
		}
	}
}

// A node on the memory store sends the webhooks of a user's online and
// offline to a real receiver, signed, and exports the webhook metrics.
func TestWebhooksFromAMemoryNode(t *testing.T) {
	t.Setenv("GREENDOT_TEST_MAIN", "1")
	recv := hooktest.Start(t)
	t.Setenv("GREENDOT_WEBHOOK_SECRET", hooktest.Secret)
	node := nodetest.Start(t, os.Args[0], "webhooks", "--webhook-url", recv.URL(), "--offline-grace", "200ms")
	if code, body := connect(t, node.Addr, "alice", nil); code != 101 {
		t.Fatalf("connect: %d %s", code, body)
	}
	testwait.For(t, 10*time.Second, func() error {
		if n := len(recv.Delivered()); n != 1 {
			return fmt.Errorf("%d webhooks, want alice's online", n)
		}
		return nil
	})
	h := recv.Delivered()[0]
	recv.Check(t)
	if h.Data.UserID != "alice" || h.Data.State != "online" || h.Data.PreviousState != "offline" {
		t.Fatalf("webhook %s", h.Body)
	}
	waitMetrics(t, node.Addr, `greendot_webhook_deliveries_total{outcome="delivered"} 1`, "greendot_webhook_queue_depth",
		"greendot_webhook_oldest_event_age_seconds", "greendot_webhook_retries_total", `greendot_webhook_attempts_total{result="timeout"} 0`)
}

// waitMetrics waits until the node's /metrics holds every line part want.
// A webhook receiver holds a delivery before the sender has its answer and
// counts it, so a count read at once may be one short.
func waitMetrics(t *testing.T, addr string, want ...string) {
	t.Helper()
	testwait.For(t, 5*time.Second, func() error {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, m := range want {
			if !strings.Contains(string(b), m) {
				return fmt.Errorf("/metrics lacks %s", m)
			}
		}
		return nil
	})
}

func TestPusherWebhookFlagsAreChecked(t *testing.T) {
	url := []string{"--pusher-webhook-url", "https://hooks.example.com/pusher"}
	app := []string{"--pusher-app-id", "1", "--pusher-key", "key", "--pusher-secret", "secret"}
	with := func(a ...[]string) []string {
		var out []string
		for _, x := range a {
			out = append(out, x...)
		}
		return out
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{url, "greendot: --pusher-webhook-url needs --pusher-app-id, --pusher-key and --pusher-secret (the secret signs the webhooks)\n"},
		{with(url, []string{"--pusher-app-id", "1", "--pusher-key", "key"}), "greendot: --pusher-webhook-url needs --pusher-app-id, --pusher-key and --pusher-secret (the secret signs the webhooks)\n"},
		{with([]string{"--pusher-webhook-url", "hooks.example.com"}, app), `greendot: --pusher-webhook-url "hooks.example.com": want an absolute http:// or https:// URL` + "\n"},
		{with(url, app, []string{"--webhook-queue", "0"}), "greendot: --webhook-queue must be at least 1, got 0\n"},
		{with(url, app, []string{"--webhook-retry-for", "0s"}), "greendot: --webhook-retry-for must be positive, got 0s\n"},
		{with(url, app, []string{"--webhook-url", "https://hooks.example.com/presence"}), "greendot: --webhook-url needs --webhook-secret (whsec_<base64>) to sign the webhooks\n"},
	} {
		r := runGreendot(t, nil, append([]string{"serve"}, c.args...)...)
		if r.code != 1 || !strings.HasPrefix(r.stderr, c.want) || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%q: exit %d, stderr:\n%s\nwant exit 1 and %q", c.args, r.code, r.stderr, c.want)
		}
	}
}

// A node on the memory store with both formats on sends each receiver its
// own: a presence.changed per change, and Pusher's member_added then
// member_removed after the grace; both kinds of metrics are exported.
func TestBothWebhookFormatsFromAMemoryNode(t *testing.T) {
	t.Setenv("GREENDOT_TEST_MAIN", "1")
	recv := hooktest.Start(t)
	precv := hooktest.StartPusher(t)
	t.Setenv("GREENDOT_WEBHOOK_SECRET", hooktest.Secret)
	node := nodetest.Start(t, os.Args[0], "webhooks", "--webhook-url", recv.URL(), "--offline-grace", "200ms",
		"--pusher-app-id", "1", "--pusher-key", hooktest.PusherKey, "--pusher-secret", hooktest.PusherSecret,
		"--pusher-webhook-url", precv.URL())
	req, _ := http.NewRequest("PUT", "http://"+node.Addr+"/v1/teams/eng/members/alice", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 204 {
		t.Fatalf("join: %v %v", resp, err)
	}
	resp.Body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws://"+node.Addr+"/v1/connect?user=alice", nil)
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, func() error {
		if n := len(precv.Delivered()); n != 1 {
			return fmt.Errorf("%d Pusher webhooks, want alice's member_added", n)
		}
		return nil
	})
	_ = conn.CloseNow()
	testwait.For(t, 10*time.Second, func() error {
		if n, m := len(recv.Delivered()), len(precv.Delivered()); n != 2 || m != 2 {
			return fmt.Errorf("%d native and %d Pusher webhooks, want 2 each", n, m)
		}
		return nil
	})
	recv.Check(t)
	precv.Check(t)
	var got []string
	for _, h := range precv.Delivered() {
		for _, e := range h.Events {
			got = append(got, strings.TrimSpace(e.Name+" "+e.Channel+" "+e.UserID))
		}
	}
	if s := strings.Join(got, ","); s != "channel_occupied presence-eng,member_added presence-eng alice,"+
		"member_removed presence-eng alice,channel_vacated presence-eng" {
		t.Fatalf("Pusher events %s", s)
	}
	waitMetrics(t, node.Addr, `greendot_webhook_deliveries_total{outcome="delivered"} 2`,
		`greendot_pusher_webhook_deliveries_total{outcome="delivered"} 2`, "greendot_pusher_webhook_queue_depth")
}
