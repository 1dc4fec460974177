// Package hooktest is a real HTTP webhook receiver for tests: it verifies
// each request with the Standard Webhooks project's own Go library (not
// greendot's code), records it, and answers what the test tells it to.
// Only _test.go files import it.
package hooktest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// Secret is a signing secret in the whsec_<base64> form (32 bytes).
const Secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// Hang as an answer keeps the request open until the client gives up.
const Hang = -1

// Data is the data of a presence.changed body.
type Data struct {
	UserID        string   `json:"user_id"`
	State         string   `json:"state"`
	PreviousState string   `json:"previous_state"`
	Version       uint64   `json:"version"`
	At            int64    `json:"at"`
	LastSeen      *int64   `json:"last_seen"`
	Teams         []string `json:"teams"`
	Text          string   `json:"text"`
	Emoji         string   `json:"emoji"`
}

// Hook is one request received.
type Hook struct {
	ID        string
	Body      string
	Type      string
	Timestamp string // the body's
	Data      Data
	VerifyErr error // nil: the signature verified
	Status    int   // what the receiver answered (Hang: nothing)
	Header    http.Header
}

// Receiver records webhooks.
type Receiver struct {
	srv *httptest.Server
	wh  *standardwebhooks.Webhook

	mu      sync.Mutex
	answer  func(Hook) int
	all     []Hook
	open    int // requests being served
	maxOpen int
}

// Start runs a receiver until t's cleanup; it answers 204 until told
// otherwise.
func Start(t testing.TB) *Receiver {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(Secret)
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{wh: wh, answer: func(Hook) int { return http.StatusNoContent }}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(func() {
		r.srv.CloseClientConnections()
		r.srv.Close()
	})
	return r
}

// URL is where to send webhooks.
func (r *Receiver) URL() string { return r.srv.URL + "/hooks" }

// Answer sets what each request is answered: a status, or Hang.
func (r *Receiver) Answer(f func(Hook) int) {
	r.mu.Lock()
	r.answer = f
	r.mu.Unlock()
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	r.open++
	r.maxOpen = max(r.maxOpen, r.open)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.open--
		r.mu.Unlock()
	}()
	b, _ := io.ReadAll(req.Body)
	h := Hook{ID: req.Header.Get("webhook-id"), Body: string(b), Header: req.Header.Clone()}
	h.VerifyErr = r.wh.Verify(b, req.Header)
	if req.Method != http.MethodPost {
		h.VerifyErr = fmt.Errorf("method %s, want POST", req.Method)
	}
	var body struct {
		Type      string `json:"type"`
		Timestamp string `json:"timestamp"`
		Data      Data   `json:"data"`
	}
	if err := json.Unmarshal(b, &body); err != nil && h.VerifyErr == nil {
		h.VerifyErr = fmt.Errorf("body: %v", err)
	}
	h.Type, h.Timestamp, h.Data = body.Type, body.Timestamp, body.Data
	r.mu.Lock()
	h.Status = r.answer(h)
	r.all = append(r.all, h)
	r.mu.Unlock()
	if h.Status == Hang {
		<-req.Context().Done()
		return
	}
	w.WriteHeader(h.Status)
}

// MaxOpen is the most requests that were in progress at once.
func (r *Receiver) MaxOpen() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxOpen
}

// All is every request received, in order.
func (r *Receiver) All() []Hook {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Hook(nil), r.all...)
}

// Delivered is every request answered with a 2xx, in order.
func (r *Receiver) Delivered() []Hook {
	var out []Hook
	for _, h := range r.All() {
		if h.Status >= 200 && h.Status < 300 {
			out = append(out, h)
		}
	}
	return out
}

// Check fails t for any request whose signature or body was wrong.
func (r *Receiver) Check(t testing.TB) {
	t.Helper()
	for _, h := range r.All() {
		if h.VerifyErr != nil {
			t.Fatalf("webhook %s did not verify: %v\n%s", h.ID, h.VerifyErr, h.Body)
		}
		if h.Type != "presence.changed" {
			t.Fatalf("webhook %s: type %q", h.ID, h.Type)
		}
	}
}

// VerifyIgnoringTimestamp checks a signature with the Standard Webhooks
// library, for a fixed timestamp.
func VerifyIgnoringTimestamp(body []byte, h http.Header) error {
	wh, err := standardwebhooks.NewWebhook(Secret)
	if err != nil {
		return err
	}
	return wh.VerifyIgnoringTimestamp(body, h)
}
