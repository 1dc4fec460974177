package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

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
	resp, err := http.Get("http://" + node.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{`greendot_webhook_deliveries_total{outcome="delivered"} 1`, "greendot_webhook_queue_depth",
		"greendot_webhook_oldest_event_age_seconds", "greendot_webhook_retries_total", `greendot_webhook_attempts_total{result="timeout"} 0`} {
		if !strings.Contains(string(b), m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
}
