package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/protocol"
)

// ---- the pure parts ----

func TestPresenceMap(t *testing.T) {
	now := time.Unix(1764500000, 0)
	us := func(id, state string, v uint64) protocol.UserState {
		return protocol.UserState{UserID: id, State: state, Version: v}
	}
	ch := func(id, state string, v uint64) protocol.Change {
		return protocol.Change{UserID: id, State: state, Version: v, At: now.UnixMilli()}
	}
	summary := func(changes []Change) string {
		var parts []string
		for _, c := range changes {
			parts = append(parts, fmt.Sprintf("%s=%s@%d", c.UserID, c.State, c.Version))
		}
		return strings.Join(parts, " ")
	}

	m := newPresenceMap()
	if got := summary(m.applySnapshot([]protocol.UserState{us("carol", "away", 2), us("bob", "online", 5)}, now)); got != "bob=online@5 carol=away@2" {
		t.Fatalf("first snapshot changes: %q", got)
	}
	steps := []struct {
		name    string
		changes []protocol.Change
		want    string // the changes applied
	}{
		{"older version dropped", []protocol.Change{ch("bob", "offline", 3)}, ""},
		{"same version dropped", []protocol.Change{ch("bob", "away", 5)}, ""},
		{"newer versions applied in order", []protocol.Change{ch("bob", "away", 7), ch("bob", "online", 6), ch("carol", "online", 3)}, "bob=away@7 carol=online@3"},
		{"unknown user applied", []protocol.Change{ch("dave", "online", 1)}, "dave=online@1"},
		{"offline kept as a tombstone", []protocol.Change{ch("dave", "offline", 2)}, "dave=offline@2"},
		{"stale online cannot resurrect", []protocol.Change{ch("dave", "online", 1)}, ""},
	}
	for _, step := range steps {
		if got := summary(m.applyChanges(step.changes, now)); got != step.want {
			t.Errorf("%s: applied %q, want %q", step.name, got, step.want)
		}
	}
	if got := m.applyChanges([]protocol.Change{ch("carol", "away", 4)}, now); len(got) != 1 || got[0].Previous != "online" {
		t.Errorf("carol's change %+v, want Previous online", got)
	}
	if s, ok := m.get("bob"); !ok || s.State != "away" || s.Version != 7 || !s.At.Equal(now) {
		t.Errorf("bob = %+v, %v", s, ok)
	}
	if s, ok := m.get("dave"); !ok || s.State != "offline" {
		t.Errorf("dave = %+v, %v; want an offline tombstone", s, ok)
	}
	if got := fmt.Sprint(m.all()); !strings.Contains(got, "bob") || strings.Contains(got, "dave") {
		t.Errorf("all() = %v: want online and away users only", got)
	}

	// A restarted server counts again from 1: the snapshot replaces
	// everything, and whoever it no longer lists went offline.
	got := summary(m.applySnapshot([]protocol.UserState{us("bob", "away", 1), us("erin", "online", 1)}, now))
	if got != "carol=offline@4 erin=online@1" {
		t.Errorf("reconnect snapshot changes: %q", got)
	}
	if got := summary(m.applyChanges([]protocol.Change{ch("bob", "online", 2), ch("dave", "online", 1)}, now)); got != "bob=online@2 dave=online@1" {
		t.Errorf("after the new snapshot: applied %q", got)
	}
}

func TestChangeQueueCoalescesPerUser(t *testing.T) {
	q := newChangeQueue(2)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { q.run(stop); close(done) }()
	defer func() { close(stop); <-done }()

	// No reader: pushing must never block, whatever the volume.
	for v := uint64(1); v <= 1000; v++ {
		q.push([]Change{
			{UserID: "bob", State: "online", Version: v},
			{UserID: "carol", State: "online", Version: v},
		})
	}
	latest := map[string]uint64{}
	checkFor(t, 2*time.Second, func() error {
		for {
			select {
			case ch := <-q.out:
				if ch.Version <= latest[ch.UserID] {
					return fmt.Errorf("%s version %d after %d", ch.UserID, ch.Version, latest[ch.UserID])
				}
				latest[ch.UserID] = ch.Version
				continue
			default:
			}
			if latest["bob"] != 1000 || latest["carol"] != 1000 {
				return fmt.Errorf("latest seen %v, want 1000 each", latest)
			}
			return nil
		}
	})
	if n := q.coalescedCount(); n < 1900 {
		t.Errorf("coalesced %d of 2000 changes; the buffer holds 2, so most should be", n)
	}
}

