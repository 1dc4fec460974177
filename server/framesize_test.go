package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/server"
)

// The frame limit fits the largest query the contract allows: 500 ids of
// 128 bytes, each byte escaped in JSON. One byte more closes with 1009.
func TestFrameLimitFitsTheLargestQuery(t *testing.T) {
	ts := startServer(t, func(c *server.Config) { c.RateBurst = 50 }) // 500 ids cost 50 tokens
	c := ts.dialSilent(t, "alice")
	ids := make([]string, protocol.MaxQueryIDs)
	for i := range ids {
		p := fmt.Sprintf("%03d", i)
		ids[i] = p + strings.Repeat(`"\`, (protocol.MaxIDBytes-len(p))/2) + "x"
		if len(ids[i]) != protocol.MaxIDBytes || !protocol.ValidID(ids[i]) {
			t.Fatalf("id %d: %d bytes", i, len(ids[i]))
		}
	}
	frame, err := json.Marshal(map[string]any{"type": "query", "id": "q", "user_ids": ids})
	if err != nil {
		t.Fatal(err)
	}
	if len(frame) <= 4096 || len(frame) > protocol.MaxFrameSize {
		t.Fatalf("frame of %d bytes: not a test of the limit", len(frame))
	}
	c.send(string(frame))
	if r := c.next("query_result"); len(r["users"].([]any)) != protocol.MaxQueryIDs {
		t.Fatalf("users: %d", len(r["users"].([]any)))
	}

	sendOversized(t, c, protocol.MaxFrameSize+1)
	c.expectClosed(websocket.StatusMessageTooBig)
}

// sendOversized sends a text message of n bytes in fragments, so that the
// server's 1009 close meets no large unread frame (which would reset the
// connection and lose the close frame). Write errors after the limit are
// expected: the server stops reading there.
func sendOversized(t *testing.T, c *wsClient, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w, err := c.conn.Writer(ctx, websocket.MessageText)
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte(`{"type":"heartbeat","id":"` + strings.Repeat("x", n) + `"}`)[:n]
	for len(msg) > 0 {
		k := min(len(msg), 1024)
		if _, err := w.Write(msg[:k]); err != nil {
			return
		}
		msg = msg[k:]
	}
	_ = w.Close()
}
