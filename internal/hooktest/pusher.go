package hooktest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// PusherKey and PusherSecret are the Pusher app credentials of the tests.
const (
	PusherKey    = "hookkey"
	PusherSecret = "hooksecret"
)

// PusherEvent is one event of a Pusher webhook.
type PusherEvent struct {
	Name    string `json:"name"`
	Channel string `json:"channel"`
	UserID  string `json:"user_id"`
}

// PusherHook is one Pusher webhook request received.
type PusherHook struct {
	Body      string
	TimeMs    int64
	Events    []PusherEvent
	VerifyErr error // nil: the headers and signature were right
	Status    int
}

// PusherReceiver records Pusher-format webhooks, checking each the way
// Pusher's server libraries do (X-Pusher-Key is the app key, and
// X-Pusher-Signature the hex HMAC-SHA256 of the body by the app secret),
// written here again rather than taken from greendot's code.
type PusherReceiver struct {
	srv *httptest.Server

	mu     sync.Mutex
	answer func(PusherHook) int
	all    []PusherHook
}

// StartPusher runs a Pusher receiver until t's cleanup; it answers 200
// until told otherwise.
func StartPusher(t testing.TB) *PusherReceiver {
	t.Helper()
	r := &PusherReceiver{answer: func(PusherHook) int { return http.StatusOK }}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(func() {
		r.srv.CloseClientConnections()
		r.srv.Close()
	})
	return r
}

// URL is where to send webhooks.
func (r *PusherReceiver) URL() string { return r.srv.URL + "/pusher" }

// Answer sets the status each request is answered.
func (r *PusherReceiver) Answer(f func(PusherHook) int) {
	r.mu.Lock()
	r.answer = f
	r.mu.Unlock()
}

func (r *PusherReceiver) serve(w http.ResponseWriter, req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	h := PusherHook{Body: string(b), VerifyErr: VerifyPusher(b, req.Header)}
	if req.Method != http.MethodPost {
		h.VerifyErr = fmt.Errorf("method %s, want POST", req.Method)
	}
	var body struct {
		TimeMs int64         `json:"time_ms"`
		Events []PusherEvent `json:"events"`
	}
	if err := json.Unmarshal(b, &body); err != nil && h.VerifyErr == nil {
		h.VerifyErr = fmt.Errorf("body: %v", err)
	}
	h.TimeMs, h.Events = body.TimeMs, body.Events
	r.mu.Lock()
	h.Status = r.answer(h)
	r.all = append(r.all, h)
	r.mu.Unlock()
	w.WriteHeader(h.Status)
}

// VerifyPusher checks a Pusher webhook's headers against body.
func VerifyPusher(body []byte, h http.Header) error {
	if ct := h.Get("Content-Type"); ct != "application/json" {
		return fmt.Errorf("Content-Type %q", ct)
	}
	if k := h.Get("X-Pusher-Key"); k != PusherKey {
		return fmt.Errorf("X-Pusher-Key %q, want %q", k, PusherKey)
	}
	m := hmac.New(sha256.New, []byte(PusherSecret))
	m.Write(body)
	if !hmac.Equal([]byte(h.Get("X-Pusher-Signature")), []byte(hex.EncodeToString(m.Sum(nil)))) {
		return errors.New("X-Pusher-Signature does not match the body")
	}
	return nil
}

// All is every request received, in order.
func (r *PusherReceiver) All() []PusherHook {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]PusherHook(nil), r.all...)
}

// Delivered is every request answered with a 2xx, in order.
func (r *PusherReceiver) Delivered() []PusherHook {
	var out []PusherHook
	for _, h := range r.All() {
		if h.Status >= 200 && h.Status < 300 {
			out = append(out, h)
		}
	}
	return out
}

// Check fails t for any request whose headers, signature or body were wrong.
func (r *PusherReceiver) Check(t testing.TB) {
	t.Helper()
	for _, h := range r.All() {
		if h.VerifyErr != nil {
			t.Fatalf("Pusher webhook did not verify: %v\n%s", h.VerifyErr, h.Body)
		}
	}
}
