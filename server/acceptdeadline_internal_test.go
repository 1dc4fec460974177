package server

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/lesismal/nbio"
	"github.com/lesismal/nbio/nbhttp"

	"github.com/greendot/greendot/store/memstore"
)

// nbio's accept puts a socket on its poller and then sets its read
// deadline (the handshake timeout); under load the poller read the
// upgrade request and a worker accepted it in between, and the WebSocket
// was closed with "read timeout" a handshake timeout later. Here the
// accept sets the deadline again once the upgrade is accepted, the order
// a slow accept goroutine gives: the connection must outlive it.
func TestDeadlineSetAfterTheUpgradeIsCleared(t *testing.T) {
	const handshake = 200 * time.Millisecond
	st, err := memstore.New(memstore.Config{TTL: 10 * time.Second, Grace: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Addr: "127.0.0.1:0", Store: st, NodeID: "test", TTL: 10 * time.Second,
		HeartbeatInterval: time.Second, HandshakeTimeout: handshake,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	add := s.addConn
	late := make(chan error, 1)
	s.addConn = func(hc *nbhttp.Conn, decrease func()) {
		add(hc, decrease)
		nc := hc.Conn.(*nbio.Conn)
		// Wait, as a descheduled accept goroutine would, until the upgrade
		// is accepted (the handler counts the socket authenticated).
		deadline := time.Now().Add(5 * time.Second)
		for !s.adm.isAuthenticated(nc) {
			if time.Now().After(deadline) {
				late <- errorString("the upgrade was not accepted within 5s")
				return
			}
			time.Sleep(time.Millisecond)
		}
		late <- nc.SetReadDeadline(time.Now().Add(handshake)) // what nbio's accept does last
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	stopAtEnd(t, s)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws://"+s.Addr()+"/v1/connect?user=alice", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	frames := make(chan string, 16)
	readErr := make(chan error, 1)
	go func() {
		for {
			_, data, err := conn.Read(ctx)
			if err != nil {
				readErr <- err
				return
			}
			var f struct{ Type string }
			_ = json.Unmarshal(data, &f)
			frames <- f.Type
		}
	}()
	if err := <-late; err != nil {
		t.Fatal(err)
	}
	// Four handshake timeouts after the late deadline: nothing may have
	// closed the connection, and a heartbeat is still answered.
	quiet := time.After(4 * handshake)
	for waiting := true; waiting; {
		select {
		case err := <-readErr:
			t.Fatalf("the connection ended %v after the accept's late deadline: %v", handshake, err)
		case <-frames: // welcome, snapshot
		case <-quiet:
			waiting = false
		}
	}
	if err := conn.Write(ctx, websocket.MessageText, []byte(`{"type":"heartbeat","id":1}`)); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case err := <-readErr:
			t.Fatalf("the connection ended: %v", err)
		case typ := <-frames:
			if typ == "heartbeat_ack" {
				return
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no heartbeat_ack within 5s")
		}
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }

// isAuthenticated reports whether c's upgrade (or API key) was accepted.
func (a *admission) isAuthenticated(c *nbio.Conn) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	ad := a.conns[c]
	return ad != nil && ad.authed
}
