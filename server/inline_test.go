package server_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/server"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/memstore"
)

// A heartbeat that arrives alone in a read is handled on the poller
// (inline.go): these check it keeps what the usual way does.

// A whole text frame in the middle of a fragmented message breaks RFC 6455
// even when it is a heartbeat: it is not acked, the connection is closed.
func TestHeartbeatInsideFragmentsIsNotAcked(t *testing.T) {
	ts := startServer(t)
	w := dialRawWS(t, ts, "alice")
	msg := []byte(`{"type":"heartbeat","id":7}`)
	// The first fragment and a ping: the pong shows the fragment was read.
	if _, err := w.c.Write(append(rawFrame(0x01, msg[:10], false), rawFrame(0x89, []byte("p"), false)...)); err != nil {
		t.Fatal(err)
	}
	for { // the snapshot may come first
		if op, _ := w.read(t); op == 0xa {
			break
		}
	}
	if _, err := w.c.Write(rawFrame(0x81, []byte(`{"type":"heartbeat","id":9}`), false)); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := w.br.Peek(1); err != nil {
			return // closed, unacked
		}
		op, p := w.read(t)
		if op == 8 {
			return
		}
		if op == 1 {
			t.Fatalf("got %s, want the connection closed", p)
		}
	}
}

// forgetfulStore forgets a connection at the next heartbeat, as a store
// that expired or lost it does.
type forgetfulStore struct {
	*memstore.Store
	forget   atomic.Bool
	connects atomic.Int64
}

func (s *forgetfulStore) Heartbeat(ctx context.Context, id string) error {
	if s.forget.Swap(false) {
		return store.ErrUnknownConn
	}
	return s.Store.Heartbeat(ctx, id)
}

func (s *forgetfulStore) Connect(ctx context.Context, c presence.Conn) error {
	s.connects.Add(1)
	return s.Store.Connect(ctx, c)
}

// A connection the store no longer knows is asserted again at its next
// heartbeat, and the heartbeat is still acked.
func TestHeartbeatOfAForgottenConnectionAssertsItAgain(t *testing.T) {
	mem, err := memstore.New(memstore.Config{TTL: testTTL, Grace: testGrace})
	if err != nil {
		t.Fatal(err)
	}
	st := &forgetfulStore{Store: mem}
	ts := startServer(t, func(c *server.Config) { c.Store = st })
	w := dialRawWS(t, ts, "alice")
	if n := st.connects.Load(); n != 1 {
		t.Fatalf("%d connects, want 1", n)
	}
	beat := func(id string) {
		t.Helper()
		if _, err := w.c.Write(rawFrame(0x81, []byte(`{"type":"heartbeat","id":`+id+`}`), false)); err != nil {
			t.Fatal(err)
		}
		for {
			op, p := w.read(t)
			if op == 1 && string(p) == `{"type":"heartbeat_ack","id":`+id+`}` {
				return
			}
		}
	}
	// Acked after the connect's job is done (it sends the snapshot first):
	// the next heartbeat finds nothing queued and is handled on the poller.
	beat("1")
	st.forget.Store(true)
	beat("3")
	checkFor(t, 2*time.Second, func() error {
		if n := st.connects.Load(); n != 2 {
			return errorf("%d connects, want 2: the re-assertion", n)
		}
		return nil
	})
}
