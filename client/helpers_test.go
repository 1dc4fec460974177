package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/greendot/greendot/internal/nodetest"
	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/protocol"
)

// serverBin is the greendot binary built once by TestMain; buildErr says
// why it could not be, and fails every test that needs it.
var (
	serverBin string
	buildErr  error
)

// testHTTP makes the tests' own API calls; its idle connections are closed
// before the leak check.
var testHTTP = &http.Client{Timeout: 5 * time.Second}

type mainRunner struct{ m *testing.M }

func (r mainRunner) Run() int {
	dir, err := os.MkdirTemp("", "greendot-client-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	serverBin, buildErr = nodetest.Build(dir)
	code := r.m.Run()
	testHTTP.CloseIdleConnections()
	http.DefaultClient.CloseIdleConnections()
	return code
}

// nbio (the in-process server of Example) starts a process-wide task pool
// in its package init; nothing of ours.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(mainRunner{m}, goleak.IgnoreTopFunction("github.com/lesismal/nbio/taskpool.New.func3"))
}

// checkFor polls f until it returns nil or d has passed.
var checkFor = testwait.For

// testServer is a greendot process on a free port of 127.0.0.1.
type testServer struct {
	t    testing.TB
	addr string
	args []string
	log  nodetest.SyncBuffer

	mu  sync.Mutex
	cmd *exec.Cmd // guarded by mu: the running process, nil when stopped
}

// startServer runs `greendot serve` with short timings (ttl 2s, heartbeat
// interval 500ms, grace 300ms) plus extra flags, and kills it at cleanup.
func startServer(t testing.TB, extra ...string) *testServer {
	t.Helper()
	if buildErr != nil {
		t.Fatalf("the server did not build: %v", buildErr)
	}
	addr := nodetest.FreeAddr(t)
	s := &testServer{t: t, addr: addr, args: append([]string{"serve", "--addr", addr,
		"--ttl", "2s", "--heartbeat-interval", "500ms", "--offline-grace", "300ms"}, extra...)}
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			t.Logf("server output:\n%s", s.log.String())
		}
	})
	s.start()
	return s
}

// start runs the process and waits until /healthz answers 200.
func (s *testServer) start() {
	s.t.Helper()
	cmd := exec.Command(serverBin, s.args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GREENDOT_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stdout, cmd.Stderr = &s.log, &s.log
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	checkFor(s.t, 10*time.Second, func() error {
		resp, err := testHTTP.Get("http://" + s.addr + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("healthz: %s", resp.Status)
		}
		return nil
	})
}

// kill ends the process at once, like a crash.
func (s *testServer) kill() { s.stop(syscall.SIGKILL) }

// terminate asks the process to drain (SIGTERM) and waits for it to exit.
func (s *testServer) terminate() { s.stop(syscall.SIGTERM) }

func (s *testServer) stop(sig syscall.Signal) {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		s.t.Errorf("server ignored %v for 20s; killing it", sig)
		_ = cmd.Process.Kill()
		<-exited
	}
}

func (s *testServer) url() string { return "ws://" + s.addr + "/v1/connect" }

// join puts users in a team through the HTTP API.
func (s *testServer) join(team string, users ...string) {
	s.t.Helper()
	for _, u := range users {
		req, _ := http.NewRequest(http.MethodPut, "http://"+s.addr+"/v1/teams/"+team+"/members/"+u, nil)
		resp, err := testHTTP.Do(req)
		if err != nil {
			s.t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			s.t.Fatalf("PUT team %s member %s: %s, want 204", team, u, resp.Status)
		}
	}
}

// testOptions are quick to reconnect and log to the test.
func testOptions(t testing.TB, user string) Options {
	return Options{
		User:          user,
		ReconnectBase: 50 * time.Millisecond,
		ReconnectMax:  500 * time.Millisecond,
		Logger:        slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})).With("client", user),
	}
}

