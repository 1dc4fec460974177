package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/server"
)

func gapCount(t *testing.T, ts *testServer) string {
	t.Helper()
	_, body := ts.do("GET", "/metrics", "")
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "greendot_heartbeat_gap_seconds_count ") {
			return strings.TrimPrefix(l, "greendot_heartbeat_gap_seconds_count ")
		}
	}
	t.Fatal("no greendot_heartbeat_gap_seconds_count")
	return ""
}

// An empty text frame is a frame: a sign of life (one heartbeat gap
// observed) that costs a rate token and gets no error.
func TestEmptyTextFrameIsASignOfLife(t *testing.T) {
	ts := startServer(t, frozen, func(c *server.Config) { c.RateBurst = 5 })
	c := ts.dialSilent(t, "alice")
	if n := gapCount(t, ts); n != "0" {
		t.Fatalf("gaps before: %s", n)
	}
	for range 4 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := c.conn.Write(ctx, websocket.MessageText, nil); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	c.send(`{"type":"heartbeat","id":"h"}`) // the 5th token: acked, no error before it
	if ack := c.next("heartbeat_ack"); ack["id"] != "h" {
		t.Fatalf("ack: %v", ack)
	}
	if n := gapCount(t, ts); n != "5" {
		t.Fatalf("signs of life: %s, want 5 (4 empty frames and a heartbeat)", n)
	}
	c.send(`{"type":"heartbeat","id":"h2"}`)
	c.expectError("rate_limited")
}
