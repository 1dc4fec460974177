package server_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/server"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/memstore"
)

func (c *wsClient) expectError(code string) {
	c.t.Helper()
	f := c.next("error")
	if f["code"] != code || f["message"] == "" {
		c.t.Fatalf("%s: error = %v, want code %s with a message", c.name, f, code)
	}
}

// stillServes proves the connection is open and answering.
func (c *wsClient) stillServes() {
	c.t.Helper()
	c.send(`{"type":"heartbeat","id":"alive"}`)
	if ack := c.next("heartbeat_ack"); ack["id"] != "alive" {
		c.t.Fatalf("%s: ack = %v", c.name, ack)
	}
}

func TestBadFramesGetErrorsAndKeepTheConnection(t *testing.T) {
	ts := startServer(t)
	c := ts.dial(t, "alice")
	for _, tc := range []struct{ frame, code string }{
		{`not json`, "bad_request"},
		{`{"type":`, "bad_request"},
		{`[1,2,3]`, "bad_request"},
		{`"heartbeat"`, "bad_request"},
		{`{}`, "bad_request"},
		{`{"type":7}`, "bad_request"},
		{`{"type":"dance"}`, "unknown_type"},
		{`{"type":"status","state":5}`, "bad_request"},
		{`{"type":"status","state":"busy"}`, "bad_request"},
		{`{"type":"status"}`, "bad_request"},
		{`{"type":"query","id":"q","user_ids":"bob"}`, "bad_request"},
		{`{"type":"query","id":"q","user_ids":[1,2]}`, "bad_request"},
		{`{"type":"query","id":"q"}`, "bad_request"},
		{`{"type":"query","id":{"deep":[[[]]]},"user_ids":[]}`, "bad_request"},
		{`{"type":"query","id":"q","user_ids":["bad\u0000id"]}`, "bad_request"},
		{`{"type":"query","id":"q","user_ids":["` + strings.Repeat("x", 129) + `"]}`, "bad_request"},
		{`{"type":"heartbeat","id":[1]}`, "bad_request"},
	} {
		c.send(tc.frame)
		c.expectError(tc.code)
		c.send(`{"type":"heartbeat"}`) // a good frame between bad ones: no 1008
	}
	c.stillServes()
}

func TestQueryOfTooManyIDs(t *testing.T) {
	ts := startServer(t)
	c := ts.dial(t, "alice")
	ids := make([]string, 501)
	for i := range ids {
		ids[i] = fmt.Sprint("u", i)
	}
	// 501 short ids fit in 4 KiB only if short: use the HTTP limit check too.
	c.send(map[string]any{"type": "query", "id": "big", "user_ids": ids[:300]})
	if r := c.next("query_result"); len(r["users"].([]any)) != 300 {
		t.Fatalf("300 ids: %d users", len(r["users"].([]any)))
	}
	body := `{"user_ids":["` + strings.Join(ids, `","`) + `"]}`
	if code, resp := ts.do("POST", "/v1/presence/query", body); code != 400 || !strings.Contains(resp, "too_many_ids") {
		t.Fatalf("501 ids over HTTP: %d %s", code, resp)
	}
}

func TestOversizedFrameCloses1009(t *testing.T) {
	ts := startServer(t)
	c := ts.dial(t, "alice")
	other := ts.dial(t, "bob")
	sendOversized(t, c, protocol.MaxFrameSize+1)
	c.expectClosed(websocket.StatusMessageTooBig)
	other.stillServes()

	// Any frame but a query keeps the contract's 4 KiB.
	c = ts.dial(t, "alice")
	c.send(`{"type":"heartbeat","id":"` + strings.Repeat("x", 5000) + `"}`)
	c.expectClosed(websocket.StatusMessageTooBig)
	other.stillServes()
}

func TestBinaryFrameCloses1003(t *testing.T) {
	ts := startServer(t)
	c := ts.dial(t, "alice")
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := c.conn.Write(ctx, websocket.MessageBinary, []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	c.expectClosed(websocket.StatusUnsupportedData)
}

func TestFloodIsRateLimitedThenClosed1008(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob", "eve")
	alice := ts.dial(t, "alice")
	eve := ts.dial(t, "eve")
	alice.expectChanges(time.Second, "eve=online")
	go func() {
		for i := 0; i < 500; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := eve.conn.Write(ctx, websocket.MessageText, []byte(`{"type":"heartbeat"}`))
			cancel()
			if err != nil {
				return
			}
		}
	}()
	eve.expectError("rate_limited")
	eve.expectClosed(websocket.StatusPolicyViolation)
	// Everyone else is undisturbed.
	ts.dial(t, "bob")
	alice.expectChanges(time.Second, "bob=online")
}