func TestBackoffFullJitter(t *testing.T) {
	base, max := 100*time.Millisecond, 2*time.Second
	for attempt, ceiling := range []time.Duration{100, 200, 400, 800, 1600, 2000, 2000} {
		ceiling *= time.Millisecond
		if attempt == 6 {
			attempt = 60 // no overflow far out
		}
		seen := map[time.Duration]bool{}
		for range 200 {
			d := backoffDelay(base, max, attempt)
			if d < 0 || d >= ceiling {
				t.Fatalf("attempt %d: delay %v outside [0, %v)", attempt, d, ceiling)
			}
			seen[d] = true
		}
		if len(seen) < 100 {
			t.Errorf("attempt %d: only %d distinct delays in 200: not jittered", attempt, len(seen))
		}
	}
}

func TestHeartbeatGapJitter(t *testing.T) {
	interval := 10 * time.Second
	lo, hi := interval, time.Duration(0)
	for range 1000 {
		g := heartbeatGap(interval)
		if g < 7*time.Second || g > interval {
			t.Fatalf("gap %v outside [7s, 10s]", g)
		}
		lo, hi = min(lo, g), max(hi, g)
	}
	if lo > 7300*time.Millisecond || hi < 9700*time.Millisecond {
		t.Errorf("gaps spanned only [%v, %v] of [7s, 10s]", lo, hi)
	}
}

// ---- against a scripted server ----

// TestVersionOrderingOnTheWire feeds stale versions the way a lagging node
// could and checks that the client drops them.
func TestVersionOrderingOnTheWire(t *testing.T) {
	change := func(id, state string, v uint64) protocol.Presence {
		return protocol.Presence{Type: protocol.TypePresence, Changes: []protocol.Change{{UserID: id, State: state, Version: v, At: time.Now().UnixMilli()}}}
	}
	fs := newFakeServer(t, func(n int, c *fakeConn) {
		c.hello(60000, 150000, protocol.UserState{UserID: "bob", State: "online", Version: 5})
		c.send(change("bob", "offline", 3)) // older: dropped
		c.send(change("bob", "away", 5))    // same: dropped
		c.send(change("bob", "away", 7))    // newer: applied
		c.send(change("bob", "online", 6))  // older again: dropped
		c.send(change("dave", "online", 1)) // marker: all of the above was read
		c.drain()
	})
	var rec recorder
	opts := testOptions(t, "alice")
	rec.hook(&opts)
	c := dial(t, fs.url(), opts)
	expectState(t, c, "dave", "online")
	if s, _ := c.Get("bob"); s.State != "away" || s.Version != 7 {
		t.Errorf("bob = %+v, want away at version 7", s)
	}
	var got []string
	for _, ch := range rec.changesFor("bob") {
		got = append(got, fmt.Sprintf("%s@%d", ch.State, ch.Version))
	}
	if want := []string{"online@5", "away@7"}; !slices.Equal(got, want) {
		t.Errorf("changes for bob %v, want %v", got, want)
	}
}

