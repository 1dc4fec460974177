package server_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/server"
)

// upgradeRequest is a WebSocket upgrade of user (dev mode), by hand.
func upgradeRequest(user string) string {
	return "GET /v1/connect?user=" + user + " HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
}

// waitClosed reads c until the server closes it; the deadline only keeps a
// broken server from hanging the test.
func waitClosed(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the server kept the connection open")
	}
}

func TestHandshakeTimeoutClosesSlowAndIdleSockets(t *testing.T) {
	ts := startServer(t, func(c *server.Config) { c.HandshakeTimeout = 300 * time.Millisecond })
	ws := ts.dial(t, "alice") // upgraded before: not bound by the handshake timeout

	idle := dialTCP(t, ts.addr)
	slow := dialTCP(t, ts.addr)
	// A slowloris head: a header now and then, never the end.
	if _, err := io.WriteString(slow, "GET /healthz HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := io.WriteString(slow, "X-A: b\r\n"); err != nil {
				return
			}
		}
	}()
	waitClosed(t, idle)
	waitClosed(t, slow)
	close(stop)
	<-done

	// A keep-alive socket idle past the timeout after its response, too.
	ka := dialTCP(t, ts.addr)
	br := bufio.NewReader(ka)
	if _, err := io.WriteString(ka, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
	resp.Body.Close()
	waitClosed(t, ka)

	// The WebSocket outlived all of that.
	ws.send(map[string]any{"type": "heartbeat", "id": 1})
	ws.next("heartbeat_ack")
}

func dialTCP(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// refusedAtAccept reports whether the server answered c with a 429
// too_many_connections before anything was sent.
func refusedAtAccept(t *testing.T, c net.Conn) (bool, string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusTooManyRequests && strings.Contains(string(b), `"too_many_connections"`), resp.Status + " " + string(b)
}

func TestUnauthenticatedSocketsPerIPAreCapped(t *testing.T) {
	ts := startServer(t, func(c *server.Config) {
		c.MaxUnauthenticatedPerIP = 3
		c.HandshakeTimeout = time.Minute // only the cap closes sockets here
	})
	held := []net.Conn{dialTCP(t, ts.addr), dialTCP(t, ts.addr), dialTCP(t, ts.addr)}
	fourth := dialTCP(t, ts.addr)
	if ok, got := refusedAtAccept(t, fourth); !ok {
		t.Fatalf("a 4th unauthenticated socket: %s, want 429 too_many_connections", got)
	}
	// A request on a held socket does not authenticate it (no API key is
	// set): the cap still holds.
	br := bufio.NewReader(held[0])
	if _, err := io.WriteString(held[0], "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ok, got := refusedAtAccept(t, dialTCP(t, ts.addr)); !ok {
		t.Fatalf("after a request without a key: %s, want 429", got)
	}

	// An accepted upgrade authenticates its socket and frees its place.
	if _, err := io.WriteString(held[1], upgradeRequest("alice")); err != nil {
		t.Fatal(err)
	}
	resp, err = http.ReadResponse(bufio.NewReader(held[1]), nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	testwait.For(t, 5*time.Second, func() error {
		c := dialTCP(t, ts.addr)
		defer c.Close() // a poll must not hold a place itself
		if ok, got := refusedAtAccept(t, c); ok {
			return errors.New("still refused: " + got)
		}
		return nil
	})
	// A closed socket frees its place too: the last one taken is closed.
	held[2].Close()
	testwait.For(t, 5*time.Second, func() error {
		c := dialTCP(t, ts.addr)
		defer c.Close()
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return errors.New(resp.Status)
		}
		return nil
	})
	// Room for the metrics request; until the server has counted the closes
	// above, a new socket may still be refused at accept, so the request is
	// part of the condition waited on.
	held[0].Close()
	// Two refusals above, and those of the polls while the upgrade was
	// being counted.
	const refused = `greendot_sockets_refused_total{reason="unauthenticated_per_ip"}`
	testwait.For(t, 5*time.Second, func() error {
		n, err := metricValue(ts, refused)
		if err != nil {
			return err
		}
		if n < 2 {
			return fmt.Errorf("%s is %v, want at least 2", refused, n)
		}
		return nil
	})
}

// metricValue is the value of the sample named name (with its labels), -1
// when there is none.
func metricValue(ts *testServer, name string) (float64, error) {
	resp, err := http.Get(ts.url("/metrics"))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: %s %s", resp.Status, b)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return -1, nil
}

func TestAPIKeyRequestAuthenticatesItsSocket(t *testing.T) {
	ts := startServer(t, func(c *server.Config) {
		c.MaxUnauthenticatedPerIP = 1
		c.APIKey = "k"
		c.HandshakeTimeout = time.Minute
	})
	c := dialTCP(t, ts.addr)
	if _, err := io.WriteString(c, "GET /v1/users/bob/presence HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("presence with the key: %v %v", resp, err)
	}
	resp.Body.Close()
	// c stays open, authenticated: another unauthenticated socket fits.
	second := dialTCP(t, ts.addr)
	if ok, got := refusedAtAccept(t, second); ok {
		t.Fatalf("second socket refused: %s", got)
	}
	if ok, got := refusedAtAccept(t, dialTCP(t, ts.addr)); !ok {
		t.Fatalf("third socket: %s, want 429 (one unauthenticated held)", got)
	}
}
