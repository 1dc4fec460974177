// Package e2e runs several greendot processes on real redis-server
// processes and checks the contract across nodes and through faults:
// kill -9 of a node, Redis down and back, FLUSHALL, a rolling deploy.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/greendot/greendot/client"
	"github.com/greendot/greendot/internal/nodetest"
	"github.com/greendot/greendot/internal/testwait"
)

// binary is the greendot command built once for all tests.
var binary string

func TestMain(m *testing.M) { nodetest.Main(m, &binary) }

// node is one greendot process.
type node struct {
	t    *testing.T
	name string
	addr string
	proc *nodetest.Node
	// proc's, by the names the tests use
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	log  *nodetest.SyncBuffer
}

type timing struct {
	ttl, heartbeat, grace time.Duration
}

func startNode(t *testing.T, redisURL, name string, tm timing, flags ...string) *node {
	t.Helper()
	p := nodetest.Start(t, binary, name, append([]string{"--store", "redis", "--redis-url", redisURL,
		"--node-id", name, "--ttl", tm.ttl.String(), "--heartbeat-interval", tm.heartbeat.String(),
		"--offline-grace", tm.grace.String()}, flags...)...)
	return &node{t: t, name: name, addr: p.Addr, proc: p, cmd: p.Cmd, done: p.Done, log: p.Log}
}

// kill ends the process at once, like a crash.
func (n *node) kill() { n.proc.Kill() }

func (n *node) sigterm() {
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
}

func (n *node) ws() string { return "ws://" + n.addr + "/v1/connect" }

func (n *node) get(path string) (int, string) { return n.do("GET", path) }

func (n *node) do(method, path string) (int, string) {
	req, _ := http.NewRequest(method, "http://"+n.addr+path, nil)
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (n *node) join(team string, users ...string) {
	n.t.Helper()
	for _, u := range users {
		if code, body := n.do("PUT", "/v1/teams/"+team+"/members/"+u); code != 204 {
			n.t.Fatalf("join %s %s on %s: %d %s", team, u, n.name, code, body)
		}
	}
}

func (n *node) presence(user string) map[string]any {
	n.t.Helper()
	code, body := n.get("/v1/users/" + user + "/presence")
	if code != 200 {
		n.t.Fatalf("presence of %s on %s: %d %s", user, n.name, code, body)
	}
	var m map[string]any
	_ = json.Unmarshal([]byte(body), &m)
	return m
}

// viewer is a Go client that records every change it applies.
type viewer struct {
	t   *testing.T
	c   *client.Client
	mu  sync.Mutex
	ch  []string // dot moves: user=state
	raw []string // every change after the snapshot, restatements too
	log []string // everything, snapshots and connection states too, timed: printed by failures
}

func connect(t *testing.T, n *node, user, device string) *viewer {
	t.Helper()
	v := &viewer{t: t}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, n.ws(), client.Options{
		User: user, Device: device,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnChange: func(ch client.Change) {
			v.mu.Lock()
			defer v.mu.Unlock()
			v.log = append(v.log, fmt.Sprintf("%s %s=%s v%d(was %q) snapshot=%v",
				time.Now().Format("15:04:05.000"), ch.UserID, ch.State, ch.Version, ch.Previous, ch.FromSnapshot))
			if !ch.FromSnapshot {
				v.raw = append(v.raw, fmt.Sprintf("%s=%s(was %q)", ch.UserID, ch.State, ch.Previous))
			}
			if ch.State == ch.Previous {
				return // restated (a newer version of the same state): no dot moves
			}
			v.ch = append(v.ch, ch.UserID+"="+ch.State)
		},
		OnStateChange: func(sc client.StateChange) {
			v.mu.Lock()
			defer v.mu.Unlock()
			v.log = append(v.log, fmt.Sprintf("%s %s err=%v code=%d", time.Now().Format("15:04:05.000"), sc.State, sc.Err, sc.CloseCode))
		},
	})
	if err != nil {
		t.Fatalf("%s on %s: %v", user, n.name, err)
	}
	v.c = c
	t.Cleanup(func() { _ = c.Close() })
	return v
}

func (v *viewer) changes() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.ch...)
}

// rawChanges is every change applied after the snapshot, restatements too.
func (v *viewer) rawChanges() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.raw...)
}

// events is everything the viewer saw, one line each, for a failure's message.
func (v *viewer) events() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return strings.Join(v.log, "\n")
}

// expect waits until the changes seen equal want.
func (v *viewer) expect(within time.Duration, want ...string) {
	v.t.Helper()
	checkFor(v.t, within, func() error {
		if got := v.changes(); fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("changes = %v, want %v", got, want)
		}
		return nil
	})
}

// still asserts the changes stay exactly want for d.
func (v *viewer) still(d time.Duration, want ...string) {
	v.t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if got := v.changes(); fmt.Sprint(got) != fmt.Sprint(want) {
			v.t.Fatalf("changes = %v, want still %v", got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkFor polls f until it returns nil or d has passed.
var checkFor = testwait.For

var freeAddr = nodetest.FreeAddr

func metric(n *node, name string) string {
	_, body := n.get("/metrics")
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, name+" ") {
			return strings.TrimPrefix(line, name+" ")
		}
	}
	return ""
}