func TestBadFramesThatKeepComingClose1008(t *testing.T) {
	ts := startServer(t)
	c := ts.dial(t, "alice")
	for i := 0; i < 11; i++ {
		c.send(`nope`)
	}
	for i := 0; i < 10; i++ {
		c.expectError("bad_request")
	}
	c.expectClosed(websocket.StatusPolicyViolation)
}

func TestConnectRejectsHostileIDs(t *testing.T) {
	ts := startServer(t)
	for _, q := range []string{
		"user=" + url.QueryEscape("a\x00b"),
		"user=" + url.QueryEscape("line\nbreak"),
		"user=" + strings.Repeat("x", 129),
		"user=" + url.QueryEscape(string([]byte{0xff, 0xfe})),
		"user=alice&device=" + url.QueryEscape("\x1b[31m"),
		"user=alice&device=",
		"user=",
	} {
		_, resp, err := ts.dialRaw(t, q)
		if err == nil || resp == nil || resp.StatusCode != 400 {
			t.Fatalf("%q: %v %v, want 400", q, err, resp)
		}
	}
	for _, q := range []string{"", "device=web", "token=abc"} {
		_, resp, err := ts.dialRaw(t, q)
		if err == nil || resp == nil || resp.StatusCode != 401 {
			t.Fatalf("%q: %v %v, want 401", q, err, resp)
		}
	}
	// Emoji and spaces are fine.
	c := ts.dial(t, "ünïcødé 🙂")
	c.stillServes()
}

const secret = "test-secret"

func sign(t *testing.T, claims jwt.MapClaims, method jwt.SigningMethod, key any) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestJWTAuth(t *testing.T) {
	ts := startServer(t, func(c *server.Config) { c.JWTSecret = secret })
	good := sign(t, jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix()}, jwt.SigningMethodHS256, []byte(secret))
	noExp := sign(t, jwt.MapClaims{"sub": "bob"}, jwt.SigningMethodHS256, []byte(secret))
	none := sign(t, jwt.MapClaims{"sub": "alice"}, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType)
	for name, q := range map[string]string{
		"wrong secret": "token=" + sign(t, jwt.MapClaims{"sub": "alice"}, jwt.SigningMethodHS256, []byte("other")),
		"expired":      "token=" + sign(t, jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(-time.Minute).Unix()}, jwt.SigningMethodHS256, []byte(secret)),
		"alg none":     "token=" + none,
		"HS512":        "token=" + sign(t, jwt.MapClaims{"sub": "alice"}, jwt.SigningMethodHS512, []byte(secret)),
		"no sub":       "token=" + sign(t, jwt.MapClaims{"exp": time.Now().Add(time.Hour).Unix()}, jwt.SigningMethodHS256, []byte(secret)),
		"garbage":      "token=" + base64.RawURLEncoding.EncodeToString([]byte("junk")),
		"missing":      "device=web",
		"dev user":     "user=alice",
		"user beside":  "user=mallory&token=" + good,
	} {
		_, resp, err := ts.dialRaw(t, q)
		if err == nil || resp == nil || resp.StatusCode != 401 {
			t.Errorf("%s: %v %v, want 401", name, err, resp)
		}
	}
	c, _, err := ts.dialRaw(t, "token="+good)
	if err != nil {
		t.Fatal(err)
	}
	if w := c.next("welcome"); w["user_id"] != "alice" {
		t.Fatalf("welcome = %v", w)
	}
	// The Authorization header works too.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws://"+ts.addr+"/v1/connect", &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + noExp}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	_, data, err := conn.Read(ctx)
	if err != nil || !strings.Contains(string(data), `"user_id":"bob"`) {
		t.Fatalf("header token: %s %v", data, err)
	}
}

func TestTokenExpiryClosesWith4001(t *testing.T) {
	ts := startServer(t, func(c *server.Config) { c.JWTSecret = secret })
	tok := sign(t, jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(1500 * time.Millisecond).Unix()}, jwt.SigningMethodHS256, []byte(secret))
	c, _, err := ts.dialRaw(t, "token="+tok)
	if err != nil {
		t.Fatal(err)
	}
	c.next("welcome")
	c.next("snapshot")
	c.heartbeatEvery(testHeartbeat)
	c.expectClosed(4001)
}