// dial connects with opts and closes the client at cleanup.
func dial(t testing.TB, url string, opts Options) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, url, opts)
	if err != nil {
		t.Fatalf("Dial as %q: %v", opts.User, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// expectState waits until c holds state for user.
func expectState(t testing.TB, c *Client, user, state string) State {
	t.Helper()
	var got State
	checkFor(t, 5*time.Second, func() error {
		s, ok := c.Get(user)
		if !ok {
			s.State = "(nothing)"
		}
		got = s
		if s.State != state {
			return fmt.Errorf("%s as seen by %s: %s, want %s", user, c.Welcome().UserID, s.State, state)
		}
		return nil
	})
	return got
}

// expectOffline waits until c holds user offline or nothing at all.
func expectOffline(t testing.TB, c *Client, user string, timeout time.Duration) {
	t.Helper()
	checkFor(t, timeout, func() error {
		if s, ok := c.Get(user); ok && s.State != protocol.StateOffline {
			return fmt.Errorf("%s as seen by %s: %s, want offline", user, c.Welcome().UserID, s.State)
		}
		return nil
	})
}

func expectConnState(t testing.TB, c *Client, want ConnState) {
	t.Helper()
	checkFor(t, 5*time.Second, func() error {
		if got := c.State(); got != want {
			return fmt.Errorf("connection state %v, want %v", got, want)
		}
		return nil
	})
}

// recorder collects what the client hooks report, for assertions.
type recorder struct {
	mu      sync.Mutex
	changes []Change
	sent    []sentFrame
	ends    []error
	states  []StateChange
}

type sentFrame struct {
	typ string
	at  time.Time
}

func (r *recorder) hook(o *Options) {
	o.OnChange = func(ch Change) { r.mu.Lock(); r.changes = append(r.changes, ch); r.mu.Unlock() }
	o.OnStateChange = func(s StateChange) { r.mu.Lock(); r.states = append(r.states, s); r.mu.Unlock() }
	o.hooks.onSend = func(typ string, at time.Time) {
		r.mu.Lock()
		r.sent = append(r.sent, sentFrame{typ, at})
		r.mu.Unlock()
	}
	o.hooks.onSessionEnd = func(err error) { r.mu.Lock(); r.ends = append(r.ends, err); r.mu.Unlock() }
}

func (r *recorder) changesFor(user string) []Change {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Change
	for _, ch := range r.changes {
		if ch.UserID == user {
			out = append(out, ch)
		}
	}
	return out
}

func (r *recorder) sentOf(typ string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []time.Time
	for _, f := range r.sent {
		if f.typ == typ {
			out = append(out, f.at)
		}
	}
	return out
}

func (r *recorder) closeCodes() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int
	for _, err := range r.ends {
		out = append(out, int(websocket.CloseStatus(err)))
	}
	return out
}

// endings lists how the connections ended so far.
func (r *recorder) endings() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ends)
}

func (r *recorder) endedWith(target error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, err := range r.ends {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// fakeServer is a scripted WebSocket endpoint for what a real server does
// only on its own terms: stale versions, reconnect advice, silence. script
// runs once per connection, n counting from 0; the connection is closed
// when it returns. Cleanup stops every script and waits for it.
type fakeServer struct {
	*httptest.Server
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	count int
}

type fakeConn struct {
	*websocket.Conn
	ctx context.Context
	req *http.Request
	t   testing.TB
}

func newFakeServer(t testing.TB, script func(n int, c *fakeConn)) *fakeServer {
	return newRefusingFakeServer(t, nil, script)
}

// newRefusingFakeServer is newFakeServer whose refuse may answer handshake
// attempt n (0, 1, …) itself instead of accepting it.
func newRefusingFakeServer(t testing.TB, refuse func(n int, w http.ResponseWriter) bool, script func(n int, c *fakeConn)) *fakeServer {
	fs := &fakeServer{}
	fs.ctx, fs.cancel = context.WithCancel(context.Background())
	var attempts atomic.Int64
	fs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fs.wg.Add(1)
		defer fs.wg.Done()
		if refuse != nil && refuse(int(attempts.Add(1)-1), w) {
			return
		}
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		fs.mu.Lock()
		n := fs.count
		fs.count++
		fs.mu.Unlock()
		script(n, &fakeConn{Conn: conn, ctx: fs.ctx, req: r, t: t})
	}))
	t.Cleanup(func() {
		fs.cancel()
		fs.Server.Close()
		fs.wg.Wait()
	})
	return fs
}

func (fs *fakeServer) url() string { return "ws" + strings.TrimPrefix(fs.URL, "http") + "/v1/connect" }

func (fs *fakeServer) connections() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.count
}

// send writes one frame; errors end the script's connection anyway.
func (c *fakeConn) send(v any) {
	data, err := json.Marshal(v)
	if err != nil {
		c.t.Error(err)
		return
	}
	_ = c.Write(c.ctx, websocket.MessageText, data)
}

// hello sends welcome and snapshot.
func (c *fakeConn) hello(hbMS, ttlMS int64, users ...protocol.UserState) {
	c.send(protocol.Welcome{Type: protocol.TypeWelcome, ConnectionID: "fake", UserID: "alice",
		HeartbeatIntervalMS: hbMS, TTLMS: ttlMS})
	if users == nil {
		users = []protocol.UserState{}
	}
	c.send(protocol.Snapshot{Type: protocol.TypeSnapshot, Users: users})
}

// drain reads and discards frames until the connection or the server ends.
func (c *fakeConn) drain() {
	for {
		if _, _, err := c.Read(c.ctx); err != nil {
			return
		}
	}
}
