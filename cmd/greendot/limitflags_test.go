package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/internal/nodetest"
)

func TestLimitFlagsAreChecked(t *testing.T) {
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"serve", "--max-connections-per-user", "-1"}, "greendot: --max-connections-per-user must be 0 (unlimited) or more, got -1\n"},
		{nil, []string{"serve", "--large-team", "-1"}, "greendot: --large-team must be 0 (no team is large) or more, got -1\n"},
		{[]string{"GREENDOT_ALLOWED_ORIGINS=https://a.example.com,a.example.com"}, []string{"serve"},
			`greendot: --allowed-origins: "a.example.com" is not an origin: want scheme://host[:port], e.g. https://app.example.com, with no path` + "\n"},
		{nil, []string{"serve", "--allowed-origins", "https://a.example.com/"}, `greendot: --allowed-origins: "https://a.example.com/" is not an origin`},
		{nil, []string{"serve", "--log-repeat-interval", "-1s"}, "greendot: --log-repeat-interval must not be negative (0 = every line), got -1s\n"},
		{nil, []string{"serve", "--handshake-timeout", "0s"}, "greendot: --handshake-timeout must be positive, got 0s\n"},
		{[]string{"GREENDOT_MAX_UNAUTHENTICATED_PER_IP=-2"}, []string{"serve"}, "greendot: --max-unauthenticated-per-ip must be 0 (unlimited) or more, got -2\n"},
		{nil, []string{"serve", "--pusher-key", "k"}, "greendot: Pusher compatibility needs all three of --pusher-app-id, --pusher-key and --pusher-secret\n"},
		{[]string{"GREENDOT_PUSHER_APP_ID=a b"}, []string{"serve", "--pusher-key", "k", "--pusher-secret", "s"}, `greendot: --pusher-app-id "a b": use letters, digits, - and _ only` + "\n"},
		{nil, []string{"serve", "--pusher-client-events"}, "greendot: --pusher-client-events needs --pusher-app-id, --pusher-key and --pusher-secret\n"},
	} {
		r := runGreendot(t, c.env, c.args...)
		if r.code != 1 || !strings.HasPrefix(r.stderr, c.want) || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%v %q: exit %d, stderr:\n%s\nwant exit 1 and %q", c.env, c.args, r.code, r.stderr, c.want)
		}
	}
}

// connect dials a node's /v1/connect as user (dev mode) with headers; it
// returns 101 or the status of the refusal and its body.
func connect(t *testing.T, addr, user string, header http.Header) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, "ws://"+addr+"/v1/connect?user="+user, &websocket.DialOptions{HTTPHeader: header})
	if err == nil {
		t.Cleanup(func() { _ = conn.CloseNow() })
		return http.StatusSwitchingProtocols, ""
	}
	if resp == nil {
		t.Fatalf("connect %s: %v", user, err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestLimitFlagsReachTheServer(t *testing.T) {
	t.Setenv("GREENDOT_TEST_MAIN", "1")
	t.Setenv("GREENDOT_MAX_CONNECTIONS_PER_USER", "2")
	node := nodetest.Start(t, os.Args[0], "limits", "--allowed-origins", "https://app.example.com, http://localhost:3000")
	app := http.Header{"Origin": {"https://app.example.com"}}
	for i := range 2 {
		if code, body := connect(t, node.Addr, "alice", app); code != 101 {
			t.Fatalf("connection %d: %d %s", i+1, code, body)
		}
	}
	if code, body := connect(t, node.Addr, "alice", app); code != 429 || !strings.Contains(body, `"code":"too_many_connections"`) {
		t.Errorf("third connection: %d %s, want 429 too_many_connections", code, body)
	}
	if code, body := connect(t, node.Addr, "bob", http.Header{"Origin": {"https://evil.example.com"}}); code != 403 || !strings.Contains(body, `"code":"forbidden_origin"`) {
		t.Errorf("unlisted origin: %d %s, want 403 forbidden_origin", code, body)
	}
	if code, body := connect(t, node.Addr, "bob", http.Header{"Origin": {"http://localhost:3000"}}); code != 101 {
		t.Errorf("second listed origin: %d %s, want 101", code, body)
	}

	// 0 is unlimited.
	open := nodetest.Start(t, os.Args[0], "unlimited", "--max-connections-per-user", "0")
	for i := range 25 {
		if code, body := connect(t, open.Addr, "alice", nil); code != 101 {
			t.Fatalf("--max-connections-per-user 0, connection %d: %d %s", i+1, code, body)
		}
	}
}