// TestServerDirectedReconnects: a reconnect frame is honoured after its
// delay, a bare 1012 is retried, and a 4001 fetches a fresh token at once.
func TestServerDirectedReconnects(t *testing.T) {
	const advised = 400 * time.Millisecond
	type conn struct {
		at    time.Time
		token string
	}
	conns := make(chan conn, 10)
	fs := newFakeServer(t, func(n int, c *fakeConn) {
		conns <- conn{time.Now(), c.req.Header.Get("Authorization")}
		c.hello(60000, 150000)
		switch n {
		case 0:
			c.send(protocol.Reconnect{Type: protocol.TypeReconnect, AfterMS: advised.Milliseconds()})
			c.Close(protocol.CloseServiceRestart, "draining")
		case 1:
			c.Close(protocol.CloseServiceRestart, "draining")
		case 2:
			c.Close(protocol.CloseTokenExpired, "token expired")
		default:
			c.drain()
		}
	})
	tokens := 0
	var rec recorder
	opts := testOptions(t, "")
	opts.TokenFunc = func(context.Context) (string, error) { tokens++; return fmt.Sprint("token-", tokens), nil }
	rec.hook(&opts)
	dial(t, fs.url(), opts)

	var got []conn
	for len(got) < 4 {
		select {
		case c := <-conns:
			got = append(got, c)
		case <-time.After(5 * time.Second):
			t.Fatalf("%d connections, want 4; session ends %v", len(got), rec.closeCodes())
		}
	}
	if gap := got[1].at.Sub(got[0].at); gap < advised {
		t.Errorf("reconnected %v after a reconnect frame advising %v", gap, advised)
	}
	if gap := got[3].at.Sub(got[2].at); gap > 300*time.Millisecond {
		t.Errorf("reconnect after 4001 took %v; want it at once", gap)
	}
	for i, c := range got {
		if want := fmt.Sprint("Bearer token-", i+1); c.token != want {
			t.Errorf("connection %d carried %q, want %q", i, c.token, want)
		}
	}
	if codes := rec.closeCodes(); len(codes) < 3 || !slices.Equal(codes[:3], []int{1012, 1012, 4001}) {
		t.Errorf("close codes seen %v, want 1012 1012 4001", codes)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var reported []string
	for _, sc := range rec.states {
		if sc.State == Disconnected {
			reported = append(reported, fmt.Sprint(sc.CloseCode))
			if sc.Err == nil || sc.Retry > advised*2+restartJitter { // a bare 1012 waits up to restartJitter
				t.Errorf("state change %+v: want a cause and a short retry", sc)
			}
		}
	}
	if got := strings.Join(reported, " "); !strings.HasPrefix(got, "1012 1012 4001") {
		t.Errorf("OnStateChange reported disconnects with codes %q, want 1012 1012 4001", got)
	}
}

// TestSilentServerIsLeft: heartbeats ask for acks; a server that stays
// silent past the ttl is considered gone and the client reconnects.
func TestSilentServerIsLeft(t *testing.T) {
	fs := newFakeServer(t, func(n int, c *fakeConn) {
		c.hello(100, 300)
		c.drain() // never acks
	})
	var rec recorder
	opts := testOptions(t, "alice")
	rec.hook(&opts)
	dial(t, fs.url(), opts)
	checkFor(t, 5*time.Second, func() error {
		if fs.connections() < 2 || !rec.endedWith(ErrServerSilent) {
			return fmt.Errorf("%d connections: want a reconnect after silence", fs.connections())
		}
		return nil
	})
}

// A write that cannot go through within WriteTimeout (the path is stuck)
// ends the connection with ErrWriteTimeout as its cause, not with the
// reader's "use of closed network connection" once the connection closed;
// the client reconnects.
func TestStuckWriteEndsWithWriteTimeout(t *testing.T) {
	fs := newFakeServer(t, func(n int, c *fakeConn) {
		c.hello(20, 60000)
		c.drain()
	})
	var dials atomic.Int64
	stuck := &stuckConns{}
	opts := testOptions(t, "alice")
	opts.WriteTimeout = 200 * time.Millisecond
	opts.HTTPClient = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil || dials.Add(1) > 1 {
				return conn, err
			}
			return stuck.wrap(conn), nil // the first connection's writes get stuck
		},
	}}
	var rec recorder
	rec.hook(&opts)
	dial(t, fs.url(), opts)
	stuck.set()
	checkFor(t, 5*time.Second, func() error {
		if fs.connections() < 2 || !rec.endedWith(ErrWriteTimeout) {
			return fmt.Errorf("%d connections, ends %v: want one ended by ErrWriteTimeout, then a reconnect", fs.connections(), rec.endings())
		}
		return nil
	})
}

// stuckConns makes the writes of the connections it wraps block, once set,
// until the connection is closed.
type stuckConns struct {
	stuck atomic.Bool
}

