// Package pushertest is a Pusher protocol 7 socket for tests, speaking as
// pusher-js does, and Pusher's signed REST calls as the server SDKs make
// them.
package pushertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/pusher"
)

// App is the Pusher app a server runs with.
type App struct{ ID, Key, Secret string }

// Socket is one Pusher socket; its frames arrive on Frames.
type Socket struct {
	t        testing.TB
	Name     string
	App      App
	conn     *websocket.Conn
	Frames   chan map[string]any
	done     chan struct{}
	cancel   context.CancelFunc
	SocketID string
}

// DialKey connects to addr's /app/{key} and reads nothing. keepalive > 0
// sends pusher:ping that often, as pusher-js does when idle, and drops the
// pongs.
func DialKey(t testing.TB, addr string, app App, key, name string, keepalive time.Duration) *Socket {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	defer dcancel()
	conn, _, err := websocket.Dial(dctx, "ws://"+addr+"/app/"+key+"?protocol=7&client=js&version=8.4.0", nil)
	if err != nil {
		cancel()
		t.Fatalf("%s: dial %s /app/%s: %v", name, addr, key, err)
	}
	s := &Socket{t: t, Name: name, App: app, conn: conn, Frames: make(chan map[string]any, 256),
		done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(s.done)
		defer close(s.Frames)
		for {
			_, data, err := conn.Read(ctx)
			if err != nil {
				return
			}
			var f map[string]any
			if err := json.Unmarshal(data, &f); err != nil {
				t.Errorf("%s: frame is not JSON: %q", name, data)
				continue
			}
			if keepalive > 0 && f["event"] == "pusher:pong" {
				continue
			}
			select {
			case s.Frames <- f:
			case <-ctx.Done():
				return
			}
		}
	}()
	if keepalive > 0 {
		go func() {
			tick := time.NewTicker(keepalive)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					_ = conn.Write(ctx, websocket.MessageText, []byte(`{"event":"pusher:ping","data":{}}`))
				}
			}
		}()
	}
	t.Cleanup(s.Close)
	return s
}

// Dial connects with the app's key and reads connection_established.
func Dial(t testing.TB, addr string, app App, name string, keepalive time.Duration) *Socket {
	t.Helper()
	s := DialKey(t, addr, app, app.Key, name, keepalive)
	var d struct {
		SocketID        string `json:"socket_id"`
		ActivityTimeout int    `json:"activity_timeout"`
	}
	s.Data(s.Next("pusher:connection_established"), &d)
	if !pusher.ValidSocketID(d.SocketID) || d.ActivityTimeout < 1 {
		t.Fatalf("%s: connection_established data %+v", name, d)
	}
	s.SocketID = d.SocketID
	return s
}

// Close closes the socket at once, without a close frame.
func (s *Socket) Close() {
	s.cancel()
	_ = s.conn.CloseNow()
	<-s.done
}

// Send writes v as JSON; a failure ends the test.
func (s *Socket) Send(v any) {
	s.t.Helper()
	if err := s.Write(v); err != nil {
		s.t.Fatal(err)
	}
}

// Write writes v as JSON and returns what failed: for goroutines other
// than the test's, which must not end it.
func (s *Socket) Write(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.conn.Write(ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("%s: write: %w", s.Name, err)
	}
	return nil
}

// NextWithin returns the next frame, which must be event.
func (s *Socket) NextWithin(d time.Duration, event string) map[string]any {
	s.t.Helper()
	select {
	case f, ok := <-s.Frames:
		if !ok {
			s.t.Fatalf("%s: closed while waiting for %s", s.Name, event)
		}
		if f["event"] != event {
			s.t.Fatalf("%s: got %v, want %s", s.Name, f, event)
		}
		return f
	case <-time.After(d):
		s.t.Fatalf("%s: no %s within %v", s.Name, event, d)
	}
	return nil
}

// Next is NextWithin 10 s.
func (s *Socket) Next(event string) map[string]any { return s.NextWithin(10*time.Second, event) }

// Until skips frames up to the next event.
func (s *Socket) Until(event string) map[string]any {
	s.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case f, ok := <-s.Frames:
			if !ok {
				s.t.Fatalf("%s: closed while waiting for %s", s.Name, event)
			}
			if f["event"] == event {
				return f
			}
		case <-deadline:
			s.t.Fatalf("%s: no %s within 10s", s.Name, event)
		}
	}
}

// Quiet fails if a frame comes within d.
func (s *Socket) Quiet(d time.Duration) {
	s.t.Helper()
	select {
	case f, ok := <-s.Frames:
		if ok {
			s.t.Fatalf("%s: unexpected %v", s.Name, f)
		}
	case <-time.After(d):
	}
}

// Data decodes a frame's data, a JSON string holding JSON.
func (s *Socket) Data(f map[string]any, v any) {
	s.t.Helper()
	str, ok := f["data"].(string)
	if !ok {
		s.t.Fatalf("%s: data of %v is not a JSON string", s.Name, f)
	}
	if err := json.Unmarshal([]byte(str), v); err != nil {
		s.t.Fatalf("%s: data of %v: %v", s.Name, f, err)
	}
}

// SubscribePresence sends a signed subscription of presence-{team} as user.
func (s *Socket) SubscribePresence(team, user, info string) {
	s.t.Helper()
	ch := "presence-" + team
	cd := fmt.Sprintf(`{"user_id":%q,"user_info":%s}`, user, info)
	s.Send(map[string]any{"event": "pusher:subscribe", "data": map[string]string{"channel": ch,
		"auth": s.App.Key + ":" + pusher.SignChannel(s.App.Secret, s.SocketID, ch, cd), "channel_data": cd}})
}

// Members reads subscription_succeeded of ch and returns its members' infos.
func (s *Socket) Members(ch string) map[string]json.RawMessage {
	s.t.Helper()
	f := s.Next("pusher_internal:subscription_succeeded")
	if f["channel"] != ch {
		s.t.Fatalf("%s: subscription_succeeded for %v, want %s", s.Name, f["channel"], ch)
	}
	var d struct {
		Presence struct {
			IDs   []string                   `json:"ids"`
			Hash  map[string]json.RawMessage `json:"hash"`
			Count int                        `json:"count"`
		} `json:"presence"`
	}
	s.Data(f, &d)
	if d.Presence.Count != len(d.Presence.IDs) || len(d.Presence.Hash) != len(d.Presence.IDs) {
		s.t.Fatalf("%s: inconsistent presence data %+v", s.Name, d)
	}
	return d.Presence.Hash
}

// MemberEvent reads a member_added or member_removed.
func (s *Socket) MemberEvent(event string, within time.Duration) (user, info string) {
	s.t.Helper()
	var d struct {
		UserID   string          `json:"user_id"`
		UserInfo json.RawMessage `json:"user_info"`
	}
	s.Data(s.NextWithin(within, event), &d)
	return d.UserID, string(d.UserInfo)
}

// REST sends a REST request to addr signed with secret, and returns status
// and body.
func REST(t testing.TB, addr string, app App, secret, method, path string, q url.Values, body string) (int, string) {
	t.Helper()
	if q == nil {
		q = url.Values{}
	}
	q = pusher.SignRequest(app.Key, secret, method, path, q, []byte(body), time.Now())
	req, err := http.NewRequest(method, "http://"+addr+path+"?"+q.Encode(), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}
