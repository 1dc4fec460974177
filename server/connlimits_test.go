package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/server"
)

// tryConnect opens a WebSocket as user (dev mode) with extra headers and
// returns the connection, or the HTTP status and body of the refusal.
func tryConnect(t *testing.T, ts *testServer, user string, header http.Header) (*websocket.Conn, int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, "ws://"+ts.addr+"/v1/connect?user="+user, &websocket.DialOptions{HTTPHeader: header})
	if err == nil {
		t.Cleanup(func() { _ = conn.CloseNow() })
		return conn, http.StatusSwitchingProtocols, ""
	}
	if resp == nil {
		t.Fatalf("connect %s: %v", user, err)
	}
	b, _ := io.ReadAll(resp.Body)
	return nil, resp.StatusCode, string(b)
}

func TestConnectionsPerUserAreCapped(t *testing.T) {
	ts := startServer(t, func(c *server.Config) { c.MaxConnectionsPerUser = 3 })
	var alice []*wsClient
	for range 3 {
		alice = append(alice, ts.dial(t, "alice"))
	}
	_, code, body := tryConnect(t, ts, "alice", nil)
	if code != http.StatusTooManyRequests || errorCode(t, body) != "too_many_connections" {
		t.Fatalf("alice's 4th connection: %d %q, want 429 too_many_connections", code, body)
	}
	if !metricLine(t, ts, `greendot_connects_rejected_total{reason="too_many_connections"} 1`) {
		t.Error(`greendot_connects_rejected_total{reason="too_many_connections"} is not 1`)
	}
	ts.dial(t, "bob") // the cap is per user

	// A closed connection frees its place.
	alice[0].close()
	testwait.For(t, 5*time.Second, func() error {
		conn, code, body := tryConnect(t, ts, "alice", nil)
		if conn == nil {
			return fmt.Errorf("alice after closing one: %d %s", code, body)
		}
		return nil
	})
}

func TestDefaultCapIsTwenty(t *testing.T) {
	ts := startServer(t)
	for i := range 20 {
		if conn, code, body := tryConnect(t, ts, "alice", nil); conn == nil {
			t.Fatalf("connection %d: %d %s", i+1, code, body)
		}
	}
	if _, code, _ := tryConnect(t, ts, "alice", nil); code != http.StatusTooManyRequests {
		t.Fatalf("connection 21: %d, want 429", code)
	}
	unlimited := startServer(t, func(c *server.Config) { c.MaxConnectionsPerUser = -1 })
	for i := range 25 {
		if conn, code, body := tryConnect(t, unlimited, "alice", nil); conn == nil {
			t.Fatalf("unlimited, connection %d: %d %s", i+1, code, body)
		}
	}
}

// Simultaneous connects of one user cannot all pass the check.
func TestSimultaneousConnectsRespectTheCap(t *testing.T) {
	ts := startServer(t, func(c *server.Config) { c.MaxConnectionsPerUser = 5 })
	var (
		wg          sync.WaitGroup
		mu          sync.Mutex
		ok, refused int
		other       []string
	)
	for range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, code, body := tryConnect(t, ts, "alice", nil)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case conn != nil:
				ok++
			case code == http.StatusTooManyRequests:
				refused++
			default:
				other = append(other, fmt.Sprint(code, " ", body))
			}
		}()
	}
	wg.Wait()
	if ok > 5 || ok == 0 || ok+refused != 40 {
		t.Fatalf("40 simultaneous connects with a cap of 5: %d accepted, %d got 429, others %q", ok, refused, other)
	}
}

func TestUpgradesFromUnlistedOriginsAreRefused(t *testing.T) {
	ts := startServer(t, func(c *server.Config) {
		c.AllowedOrigins = []string{"https://app.example.com", "http://localhost:3000"}
	})
	for origin, want := range map[string]int{
		"https://app.example.com":     101,
		"https://APP.example.com":     101, // hosts are case-insensitive
		"http://localhost:3000":       101,
		"https://evil.example.com":    403,
		"https://app.example.com:443": 403, // exact: browsers omit the default port
		"http://app.example.com":      403,
		"http://localhost:3001":       403,
		"null":                        403,
	} {
		_, code, body := tryConnect(t, ts, "alice", http.Header{"Origin": {origin}})
		if code != want || (want == 403 && errorCode(t, body) != "forbidden_origin") {
			t.Errorf("Origin %s: %d %q, want %d", origin, code, body, want)
		}
	}
	if conn, code, body := tryConnect(t, ts, "alice", nil); conn == nil {
		t.Errorf("no Origin (not a browser): %d %s, want 101", code, body)
	}
	if !metricLine(t, ts, `greendot_connects_rejected_total{reason="forbidden_origin"} 5`) {
		t.Error(`greendot_connects_rejected_total{reason="forbidden_origin"} is not 5`)
	}
	// Without a list, any origin may connect.
	open := startServer(t)
	if conn, code, body := tryConnect(t, open, "alice", http.Header{"Origin": {"https://evil.example.com"}}); conn == nil {
		t.Errorf("no --allowed-origins: %d %s, want 101", code, body)
	}
}

func TestAllowedOriginsMustBeOrigins(t *testing.T) {
	for _, bad := range []string{"app.example.com", "https://app.example.com/", "https://app.example.com/path", "*", "https://", "https://u@app.example.com"} {
		if _, err := server.ParseOrigins("https://ok.example.com, " + bad); err == nil {
			t.Errorf("ParseOrigins accepted %q", bad)
		}
	}
	got, err := server.ParseOrigins(" https://a.example.com ,http://localhost:3000,")
	if err != nil || len(got) != 2 || got[0] != "https://a.example.com" || got[1] != "http://localhost:3000" {
		t.Errorf("ParseOrigins: %q, %v", got, err)
	}
}
