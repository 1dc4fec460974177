package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/internal/nodetest"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// binary is the greendot command built once for all tests: the descriptions
// are checked against what `greendot serve` really serves.
var binary string

func TestMain(m *testing.M) { nodetest.Main(m, &binary) }

// storeKinds are the stores every live test runs on.
var storeKinds = []string{"memory", "redis"}

// node is one `greendot serve` process.
type node struct {
	t      *testing.T
	addr   string
	redis  *redistest.Server // nil on the memory store
	proc   *nodetest.Node
	client *http.Client
}

// startNode starts greendot on a free port with the given store (for
// "redis", on its own redis-server) and extra flags, and waits until it is
// ready.
func startNode(t *testing.T, storeKind string, flags ...string) *node {
	t.Helper()
	n := &node{t: t, client: &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}}
	args := []string{"--store", storeKind, "--log-level", "warn"}
	if storeKind == "redis" {
		n.redis = redistest.Start(t)
		args = append(args, "--redis-url", n.redis.URL())
	}
	// Registered before the process's cleanup, so it runs after the kill.
	t.Cleanup(n.client.CloseIdleConnections)
	n.proc = nodetest.Start(t, binary, "greendot ("+storeKind+" store)", append(args, flags...)...)
	n.addr = n.proc.Addr
	return n
}

func (n *node) url(path string) string { return "http://" + n.addr + path }

// drain sends SIGTERM: the node tells its clients to reconnect, answers 503
// for a while, then exits.
func (n *node) drain() {
	if err := n.proc.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		n.t.Fatal(err)
	}
}

// scrape returns the sample names /metrics exposes (histograms as their
// _bucket, _sum and _count series, as PromQL sees them).
func (n *node) scrape(t *testing.T) map[string]bool {
	t.Helper()
	resp, err := n.client.Get(n.url("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names
}

// send makes an HTTP request and fails the test on a transport error.
func (n *node) send(t *testing.T, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, n.url(path), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := n.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// wsConn is a test client connection that hands every frame it reads to
// onFrame (the AsyncAPI check) before the test sees it.
type wsConn struct {
	t       *testing.T
	c       *websocket.Conn
	onFrame func(t *testing.T, data []byte)
}

func (n *node) dial(t *testing.T, query string, onFrame func(*testing.T, []byte)) *wsConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws://"+n.addr+"/v1/connect?"+query, &websocket.DialOptions{HTTPClient: n.client})
	if err != nil {
		t.Fatalf("dial ?%s: %v", query, err)
	}
	if resp.Body != nil {
		resp.Body.Close()
	}
	c.SetReadLimit(1 << 24)
	w := &wsConn{t: t, c: c, onFrame: onFrame}
	t.Cleanup(func() { _ = c.CloseNow() })
	return w
}

// write sends one text frame.
func (w *wsConn) write(frame string) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.c.Write(ctx, websocket.MessageText, []byte(frame)); err != nil {
		w.t.Fatalf("write %s: %v", frame, err)
	}
}

// read returns the next frame, decoded.
func (w *wsConn) read() map[string]any {
	w.t.Helper()
	f, err := w.tryRead()
	if err != nil {
		w.t.Fatal(err)
	}
	return f
}

func (w *wsConn) tryRead() (map[string]any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	typ, data, err := w.c.Read(ctx)
	if err != nil {
		return nil, err
	}
	if typ != websocket.MessageText {
		return nil, fmt.Errorf("server sent a binary frame")
	}
	if w.onFrame != nil {
		w.onFrame(w.t, data)
	}
	var f map[string]any
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("server frame %s: %v", data, err)
	}
	return f, nil
}

// readUntil reads frames until one of type typ arrives and returns it.
func (w *wsConn) readUntil(typ string) map[string]any {
	w.t.Helper()
	for {
		if f := w.read(); f["type"] == typ {
			return f
		}
	}
}

func (w *wsConn) close() { _ = w.c.Close(websocket.StatusNormalClosure, "") }
