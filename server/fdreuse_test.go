package server_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestConnectsAmidCloses churns connects while the server closes other
// sockets off its poller as their peers send FIN: a close handshake (the
// server answers and closes the socket, the client closes its own on the
// answer) and a kick (a binary frame closes with 1003, and the client
// drops its socket at once). Each socket the server closes off its poller
// while the poller holds its peer's FIN used to pass that FIN to the next
// accepted socket, given the same descriptor number, which was closed
// unanswered: the client's handshake got EOF (the known issue of
// BenchmarkConnect). Every connect must be answered.
func TestConnectsAmidCloses(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test")
	}
	ts := startServer(t)
	churn(t, 16, 2000, func(w, i int) error {
		return connectThenClose(ts.addr, fmt.Sprintf("u%d-%d", w, i), (w+i)%2 == 1)
	})
}

// churn runs connect perWorker times on each of workers goroutines, for
// 20 s at most (-race on a loaded machine is far slower), and fails the
// test on any error.
func churn(t *testing.T, workers, perWorker int, connect func(w, i int) error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var (
		connects atomic.Int64
		failed   atomic.Int64
		mu       sync.Mutex
		errs     []string
		wg       sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWorker && time.Now().Before(deadline); i++ {
				connects.Add(1)
				if err := connect(w, i); err != nil {
					failed.Add(1)
					mu.Lock()
					if len(errs) < 5 {
						errs = append(errs, fmt.Sprintf("worker %d, connect %d: %v", w, i, err))
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d connects", connects.Load())
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d connects not answered, e.g. %v", n, connects.Load(), errs)
	}
}

// connectThenClose connects as user, reads welcome and snapshot, then
// closes: with a close handshake, or (kick) by sending a binary frame,
// which the server closes with 1003, and dropping the socket.
func connectThenClose(addr, user string, kick bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+addr+"/v1/connect?user="+user, nil)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	_, data, err := c.Read(ctx)
	if err != nil {
		return fmt.Errorf("read welcome: %w", err)
	}
	if !bytes.Contains(data, []byte(`"welcome"`)) {
		return fmt.Errorf("first frame %q, want welcome", data)
	}
	// And the snapshot: the server writes nothing more unasked, so no
	// write of its fails on the dropped socket (TestConnectsAmidResets
	// covers those).
	for !bytes.Contains(data[:min(len(data), 32)], []byte(`"snapshot"`)) {
		if _, data, err = c.Read(ctx); err != nil {
			return fmt.Errorf("read snapshot: %w", err)
		}
	}
	if kick {
		if err := c.Write(ctx, websocket.MessageBinary, []byte{0}); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		return nil // CloseNow drops the socket as the server closes it
	}
	_ = c.Close(websocket.StatusNormalClosure, "")
	return nil
}

// TestConnectsAmidResets churns connects while clients drop theirs the
// moment they are upgraded, unread: the socket is reset, and the server's
// write of the welcome or the snapshot fails. nbio closes a socket whose
// write failed itself, on the writing goroutine, off its poller; while
// the poller held the reset's event, the next accepted socket took the
// same number and was handed that event, and was closed unanswered (a
// refused connect's client saw EOF in TestJWTAudienceAndIssuerFlags). The
// patched nbio (third_party/nbio) tags each registration. Every connect
// must be answered.
func TestConnectsAmidResets(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test")
	}
	ts := startServer(t)
	churn(t, 8, 1500, func(w, i int) error {
		return connectThenReset(ts.addr, fmt.Sprintf("u%d-%d", w, i))
	})
}

// connectThenReset connects as user and drops the socket at once.
func connectThenReset(addr, user string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+addr+"/v1/connect?user="+user, nil)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	return c.CloseNow()
}