func TestAPIKey(t *testing.T) {
	ts := startServer(t, func(c *server.Config) { c.APIKey = "k3y" })
	for _, r := range [][2]string{
		{"GET", "/v1/users/bob/presence"}, {"POST", "/v1/presence/query"}, {"GET", "/v1/teams/t/presence"},
		{"PUT", "/v1/teams/t/members/bob"}, {"DELETE", "/v1/teams/t/members/bob"},
	} {
		if code, body := ts.do(r[0], r[1], `{"user_ids":[]}`); code != 401 || !strings.Contains(body, `"code":"unauthorized"`) {
			t.Errorf("%s %s without key: %d %s", r[0], r[1], code, body)
		}
		if code, _ := ts.do(r[0], r[1], `{"user_ids":[]}`, "Authorization", "Bearer wrong"); code != 401 {
			t.Errorf("%s %s with a wrong key: %d", r[0], r[1], code)
		}
		if code, body := ts.do(r[0], r[1], `{"user_ids":[]}`, "Authorization", "Bearer k3y"); code >= 300 {
			t.Errorf("%s %s with the key: %d %s", r[0], r[1], code, body)
		}
	}
	ts.dial(t, "alice").stillServes() // /v1/connect uses tokens, not the key
	if code, _ := ts.do("GET", "/healthz", ""); code != 200 {
		t.Errorf("healthz needs no key: %d", code)
	}
}

func TestHTTPBadInput(t *testing.T) {
	ts := startServer(t)
	for _, tc := range []struct {
		method, path, body string
		code               int
	}{
		{"GET", "/v1/users/" + strings.Repeat("x", 129) + "/presence", "", 400},
		{"GET", "/v1/users/a%00b/presence", "", 400},
		{"PUT", "/v1/teams/t%0A1/members/bob", "", 400},
		{"POST", "/v1/presence/query", `not json`, 400},
		{"POST", "/v1/presence/query", `{"user_ids":"bob"}`, 400},
		{"POST", "/v1/presence/query", `{}`, 400},
		{"POST", "/v1/presence/query", `{"user_ids":["a"]}{"x":1}`, 400},
		{"POST", "/v1/presence/query", `{"user_ids":["a\u0007"]}`, 400},
		{"GET", "/v1/nothing", "", 404},
	} {
		code, body := ts.do(tc.method, tc.path, tc.body)
		if code != tc.code || !strings.Contains(body, `"error":{"code":`) {
			t.Errorf("%s %s %q: %d %s, want %d with a JSON error", tc.method, tc.path, tc.body, code, body, tc.code)
		}
	}
}

