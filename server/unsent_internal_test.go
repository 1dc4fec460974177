package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/store/memstore"
)

// wsFrameLen must match what nbio writes, to the byte: counting too much
// would leave a reader that read everything stalled for good (and closed as
// stuck), too little would let frames pile up in nbio.
func TestWSFrameLen(t *testing.T) {
	for _, tc := range []struct{ n, max, want int }{
		{0, 32 << 10, 2},
		{125, 32 << 10, 127},
		{126, 32 << 10, 130},
		{65535, 1 << 20, 65539},
		{65536, 1 << 20, 65546},
		{32 << 10, 32 << 10, 32<<10 + 4},
		{32<<10 + 1, 32 << 10, 32<<10 + 4 + 1 + 2},
		{100 << 10, 32 << 10, 100<<10 + 3*4 + 4},
	} {
		if got := wsFrameLen(tc.n, tc.max); got != int64(tc.want) {
			t.Errorf("wsFrameLen(%d, %d) = %d, want %d", tc.n, tc.max, got, tc.want)
		}
	}
}

// Once a reader has read everything, its count of unsent bytes is back to
// 0: every kind of frame the server writes (welcome, snapshot, acks, a
// fragmented query result, pongs, pings, changes) is counted as nbio writes
// it.
func TestUnsentIsZeroOnceAllIsRead(t *testing.T) {
	s, st := startInternal(t, 50*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, u := range []string{"alice", "bob"} {
		if err := st.AddMember(ctx, "t1", u); err != nil {
			t.Fatal(err)
		}
	}
	var bobPings atomic.Int64
	dial := func(user string) *websocket.Conn {
		c, _, err := websocket.Dial(ctx, "ws://"+s.Addr()+"/v1/connect?user="+user, &websocket.DialOptions{
			OnPingReceived: func(context.Context, []byte) bool {
				if user == "bob" {
					bobPings.Add(1)
				}
				return true
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadLimit(1 << 20)
		t.Cleanup(func() { _ = c.CloseNow() })
		return c
	}
	alice := dial("alice")
	read := func(c *websocket.Conn, typ string) []byte {
		t.Helper()
		for {
			_, b, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("waiting for %s: %v", typ, err)
			}
			if strings.Contains(string(b), `"type":"`+typ+`"`) {
				return b
			}
		}
	}
	read(alice, "snapshot")
	bob := dial("bob")
	read(bob, "snapshot")
	read(alice, "presence") // bob online

	ids := make([]string, 500)
	for i := range ids {
		ids[i] = fmt.Sprintf("%0120d", i)
	}
	q, _ := json.Marshal(map[string]any{"type": "query", "id": "q", "user_ids": ids})
	if err := alice.Write(ctx, websocket.MessageText, q); err != nil {
		t.Fatal(err)
	}
	if b := read(alice, "query_result"); len(b) <= 64<<10 {
		t.Fatalf("query result of %d bytes: want one past a frame's 32 KiB, and 64 KiB", len(b))
	}
	if err := alice.Write(ctx, websocket.MessageText, []byte(`{"type":"heartbeat","id":1}`)); err != nil {
		t.Fatal(err)
	}
	read(alice, "heartbeat_ack")
	// From here on alice and bob read in the background: alice's ping gets
	// its pong, and the silent bob the server's pings.
	readers := make(chan struct{}, 2)
	for _, c := range []*websocket.Conn{alice, bob} {
		go func() {
			defer func() { readers <- struct{}{} }()
			for {
				if _, _, err := c.Read(ctx); err != nil {
					return
				}
			}
		}()
	}
	defer func() { cancel(); <-readers; <-readers }()
	if err := alice.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, func() error {
		if n := bobPings.Load(); n < 3 {
			return fmt.Errorf("bob was pinged %d times, want 3", n)
		}
		return nil
	})
	testwait.For(t, 5*time.Second, func() error {
		s.hub.mu.RLock()
		defer s.hub.mu.RUnlock()
		for _, lu := range s.hub.users {
			for _, c := range lu.conns {
				if n := c.unsent.Load(); n != 0 {
					return fmt.Errorf("%s: %d bytes unsent", c.user, n)
				}
				if c.backlogSince.Load() != 0 || c.stalled.Load() {
					return fmt.Errorf("%s: backlog dated or stalled after draining", c.user)
				}
			}
		}
		return nil
	})
}

// Every socket's walker (which also holds the client onWritten counts) is
// gone once the socket closes, however it closed: none is left behind.
func TestWalkersGoWithTheirSockets(t *testing.T) {
	s, _ := startInternal(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 40
	conns := make([]*websocket.Conn, n)
	for i := range conns {
		c, _, err := websocket.Dial(ctx, fmt.Sprintf("ws://%s/v1/connect?user=u%d", s.Addr(), i), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.Read(ctx); err != nil { // the welcome: registered
			t.Fatal(err)
		}
		conns[i] = c
	}
	if got := s.walkers.len(); got != n {
		t.Fatalf("%d walkers for %d open sockets", got, n)
	}
	for i, c := range conns {
		if i%2 == 0 {
			_ = c.Close(websocket.StatusNormalClosure, "bye")
		} else {
			_ = c.CloseNow() // a dropped TCP connection
		}
	}
	testwait.For(t, 5*time.Second, func() error {
		if got := s.walkers.len(); got != 0 {
			return fmt.Errorf("%d walkers left after every socket closed", got)
		}
		return nil
	})
}

// startInternal starts a server on the memory store (ttl 2 s, grace
// 400 ms, heartbeats every 300 ms), pinging silent sockets every ping
// (0: the heartbeat interval), stopped when the test ends.
func startInternal(t *testing.T, ping time.Duration) (*Server, *memstore.Store) {
	t.Helper()
	st, err := memstore.New(memstore.Config{TTL: 2 * time.Second, Grace: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Addr: "127.0.0.1:0", Store: st, NodeID: "test", TTL: 2 * time.Second,
		HeartbeatInterval: 300 * time.Millisecond, PingInterval: ping, RateBurst: 100,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	stopAtEnd(t, s)
	return s, st
}

// stopAtEnd shuts s down when the test ends.
func stopAtEnd(t *testing.T, s *Server) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
}