func (s *stuckConns) set() { s.stuck.Store(true) }

func (s *stuckConns) wrap(c net.Conn) net.Conn {
	return &stuckConn{Conn: c, s: s, closed: make(chan struct{})}
}

type stuckConn struct {
	net.Conn
	s      *stuckConns
	once   sync.Once
	closed chan struct{}
}

func (c *stuckConn) Write(p []byte) (int, error) {
	if c.s.stuck.Load() {
		<-c.closed
		return 0, net.ErrClosed
	}
	return c.Conn.Write(p)
}

func (c *stuckConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// TestHeartbeatsProbeOnlyAfterQuiet: a heartbeat asks for an ack only when
// the server has been quiet for half the ttl; the others carry no id.
func TestHeartbeatsProbeOnlyAfterQuiet(t *testing.T) {
	type beat struct {
		at    time.Time
		probe bool
	}
	var mu sync.Mutex
	var beats []beat
	fs := newFakeServer(t, func(n int, c *fakeConn) {
		c.hello(50, 600) // a probe at most every 300 ms of quiet
		for {
			_, data, err := c.Read(c.ctx)
			if err != nil {
				return
			}
			var hb protocol.Heartbeat
			if json.Unmarshal(data, &hb) != nil || hb.Type != protocol.TypeHeartbeat {
				continue
			}
			mu.Lock()
			beats = append(beats, beat{time.Now(), len(hb.ID) > 0})
			mu.Unlock()
			if len(hb.ID) > 0 {
				c.send(protocol.HeartbeatAck{Type: protocol.TypeHeartbeatAck, ID: hb.ID})
			}
		}
	})
	opts := testOptions(t, "alice")
	dial(t, fs.url(), opts)
	checkFor(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(beats) < 40 {
			return fmt.Errorf("%d heartbeats", len(beats))
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	var probes []time.Time
	for _, b := range beats {
		if b.probe {
			probes = append(probes, b.at)
		}
	}
	// 40 beats at 35-50 ms take 1.4-2 s: 4-7 probes, never two within 300 ms.
	if len(probes) < 3 || len(probes) > len(beats)/4 {
		t.Fatalf("%d probes among %d heartbeats", len(probes), len(beats))
	}
	for i := 1; i < len(probes); i++ {
		if gap := probes[i].Sub(probes[i-1]); gap < 250*time.Millisecond {
			t.Errorf("probes %v apart, though each was answered at once", gap)
		}
	}
	if fs.connections() != 1 {
		t.Errorf("%d connections: an answered client reconnected", fs.connections())
	}
}

// ---- against a real greendot process ----

func TestSnapshotAndLiveChanges(t *testing.T) {
	srv := startServer(t)
	srv.join("t1", "alice", "bob", "dave")
	srv.join("t2", "carol")
	dial(t, srv.url(), testOptions(t, "bob"))
	dial(t, srv.url(), testOptions(t, "carol"))

	var rec recorder
	opts := testOptions(t, "alice")
	rec.hook(&opts)
	alice := dial(t, srv.url(), opts)
	if w := alice.Welcome(); w.UserID != "alice" || w.HeartbeatIntervalMS != 500 || w.TTLMS != 2000 {
		t.Errorf("welcome %+v", w)
	}
	if got := alice.All(); len(got) != 1 || got[0].UserID != "bob" || got[0].State != "online" || got[0].Version == 0 {
		t.Fatalf("after the snapshot alice holds %+v, want bob online only", got)
	}
	first := nextChange(t, alice, "bob")
	if first.UserID != "bob" || !first.FromSnapshot || first.Received.IsZero() {
		t.Errorf("first change %+v, want bob from the snapshot", first)
	}

	dave := dial(t, srv.url(), testOptions(t, "dave"))
	live := nextChange(t, alice, "dave")
	if live.State != "online" || live.FromSnapshot || live.At.IsZero() || live.Version == 0 {
		t.Errorf("dave's change %+v, want a live online", live)
	}
	if lag := live.Received.Sub(live.At); lag < -time.Second || lag > 5*time.Second {
		t.Errorf("dave's change received %v after it happened", lag)
	}
	dave.Close()
	gone := nextChange(t, alice, "dave")
	if gone.State != "offline" || gone.Version <= live.Version {
		t.Errorf("after dave closed: %+v, want offline at a version above %d", gone, live.Version)
	}

	// Joining a team shows the new member's state at once (semantic 7).
	srv.join("t1", "carol")
	expectState(t, alice, "carol", "online")
	if _, ok := alice.Get("alice"); ok {
		t.Error("alice holds her own presence")
	}
	if own := rec.changesFor("alice"); len(own) > 0 {
		t.Errorf("alice was sent her own changes %+v", own)
	}
}

// nextChange reads alice's Changes until one for user comes.
func nextChange(t *testing.T, c *Client, user string) Change {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case ch := <-c.Changes():
			if ch.UserID == user {
				return ch
			}
		case <-timeout:
			t.Fatalf("no change for %s within 5s", user)
		}
	}
}

func TestReconnectAfterServerRestart(t *testing.T) {
	for _, how := range []string{"crash", "drain"} {
		t.Run(how, func(t *testing.T) {
			srv := startServer(t)
			srv.join("t1", "alice", "bob")
			bob := dial(t, srv.url(), testOptions(t, "bob"))
			var rec recorder
			opts := testOptions(t, "alice")
			rec.hook(&opts)
			alice := dial(t, srv.url(), opts)
			expectState(t, alice, "bob", "online")
			before := alice.Welcome().ConnectionID

			if how == "crash" {
				srv.kill()
			} else {
				srv.terminate()
			}
			expectConnState(t, alice, Disconnected)
			srv.start()
			srv.join("t1", "alice", "bob") // the memory store starts empty
			checkFor(t, 10*time.Second, func() error {
				if alice.State() != Connected || bob.State() != Connected || alice.Welcome().ConnectionID == before {
					return fmt.Errorf("alice %v bob %v: both should reconnect", alice.State(), bob.State())
				}
				return nil
			})
			expectState(t, alice, "bob", "online")
			if how == "drain" {
				if codes := rec.closeCodes(); len(codes) == 0 || codes[0] != protocol.CloseServiceRestart {
					t.Errorf("drain ended alice's connection with codes %v, want 1012", codes)
				}
			}
		})
	}
}

func TestHeartbeatsJittered(t *testing.T) {
	srv := startServer(t)
	cases := []struct {
		name     string
		forced   time.Duration
		interval time.Duration
		gaps     int
	}{
		{"server interval", 0, 500 * time.Millisecond, 6},
		{"forced interval", 100 * time.Millisecond, 100 * time.Millisecond, 12},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var rec recorder
			opts := testOptions(t, "alice")
			opts.HeartbeatInterval = tc.forced
			rec.hook(&opts)
			dial(t, srv.url(), opts)
			checkFor(t, time.Duration(tc.gaps+3)*tc.interval+2*time.Second, func() error {
				if n := len(rec.sentOf(protocol.TypeHeartbeat)); n <= tc.gaps {
					return fmt.Errorf("%d heartbeats sent", n)
				}
				return nil
			})
			beats := rec.sentOf(protocol.TypeHeartbeat)
			var gaps []time.Duration
			for i := 1; i < len(beats); i++ {
				gaps = append(gaps, beats[i].Sub(beats[i-1]))
			}
			lo, hi := tc.interval*7/10, tc.interval+200*time.Millisecond
			for _, g := range gaps {
				if g < lo || g > hi {
					t.Errorf("gap %v outside [%v, %v]; gaps %v", g, lo, hi, gaps)
				}
			}
			if spread := slices.Max(gaps) - slices.Min(gaps); spread < tc.interval/20 {
				t.Errorf("gaps %v vary by only %v: not jittered", gaps, spread)
			}
		})
	}
}