// A client that stops reading is disconnected; everyone else keeps up.
func TestSlowReaderIsDisconnectedWithoutHoldingOthers(t *testing.T) {
	reg := prometheus.NewRegistry()
	// The stuck reader is silent: a ttl past the test keeps it from being
	// reaped as silent before its stall is noticed.
	const ttl = 30 * time.Second
	st, err := memstore.New(memstore.Config{TTL: ttl, Grace: testGrace})
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, func(c *server.Config) {
		c.Store, c.TTL = st, ttl
		// Room for a reader that keeps reading but shares the CPU with the
		// churn it is sent.
		c.MaxWriteBuffer = 32 << 10
		c.SocketSendBuffer = 4 << 10
		// The stuck reader's changes wait, coalesced, instead of filling
		// the write buffer; it is closed once its socket has not drained
		// for this long.
		c.SlowReaderTimeout = 2 * time.Second
		c.Registry = reg // read directly: /metrics itself is bigger than 16 KiB
		c.RateLimit, c.RateBurst = 100000, 100000
	})
	var subjects []string
	for i := 0; i < 40; i++ {
		s := fmt.Sprint("s", i)
		subjects = append(subjects, s)
		ts.join("team-"+s, s, "reader", "stuck") // subjects do not see each other
	}
	reader := ts.dial(t, "reader")
	stuck := dialStuck(t, ts.addr, "stuck")
	defer stuck.Close()

	var conns []*wsClient
	for _, s := range subjects {
		conns = append(conns, ts.dial(t, s))
	}
	reader.changes(300 * time.Millisecond)
	// The reader keeps reading throughout: its test client queues at most
	// 1,024 frames, and a long churn (under -race) sends more, which would
	// make it a slow reader too.
	var mu sync.Mutex
	got := map[string]string{}
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, ch := range reader.changes(20 * time.Millisecond) {
				kv := strings.SplitN(ch, "=", 2)
				mu.Lock()
				got[kv[0]] = kv[1]
				mu.Unlock()
			}
		}
	}()
	defer func() { close(stop); <-drained }()
	// Churn: every subject flips away/online as fast as it can.
	pad := strings.Repeat("p", 2000) // big frames fill buffers sooner
	for round := 0; round < 301; round++ {
		for _, c := range conns {
			state := "online"
			if round%2 == 1 {
				state = "away"
			}
			c.send(`{"type":"status","state":"` + state + `","pad":"` + pad + `"}`)
		}
	}
	checkFor(t, 20*time.Second, func() error {
		if v := gauge(t, reg, "greendot_slow_consumer_disconnects_total"); v != 1 {
			return errorf("slow consumer disconnects = %v, want 1", v)
		}
		if v := gauge(t, reg, "greendot_slow_consumer_timeouts_total"); v != 1 {
			return errorf("slow consumer timeouts = %v, want 1", v)
		}
		if v := gauge(t, reg, "greendot_connections"); v != float64(len(subjects)+1) {
			return errorf("connections = %v, want the stuck reader gone", v)
		}
		return nil
	})
	// The server has handled every status frame (under load it may still be
	// working through the churn once the stuck reader is gone: the suite
	// with two busy loops beside it failed the check below so)...
	checkFor(t, time.Minute, func() error {
		if v, want := labelled(t, reg, "greendot_frames_received_total", "type", "status"), float64(len(subjects)*301); v < want {
			return errorf("status frames handled = %v, want %v", v, want)
		}
		return nil
	})
	// ...and the reader ends up with every subject online (the last round).
	checkFor(t, 5*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range subjects {
			if got[s] != "online" {
				return errorf("reader sees %s as %q", s, got[s])
			}
		}
		return nil
	})
}

// gauge reads one unlabelled metric straight from the registry.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	return labelled(t, reg, name, "", "")
}

// labelled reads the metric name's series whose label is value (the first
// series when label is empty), straight from the registry.
func labelled(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || (l.GetName() == label && l.GetValue() == value)
			}
			if !match {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// dialStuck completes a WebSocket handshake by hand on a socket with a tiny
// receive buffer, then never reads again.
func dialStuck(t *testing.T, addr, user string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 2048) })
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	fmt.Fprintf(conn, "GET /v1/connect?user=%s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", user, addr, base64.StdEncoding.EncodeToString(key))
	status, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.Contains(status, "101") {
		t.Fatalf("handshake: %q %v", status, err)
	}
	return conn
}

func TestDrainSendsReconnectThen1012(t *testing.T) {
	ts := startServer(t)
	ts.join("t1", "alice", "bob")
	alice := ts.dial(t, "alice")
	bob := ts.dial(t, "bob")
	alice.expectChanges(time.Second, "bob=online")
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- ts.srv.Shutdown(ctx)
	}()
	for _, c := range []*wsClient{alice, bob} {
		f := c.next("reconnect")
		if after, ok := f["after_ms"].(float64); !ok || after < 0 || after > 200 {
			t.Fatalf("reconnect = %v, want after_ms within the 200ms spread", f)
		}
		c.expectClosed(websocket.StatusServiceRestart)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Nobody was told anyone went offline: the users are in grace.
	if _, _, err := ts.dialRaw(t, "user=carol"); err == nil {
		t.Fatal("a drained node accepted a connection")
	}
}

func TestHTTPErrorsAreJSON(t *testing.T) {
	ts := startServer(t)
	for _, tc := range []struct {
		method, path, body string
		code               int
	}{
		{"POST", "/v1/users/bob/presence", "", 405},
		{"GET", "/v1/presence/query", "", 405},
		{"POST", "/v1/connect", "", 405},
		{"PATCH", "/v1/teams/t/members/bob", "", 405},
		{"GET", "/v1/users/bob/status", "", 405},
		{"GET", "/v1/connect?user=bob", "", 400}, // no upgrade headers
		{"POST", "/v1/presence/query", `{"user_ids":["` + strings.Repeat("x", 2<<20) + `"]}`, 413},
	} {
		code, body := ts.do(tc.method, tc.path, tc.body)
		if code != tc.code || !strings.Contains(body, `"error":{"code":`) {
			t.Errorf("%s %s: %d %.200s, want %d with a JSON error", tc.method, tc.path, code, body, tc.code)
		}
	}
}

