package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/nodetest"
	"github.com/greendot/greendot/internal/testwait"
)

// upgrade opens a WebSocket of user (dev mode) by hand and reports the
// answer's status: 101 keeps c open; 0 means the socket was reset or closed
// without an answer.
func upgrade(t *testing.T, addr, user string) (c net.Conn, status int, body string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second)) // only against a hang
	req := "GET /v1/connect?user=" + user + " HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		c.Close()
		return nil, 0, err.Error()
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("upgrade of %s: no answer and no close in 10 s", user)
		}
		c.Close()
		return nil, 0, err.Error()
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		return nil, resp.StatusCode, string(b)
	}
	_ = c.SetDeadline(time.Time{})
	return c, resp.StatusCode, ""
}

// At its file descriptor limit a node refuses new sockets with a 503, logs
// that once, not once per socket, and takes sockets again once some close.
func TestFileDescriptorLimitIsACleanRefusal(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Fatal("this test needs prlimit (util-linux) to start a node under a low file descriptor limit: apt-get install util-linux")
	}
	t.Setenv("GREENDOT_TEST_MAIN", "1")
	const limit = 256
	node := nodetest.StartUnder(t, []string{prlimit, fmt.Sprintf("--nofile=%d:%d", limit, limit), "--"},
		os.Args[0], "fdlimit", "--max-unauthenticated-per-ip", "0")

	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	refused503, reset := 0, 0
	for i := 0; i < 2*limit && refused503 < 20; i++ {
		c, status, body := upgrade(t, node.Addr, fmt.Sprintf("u%d", i))
		switch status {
		case http.StatusSwitchingProtocols:
			held = append(held, c)
		case http.StatusServiceUnavailable:
			if !strings.Contains(body, `"unavailable"`) {
				t.Fatalf("503 without the unavailable code: %q", body)
			}
			refused503++
		case 0:
			reset++ // a refused socket whose answer was lost
		default:
			t.Fatalf("upgrade %d: %d %q", i, status, body)
		}
	}
	t.Logf("%d WebSockets held, %d refused with 503, %d reset", len(held), refused503, reset)
	if refused503 == 0 {
		t.Fatalf("no 503 after %d WebSockets under a limit of %d descriptors", len(held), limit)
	}
	if len(held) < limit/2 || len(held) >= limit {
		t.Errorf("%d WebSockets held under a limit of %d: the reserve is off", len(held), limit)
	}
	log := node.Log.String()
	if strings.Contains(log, "too many open files") {
		t.Errorf("the log has nbio's own line:\n%s", log)
	}
	if n := strings.Count(log, "near its file descriptor limit"); n != 1 {
		t.Errorf("%d log lines about the descriptor limit, want 1 (once a minute):\n%s", n, log)
	}

	// Closing some frees room: the node takes sockets again by itself.
	for _, c := range held[:20] {
		c.Close()
	}
	held = held[20:]
	testwait.For(t, 10*time.Second, func() error {
		c, status, body := upgrade(t, node.Addr, "after")
		if status != http.StatusSwitchingProtocols {
			return fmt.Errorf("after closing 20: %d %q", status, body)
		}
		held = append(held, c)
		return nil
	})
}
