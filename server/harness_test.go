package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/server"
	"github.com/greendot/greendot/store/memstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// nbio's package init starts a process-wide task pool (created in
		// goroutine 1, before any test); a Server starts none of these.
		goleak.IgnoreTopFunction("github.com/lesismal/nbio/taskpool.New.func3"),
	)
}

// Short deadlines keep the end-to-end tests fast.
const (
	testTTL       = 2 * time.Second // generous: CI runs packages side by side under -race
	testHeartbeat = 300 * time.Millisecond
	testGrace     = 400 * time.Millisecond
)

type testServer struct {
	t     *testing.T
	srv   *server.Server
	store *memstore.Store
	addr  string
}

func startServer(t *testing.T, mutate ...func(*server.Config)) *testServer {
	t.Helper()
	st, err := memstore.New(memstore.Config{TTL: testTTL, Grace: testGrace})
	if err != nil {
		t.Fatal(err)
	}
	cfg := server.Config{
		Addr:              "127.0.0.1:0",
		Store:             st,
		NodeID:            "test",
		TTL:               testTTL,
		HeartbeatInterval: testHeartbeat,
		Grace:             testGrace,
		DrainSpread:       200 * time.Millisecond,
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for _, f := range mutate {
		f(&cfg)
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	ts := &testServer{t: t, srv: srv, store: st, addr: srv.Addr()}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return ts
}

func (ts *testServer) url(path string) string { return "http://" + ts.addr + path }

// do sends an HTTP request and returns status and body.
func (ts *testServer) do(method, path, body string, header ...string) (int, string) {
	ts.t.Helper()
	req, err := http.NewRequest(method, ts.url(path), strings.NewReader(body))
	if err != nil {
		ts.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		ts.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (ts *testServer) join(team string, users ...string) {
	ts.t.Helper()
	for _, u := range users {
		if code, body := ts.do("PUT", "/v1/teams/"+url.PathEscape(team)+"/members/"+url.PathEscape(u), ""); code != 204 {
			ts.t.Fatalf("join %s %s: %d %s", team, u, code, body)
		}
	}
}

func (ts *testServer) leave(team, user string) {
	ts.t.Helper()
	if code, body := ts.do("DELETE", "/v1/teams/"+team+"/members/"+user, ""); code != 204 {
		ts.t.Fatalf("leave %s %s: %d %s", team, user, code, body)
	}
}

// frame is one decoded server frame.
type frame map[string]any

func (f frame) typ() string { s, _ := f["type"].(string); return s }

// wsClient is a test client: a reader goroutine feeds frames to a channel.
type wsClient struct {
	t       *testing.T
	name    string
	conn    *websocket.Conn
	frames  chan frame // closed when the reader stops
	closeMu sync.Mutex
	closeSt websocket.StatusCode
	readErr error // why the read loop ended
	done    chan struct{}
	cancel  context.CancelFunc
	welcome frame
	snap    frame
	// Server pings seen, and whether to answer them. Off by default, so a
	// client that stops heartbeating is silent, as a hung client is.
	pings       atomic.Int64
	answerPings atomic.Bool
}

// dialRaw connects without reading welcome and snapshot.
func (ts *testServer) dialRaw(t *testing.T, query string) (*wsClient, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	defer dcancel()
	c := &wsClient{t: t, name: query, frames: make(chan frame, 1024), done: make(chan struct{}), cancel: cancel}
	conn, resp, err := websocket.Dial(dctx, "ws://"+ts.addr+"/v1/connect?"+query, &websocket.DialOptions{
		OnPingReceived: func(context.Context, []byte) bool {
			c.pings.Add(1)
			return c.answerPings.Load()
		},
	})
	if err != nil {
		cancel()
		return nil, resp, err
	}
	conn.SetReadLimit(1 << 20)
	c.conn = conn
	go c.readLoop(ctx)
	t.Cleanup(c.close)
	return c, resp, nil
}

// dial connects as user (dev mode), reads welcome and snapshot, and keeps
// the connection alive with heartbeats.
func (ts *testServer) dial(t *testing.T, user string, device ...string) *wsClient {
	t.Helper()
	c := ts.dialSilent(t, user, device...)
	c.heartbeatEvery(testHeartbeat)
	return c
}

// dialSilent is dial without heartbeats: the client goes silent.
func (ts *testServer) dialSilent(t *testing.T, user string, device ...string) *wsClient {
	t.Helper()
	q := url.Values{"user": {user}}
	if len(device) > 0 {
		q.Set("device", device[0])
	}
	c, resp, err := ts.dialRaw(t, q.Encode())
	if err != nil {
		t.Fatalf("dial %s: %v (%v)", user, err, resp)
	}
	c.name = user
	c.welcome = c.next("welcome")
	c.snap = c.next("snapshot")
	return c
}

func (c *wsClient) readLoop(ctx context.Context) {
	defer close(c.done)
	defer close(c.frames)
	for {
		typ, data, err := c.conn.Read(ctx)
		if err != nil {
			c.closeMu.Lock()
			c.closeSt = websocket.CloseStatus(err)
			c.readErr = err
			c.closeMu.Unlock()
			return
		}
		if typ != websocket.MessageText {
			c.t.Errorf("%s: got a binary frame", c.name)
			continue
		}
		var f frame
		if err := json.Unmarshal(data, &f); err != nil {
			c.t.Errorf("%s: frame is not JSON: %q", c.name, data)
			continue
		}
		select {
		case c.frames <- f:
		case <-ctx.Done():
			return
		}
	}
}

func (c *wsClient) close() {
	c.cancel()
	_ = c.conn.CloseNow()
	<-c.done
}

func (c *wsClient) send(v any) {
	c.t.Helper()
	var data []byte
	switch v := v.(type) {
	case string:
		data = []byte(v)
	default:
		var err error
		if data, err = json.Marshal(v); err != nil {
			c.t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.conn.Write(ctx, websocket.MessageText, data); err != nil {
		// Why the connection ended shows on its read side: the server's
		// close frame, if it sent one.
		select {
		case <-c.done:
		case <-time.After(2 * time.Second):
		}
		c.closeMu.Lock()
		readErr := c.readErr
		c.closeMu.Unlock()
		c.t.Fatalf("%s: write: %v (reading: %v)", c.name, err, readErr)
	}
}

// next returns the next frame, which must be of type typ.
func (c *wsClient) next(typ string) frame {
	c.t.Helper()
	select {
	case f, ok := <-c.frames:
		if !ok {
			c.t.Fatalf("%s: closed (%v) while waiting for %s", c.name, c.closeStatus(), typ)
		}
		if f.typ() != typ {
			c.t.Fatalf("%s: got %v, want a %s frame", c.name, f, typ)
		}
		return f
	case <-time.After(5 * time.Second):
		c.t.Fatalf("%s: no %s frame within 5s", c.name, typ)
	}
	return nil
}

// changes collects presence changes for d.
func (c *wsClient) changes(d time.Duration) []string {
	c.t.Helper()
	var out []string
	timeout := time.After(d)
	for {
		select {
		case f, ok := <-c.frames:
			if !ok {
				return out
			}
			if f.typ() != "presence" {
				c.t.Fatalf("%s: unexpected frame %v", c.name, f)
			}
			for _, ch := range f["changes"].([]any) {
				m := ch.(map[string]any)
				out = append(out, fmt.Sprintf("%s=%s", m["user_id"], m["state"]))
			}
		case <-timeout:
			return out
		}
	}
}

// expectChanges waits for exactly want, then for quiet within settle.
func (c *wsClient) expectChanges(within time.Duration, want ...string) []map[string]any {
	c.t.Helper()
	var got []string
	var raw []map[string]any
	deadline := time.After(within)
	for len(got) < len(want) {
		select {
		case f, ok := <-c.frames:
			if !ok {
				c.t.Fatalf("%s: closed (%v); changes so far %v, want %v", c.name, c.closeStatus(), got, want)
			}
			if f.typ() != "presence" {
				c.t.Fatalf("%s: unexpected frame %v while waiting for %v", c.name, f, want)
			}
			for _, ch := range f["changes"].([]any) {
				m := ch.(map[string]any)
				raw = append(raw, m)
				got = append(got, fmt.Sprintf("%s=%s", m["user_id"], m["state"]))
			}
		case <-deadline:
			c.t.Fatalf("%s: changes = %v, want %v", c.name, got, want)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		c.t.Fatalf("%s: changes = %v, want %v", c.name, got, want)
	}
	return raw
}

// expectQuiet asserts that no frame arrives for d.
func (c *wsClient) expectQuiet(d time.Duration) {
	c.t.Helper()
	select {
	case f, ok := <-c.frames:
		if ok {
			c.t.Fatalf("%s: expected nothing, got %v", c.name, f)
		}
	case <-time.After(d):
	}
}

// expectClosed waits for the server to close the connection with code.
func (c *wsClient) expectClosed(code websocket.StatusCode) {
	c.t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-c.frames:
			if !ok {
				if got := c.closeStatus(); got != code {
					c.t.Fatalf("%s: closed with %v, want %v", c.name, got, code)
				}
				return
			}
		case <-deadline:
			c.t.Fatalf("%s: not closed within 5s", c.name)
		}
	}
}

func (c *wsClient) closeStatus() websocket.StatusCode {
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	return c.closeSt
}

// heartbeatEvery keeps c alive until the test ends.
func (c *wsClient) heartbeatEvery(d time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				wctx, wcancel := context.WithTimeout(ctx, time.Second)
				_ = c.conn.Write(wctx, websocket.MessageText, []byte(`{"type":"heartbeat"}`))
				wcancel()
			}
		}
	}()
	c.t.Cleanup(func() { cancel(); <-done })
}

func snapshotUsers(f frame) map[string]string {
	out := map[string]string{}
	for _, u := range f["users"].([]any) {
		m := u.(map[string]any)
		out[m["user_id"].(string)] = m["state"].(string)
	}
	return out
}

// checkFor polls f until it returns nil or d has passed.
var checkFor = testwait.For

func (ts *testServer) presenceOf(user string) map[string]any {
	ts.t.Helper()
	code, body := ts.do("GET", "/v1/users/"+url.PathEscape(user)+"/presence", "")
	if code != 200 {
		ts.t.Fatalf("presence of %s: %d %s", user, code, body)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		ts.t.Fatal(err)
	}
	return m
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
