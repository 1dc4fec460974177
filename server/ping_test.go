package server_test

import (
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/server"
	"github.com/greendot/greendot/store/memstore"
)

// dialPongOnly connects as user and sends nothing after the handshake, but
// answers the server's pings, as a browser tab whose timers are throttled does.
func (ts *testServer) dialPongOnly(t *testing.T, user string) *wsClient {
	t.Helper()
	c, resp, err := ts.dialRaw(t, "user="+user)
	if err != nil {
		t.Fatalf("dial %s: %v (%v)", user, err, resp)
	}
	c.answerPings.Store(true) // before the first ping: one comes after a whole ping interval
	c.name = user
	c.welcome = c.next("welcome")
	c.snap = c.next("snapshot")
	return c
}

// A client that sends no frame but answers pings stays online past the ttl.
func TestPongsKeepAConnectionLive(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob")
	alice := ts.dial(t, "alice")
	bob := ts.dialPongOnly(t, "bob")
	alice.expectChanges(time.Second, "bob=online")
	alice.expectQuiet(2*testTTL + testGrace)
	if p := ts.presenceOf("bob"); p["state"] != "online" || p["connection_count"] != 1.0 {
		t.Fatalf("bob = %v after 2 ttl of pongs only, want online on 1 connection", p)
	}
	// Pinged at each interval of silence: the pongs, not luck, kept bob.
	if n, want := bob.pings.Load(), int64(2*testTTL/testHeartbeat/2); n < want {
		t.Fatalf("bob got %d pings in 2 ttl, want at least %d", n, want)
	}
	select {
	case f, ok := <-bob.frames:
		t.Fatalf("bob: frame %v (open %v, close %v), want nothing", f, ok, bob.closeStatus())
	default:
	}
}

// A client that neither sends frames nor answers pings expires after the ttl.
func TestUnansweredPingsExpire(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob")
	alice := ts.dial(t, "alice")
	start := time.Now()
	bob := ts.dialSilent(t, "bob")
	alice.expectChanges(time.Second, "bob=online")
	alice.expectChanges(testTTL+testGrace+time.Second, "bob=offline")
	if took := time.Since(start); took < testTTL+testGrace {
		t.Fatalf("offline after %v, before ttl+grace", took)
	}
	if bob.pings.Load() == 0 {
		t.Fatal("bob was never pinged: the test proves nothing")
	}
	bob.expectClosed(websocket.StatusCode(-1))
}

// A client that heartbeats is not pinged: pings cost only the silent.
func TestHeartbeatingClientIsNotPinged(t *testing.T) {
	ts := startServer(t, func(c *server.Config) { c.PingInterval = time.Second })
	alice := ts.dialSilent(t, "alice")
	alice.heartbeatEvery(100 * time.Millisecond)
	quiet := ts.dialPongOnly(t, "quiet") // the control: silent, so pinged
	checkFor(t, 10*time.Second, func() error {
		if quiet.pings.Load() < 3 {
			return errorf("quiet got %d pings", quiet.pings.Load())
		}
		return nil
	})
	if n := alice.pings.Load(); n != 0 {
		t.Fatalf("alice, heartbeating every 100ms, got %d pings at a 1s ping interval", n)
	}
}

func TestPingIntervalMustBeBelowTTL(t *testing.T) {
	st, err := memstore.New(memstore.Config{TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	_, err = server.New(server.Config{Store: st, TTL: 2 * time.Second, HeartbeatInterval: time.Second, PingInterval: 2 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "ping interval (2s) must be below the ttl (2s)") {
		t.Fatalf("New = %v, want the ping interval refused", err)
	}
}