func TestTokenRefresh(t *testing.T) {
	const secret = "s3cret"
	srv := startServer(t, "--jwt-secret", secret)
	srv.join("t1", "alice", "bob")
	sign := func(user string, ttl time.Duration) string {
		claims := jwt.RegisteredClaims{Subject: user}
		if ttl != 0 {
			claims.ExpiresAt = jwt.NewNumericDate(time.Now().Add(ttl))
		}
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(secret))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	t.Run("refused", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for name, opts := range map[string]Options{
			"dev-mode user": {User: "alice"},
			"no token":      {},
			"expired":       {Token: sign("alice", -time.Minute)},
			"wrong secret": {Token: func() string {
				s, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{Subject: "alice"}).SignedString([]byte("nope"))
				return s
			}()},
		} {
			if c, err := Dial(ctx, srv.url(), opts); !errors.Is(err, ErrUnauthorized) {
				if c != nil {
					c.Close()
				}
				t.Errorf("%s: Dial error %v, want ErrUnauthorized", name, err)
			}
		}
	})

	t.Run("refresh on 4001", func(t *testing.T) {
		var viewer recorder
		bobOpts := testOptions(t, "")
		bobOpts.Token = sign("bob", 0)
		viewer.hook(&bobOpts)
		bob := dial(t, srv.url(), bobOpts)

		tokens := make(chan struct{}, 100)
		var rec recorder
		opts := testOptions(t, "")
		opts.TokenFunc = func(context.Context) (string, error) {
			tokens <- struct{}{}
			return sign("alice", 2*time.Second), nil
		}
		rec.hook(&opts)
		alice := dial(t, srv.url(), opts)
		if got := alice.Welcome().UserID; got != "alice" {
			t.Fatalf("welcome user %q, want alice from the token's sub", got)
		}
		expectState(t, bob, "alice", "online")
		checkFor(t, 10*time.Second, func() error {
			codes := rec.closeCodes()
			if n := len(tokens); n < 3 || alice.State() != Connected {
				return fmt.Errorf("%d tokens fetched, state %v, close codes %v: want 2 refreshes after 4001", n, alice.State(), codes)
			}
			if len(codes) < 2 || codes[0] != protocol.CloseTokenExpired || codes[1] != protocol.CloseTokenExpired {
				return fmt.Errorf("close codes %v, want 4001s", codes)
			}
			return nil
		})
		// Reconnecting at once lands within the grace: bob never saw alice go.
		for _, ch := range viewer.changesFor("alice") {
			if ch.State != "online" {
				t.Errorf("bob saw alice %s during token refreshes", ch.State)
			}
		}
	})
}