// A join into a big team catches the joiner up in bulk: that is no reason
// to take the joiner for a slow reader.
func TestJoiningABigTeamIsNotSlow(t *testing.T) {
	ts := startServer(t, func(c *server.Config) { c.MaxPending = 5 })
	var members []string
	for i := 0; i < 12; i++ {
		members = append(members, fmt.Sprint("m", i))
	}
	ts.join("big", members...)
	// MaxPending is tiny here, so each member must have read one online
	// before the next arrives: otherwise a starved flusher under -race
	// could let a member's queue pass the limit, close it as slow, and
	// show the joiner its offline.
	var conns []*wsClient
	for _, m := range members {
		c := ts.dial(t, m)
		for _, earlier := range conns {
			earlier.expectChanges(5*time.Second, m+"=online")
		}
		conns = append(conns, c)
	}
	joiner := ts.dial(t, "joiner")
	ts.join("big", "joiner")
	got := joiner.changes(time.Second)
	if len(got) != len(members) {
		t.Fatalf("joiner got %d changes %v, want %d", len(got), got, len(members))
	}
	joiner.stillServes()
}

// slowConnects holds every Connect until release is closed.
type slowConnects struct {
	store.Store
	entered chan struct{}
	release chan struct{}
}

func (s *slowConnects) Connect(ctx context.Context, c presence.Conn) error {
	s.entered <- struct{}{}
	select {
	case <-s.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Store.Connect(ctx, c)
}

// A connect storm is admitted MaxConnecting at a time: the others wait
// their turn, and past ConnectQueueWait are refused with a JSON 503 before
// any store work, instead of all timing out together.
func TestConnectsAreAdmittedAtABoundedRate(t *testing.T) {
	slow := &slowConnects{entered: make(chan struct{}, 8), release: make(chan struct{})}
	ts := startServer(t, func(c *server.Config) {
		slow.Store = c.Store
		c.Store = slow
		c.MaxConnecting = 1
		c.ConnectQueueWait = 300 * time.Millisecond
	})
	first := make(chan *wsClient, 1)
	go func() {
		c, _, err := ts.dialRaw(t, "user=alice")
		if err != nil {
			t.Errorf("first connect: %v", err)
		}
		first <- c
	}()
	<-slow.entered // alice holds the only slot

	// bob waits past ConnectQueueWait and is refused.
	code, body := ts.do("GET", "/v1/connect?user=bob", "", "Connection", "Upgrade", "Upgrade", "websocket",
		"Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"unavailable"`) {
		t.Fatalf("bob: %d %s, want 503 unavailable", code, body)
	}
	select {
	case <-slow.entered:
		t.Fatal("a refused connect reached the store")
	default:
	}

	// Once alice is through, carol gets the slot.
	close(slow.release)
	if c := <-first; c != nil {
		c.next("welcome")
	}
	carol := ts.dial(t, "carol")
	if carol.welcome["user_id"] != "carol" {
		t.Fatalf("carol's welcome: %v", carol.welcome)
	}
	if _, body := ts.do("GET", "/metrics", ""); !strings.Contains(body, `greendot_connects_rejected_total{reason="overloaded"} 1`) {
		t.Fatal("the overloaded rejection is not counted")
	}
}

// A broken handshake gets a JSON error like every other refusal.
func TestBadHandshakeHeadersGetJSONErrors(t *testing.T) {
	ts := startServer(t)
	good := "dGhlIHNhbXBsZSBub25jZQ=="
	for name, h := range map[string][]string{
		"no key":         {"Sec-WebSocket-Version", "13"},
		"key not base64": {"Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "not base64!"},
		"key too short":  {"Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "c2hvcnQ="},
		"version 8":      {"Sec-WebSocket-Version", "8", "Sec-WebSocket-Key", good},
		"no version":     {"Sec-WebSocket-Key", good},
	} {
		code, body := ts.do("GET", "/v1/connect?user=alice", "", append([]string{"Connection", "Upgrade", "Upgrade", "websocket"}, h...)...)
		if code != http.StatusBadRequest || !strings.Contains(body, `"code":"bad_request"`) {
			t.Errorf("%s: %d %q, want a JSON 400 bad_request", name, code, body)
		}
	}
}
