package server_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/server"
)

// rawRequest writes raw on a new connection and reads the response that
// comes back before anything else is sent. The deadline only keeps a broken
// server from hanging the test.
func rawRequest(t *testing.T, addr, raw string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no response to %.60q…: %v", raw, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func errorCode(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("not a JSON error: %q", body)
	}
	return e.Error.Code
}

func metricLine(t *testing.T, ts *testServer, line string) bool {
	t.Helper()
	_, body := ts.do("GET", "/metrics", "")
	return strings.Contains(body, line+"\n")
}

func TestOversizedRequestHeadIsRefused(t *testing.T) {
	ts := startServer(t)
	// Under the limit: served.
	resp, _ := rawRequest(t, ts.addr, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: "+strings.Repeat("a", 12<<10)+"\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("a 12 KiB header: %s, want 200", resp.Status)
	}
	// Over it, one header or many, finished or not: 431 and a close.
	for name, raw := range map[string]string{
		"one long header":    "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("a", 40<<10),
		"many short headers": "GET /healthz HTTP/1.1\r\nHost: x\r\n" + strings.Repeat("X-A: bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\r\n", 1000),
		"a long url":         "GET /healthz?" + strings.Repeat("q", 40<<10) + " HTTP/1.1\r\nHost: x\r\n\r\n",
		// Whole, and only a little over: it may arrive in one or two reads.
		"a finished 20 KiB head": "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("a", 20<<10) + "\r\n\r\n",
	} {
		resp, body := rawRequest(t, ts.addr, raw)
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || errorCode(t, body) != "header_too_large" || !resp.Close {
			t.Errorf("%s: %s %q (close %v), want 431 header_too_large and Connection: close", name, resp.Status, body, resp.Close)
		}
	}
	if !metricLine(t, ts, `greendot_http_requests_refused_total{reason="header_too_large"} 4`) {
		t.Error(`greendot_http_requests_refused_total{reason="header_too_large"} is not 4`)
	}
}

// The API key is checked when the head is complete: a client without it is
// answered before it sends its body, so nothing of a big body is buffered.
func TestBodyWithoutAPIKeyIsRefusedBeforeItIsRead(t *testing.T) {
	ts := startServer(t, func(c *server.Config) { c.APIKey = "k3y" })
	const head = "POST /v1/presence/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4000000\r\n"
	for name, auth := range map[string]string{"no key": "", "wrong key": "Authorization: Bearer nope\r\n"} {
		resp, body := rawRequest(t, ts.addr, head+auth+"\r\n") // the head only
		if resp.StatusCode != http.StatusUnauthorized || errorCode(t, body) != "unauthorized" || !resp.Close {
			t.Errorf("%s: %s %q (close %v), want 401 unauthorized and a close, before the body", name, resp.Status, body, resp.Close)
		}
	}
	if !metricLine(t, ts, `greendot_http_requests_refused_total{reason="body_without_api_key"} 2`) {
		t.Error(`greendot_http_requests_refused_total{reason="body_without_api_key"} is not 2`)
	}
	// With the key, the body is read and the route answers: 413 over 1 MiB,
	// 200 under it.
	key := []string{"Authorization", "Bearer k3y"}
	if code, body := ts.do("POST", "/v1/presence/query", `{"user_ids":["`+strings.Repeat("x", 2<<20)+`"]}`, key...); code != 413 {
		t.Errorf("2 MiB body with the key: %d %.100s, want 413", code, body)
	}
	if code, body := ts.do("POST", "/v1/presence/query", `{"user_ids":["bob"]}`, key...); code != 200 {
		t.Errorf("query with the key: %d %s, want 200", code, body)
	}
	// A small body without the key reaches the route's own check.
	if code, body := ts.do("POST", "/v1/presence/query", `{"user_ids":["bob"]}`); code != 401 || errorCode(t, body) != "unauthorized" {
		t.Errorf("small body without the key: %d %s, want 401", code, body)
	}
}

// After an upgrade the connection carries WebSocket frames: no head limit.
func TestWebSocketTrafficIsNotARequestHead(t *testing.T) {
	ts := startServer(t, func(c *server.Config) { c.RateLimit, c.RateBurst = 1000, 1000 })
	c := ts.dial(t, "alice")
	for i := range 200 { // 200 × ~200 bytes: far over 16 KiB
		c.send(map[string]any{"type": "heartbeat", "id": fmt.Sprint(i, strings.Repeat("p", 150))})
		c.next("heartbeat_ack")
	}
}