func TestQuery(t *testing.T) {
	srv := startServer(t)
	srv.join("t1", "alice", "bob")
	srv.join("t2", "carol")
	dial(t, srv.url(), testOptions(t, "bob"))
	phone := testOptions(t, "bob")
	phone.Device = "ios"
	dial(t, srv.url(), phone)
	dial(t, srv.url(), testOptions(t, "carol"))
	alice := dial(t, srv.url(), testOptions(t, "alice"))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	users, err := alice.Query(ctx, []string{"bob", "carol", "alice", "ghost"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]UserPresence{}
	for _, u := range users {
		got[u.UserID] = u
	}
	if len(users) != 4 {
		t.Errorf("%d results for 4 ids: %+v", len(users), users)
	}
	if b := got["bob"]; b.State != "online" || b.ConnectionCount != 2 || !slices.Equal(slices.Sorted(slices.Values(b.Devices)), []string{"ios", "web"}) {
		t.Errorf("bob: %+v, want online on two connections, ios and web", b)
	}
	if a := got["alice"]; a.State != "online" {
		t.Errorf("alice asking about herself: %+v, want online", a)
	}
	for _, id := range []string{"carol", "ghost"} {
		if u := got[id]; u.State != "unknown" || u.ConnectionCount != 0 || u.Devices != nil || !u.LastSeen.IsZero() || u.Version != 0 {
			t.Errorf("%s shares no team with alice: %+v, want state unknown and nothing else", id, u)
		}
	}

	// A member who left has a last_seen; one never seen has none.
	erin := dial(t, srv.url(), testOptions(t, "erin"))
	srv.join("t1", "erin", "frank")
	expectState(t, alice, "erin", "online")
	erin.Close()
	expectOffline(t, alice, "erin", 5*time.Second)
	users, err = alice.Query(ctx, []string{"erin", "frank"})
	if err != nil {
		t.Fatal(err)
	}
	if len(users) != 2 {
		t.Fatalf("%d results for 2 ids: %+v", len(users), users)
	}
	for _, u := range users {
		switch {
		case u.State != "offline" || u.ConnectionCount != 0:
			t.Errorf("%s: %+v, want offline with no connection", u.UserID, u)
		case u.UserID == "erin" && (u.LastSeen.IsZero() || time.Since(u.LastSeen) > 5*time.Second):
			t.Errorf("erin: last_seen %v, want the moment she left", u.LastSeen)
		case u.UserID == "frank" && !u.LastSeen.IsZero():
			t.Errorf("frank was never seen, yet last_seen is %v", u.LastSeen)
		}
	}

	if _, err := alice.Query(ctx, make([]string, protocol.MaxQueryIDs+1)); err == nil {
		t.Error("a query of 501 ids was accepted")
	}
}

func TestSetStatusAway(t *testing.T) {
	srv := startServer(t)
	srv.join("t1", "alice", "bob")
	bob := dial(t, srv.url(), testOptions(t, "bob"))
	alice := dial(t, srv.url(), testOptions(t, "alice"))
	online := expectState(t, alice, "bob", "online")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := bob.SetStatus(ctx, "away"); err != nil {
		t.Fatal(err)
	}
	away := expectState(t, alice, "bob", "away")
	if away.Version <= online.Version {
		t.Errorf("away at version %d, not above online's %d", away.Version, online.Version)
	}
	if err := bob.SetStatus(ctx, "busy"); err == nil {
		t.Error(`SetStatus("busy") was accepted`)
	}
	if err := bob.SetStatus(ctx, "online"); err != nil {
		t.Fatal(err)
	}
	expectState(t, alice, "bob", "online")
}

func TestPingWithoutAutomaticHeartbeats(t *testing.T) {
	srv := startServer(t)
	var rec recorder
	opts := testOptions(t, "alice")
	opts.DisableHeartbeats = true
	rec.hook(&opts)
	c := dial(t, srv.url(), opts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 3 {
		rtt, err := c.Ping(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rtt <= 0 || rtt > 2*time.Second {
			t.Errorf("ping round trip %v", rtt)
		}
	}
	if n := len(rec.sentOf(protocol.TypeHeartbeat)); n != 3 {
		t.Errorf("%d heartbeats sent, want only the 3 pings", n)
	}
}

// TestFreezeExpires: a frozen client is a hung one. The server expires it
// (ttl 2s + at most 1s + grace 300ms), and it stays away until thawed.
func TestFreezeExpires(t *testing.T) {
	srv := startServer(t)
	srv.join("t1", "alice", "bob")
	alice := dial(t, srv.url(), testOptions(t, "alice"))
	var rec recorder
	opts := testOptions(t, "bob")
	rec.hook(&opts)
	bob := dial(t, srv.url(), opts)
	expectState(t, alice, "bob", "online")

	bob.Freeze(true)
	frozeAt := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := bob.Ping(ctx); !errors.Is(err, ErrFrozen) {
		t.Errorf("Ping while frozen: %v, want ErrFrozen", err)
	}
	if err := bob.SetStatus(ctx, "away"); !errors.Is(err, ErrFrozen) {
		t.Errorf("SetStatus while frozen: %v, want ErrFrozen", err)
	}
	expectOffline(t, alice, "bob", 6*time.Second)
	if took := time.Since(frozeAt); took < 2*time.Second {
		t.Errorf("bob went offline %v after freezing, before the 2s ttl", took)
	}
	expectConnState(t, bob, Disconnected)
	rec.mu.Lock()
	for _, f := range rec.sent {
		if f.at.After(frozeAt) {
			t.Errorf("frozen bob sent a %s", f.typ)
		}
	}
	rec.mu.Unlock()

	bob.Freeze(false)
	expectConnState(t, bob, Connected)
	expectState(t, alice, "bob", "online")
}

func TestDialAndCloseErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := Dial(ctx, "ws://127.0.0.1:1/v1/connect", Options{User: "alice"}); err == nil {
		t.Error("Dial to a closed port succeeded")
	}
	if _, err := Dial(ctx, "ftp://x/v1/connect", Options{User: "alice"}); err == nil {
		t.Error("Dial with an ftp url succeeded")
	}
	if _, err := Dial(ctx, "ws://x/v1/connect", Options{Token: "a", TokenFunc: func(context.Context) (string, error) { return "", nil }}); err == nil {
		t.Error("Dial with both Token and TokenFunc succeeded")
	}

	fs := newFakeServer(t, func(n int, c *fakeConn) {
		c.hello(60000, 150000)
		c.drain()
	})
	c, err := Dial(ctx, fs.url(), Options{User: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c.Close() // idempotent
	if c.State() != Closed {
		t.Errorf("state %v after Close", c.State())
	}
	if _, err := c.Query(ctx, []string{"bob"}); !errors.Is(err, ErrClosed) {
		t.Errorf("Query after Close: %v", err)
	}
	if _, ok := <-c.Changes(); ok {
		t.Error("Changes not closed after Close")
	}

	// Unfed, the channel has no buffer and still closes with the client.
	c, err = Dial(ctx, fs.url(), Options{User: "alice", DisableChanges: true})
	if err != nil {
		t.Fatal(err)
	}
	if cap(c.Changes()) != 0 {
		t.Errorf("unfed Changes channel holds %d slots", cap(c.Changes()))
	}
	c.Close()
	if _, ok := <-c.Changes(); ok {
		t.Error("unfed Changes not closed after Close")
	}
}

func TestDisableChangesLeavesTheChannelUnfed(t *testing.T) {
	var seen []string
	c := &Client{opts: Options{DisableChanges: true, OnChange: func(ch Change) { seen = append(seen, ch.UserID) }},
		changes: newChangeQueue(4)}
	c.emit([]Change{{UserID: "bob", State: "online"}, {UserID: "amy", State: "away"}})
	if len(seen) != 2 {
		t.Fatalf("OnChange saw %v", seen)
	}
	if _, ok := c.changes.pop(); ok {
		t.Fatal("a change was queued for the Changes channel")
	}
}

func TestLeadingType(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		ok   bool
	}{
		{`{"type":"presence","changes":[]}`, "presence", true},
		{`{"type":"heartbeat_ack","id":1}`, "heartbeat_ack", true},
		{`{ "type":"presence"}`, "", false},             // not the server's layout: full decode
		{`{"changes":[],"type":"presence"}`, "", false}, // type not first
		{`{"type":"pre\"sence"}`, "", false},            // escapes: full decode
		{`{"type":"presence`, "", false},
		{``, "", false},
	} {
		got, ok := leadingType([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("leadingType(%s) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// A handshake refused with 503 and Retry-After is retried no sooner than
// the server asked, though the backoff alone would come back at once.
func TestRetryAfterIsHonoured(t *testing.T) {
	var mu sync.Mutex
	var attempts []time.Time
	fs := newRefusingFakeServer(t, func(n int, w http.ResponseWriter) bool {
		mu.Lock()
		attempts = append(attempts, time.Now())
		mu.Unlock()
		if n != 1 { // the first reconnect is refused
			return false
		}
		w.Header().Set("Retry-After", "1")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":{"code":"unavailable","message":"too many connects in progress; retry with backoff"}}`))
		return true
	}, func(n int, c *fakeConn) {
		c.hello(10000, 25000)
		if n == 0 {
			return // drop the first connection at once
		}
		c.drain()
	})
	opts := testOptions(t, "alice") // backoff base 50 ms, max 500 ms
	opts.ReconnectMax = 5 * time.Second
	dial(t, fs.url(), opts)
	checkFor(t, 10*time.Second, func() error {
		if fs.connections() < 2 {
			return fmt.Errorf("%d connections", fs.connections())
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) < 3 {
		t.Fatalf("%d attempts", len(attempts))
	}
	if gap := attempts[2].Sub(attempts[1]); gap < time.Second || gap > 2500*time.Millisecond {
		t.Fatalf("retried %v after a 503 with Retry-After: 1, want 1-2 s", gap)
	}
}
