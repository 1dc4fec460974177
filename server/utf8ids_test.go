package server_test

import (
	"strings"
	"testing"
)

// Invalid UTF-8 in an id, raw or as a lone surrogate escape, is a 400, not
// an id silently rewritten to U+FFFD.
func TestHTTPIDsMustBeValidUTF8(t *testing.T) {
	ts := startServer(t)
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/v1/presence/query", "{\"user_ids\":[\"a\xffb\"]}"},
		{"POST", "/v1/presence/query", "{\"user_ids\":[\"ok\",\"\xc3\"]}"},
		{"POST", "/v1/presence/query", `{"user_ids":["a\ud800b"]}`},
		{"POST", "/v1/presence/query", `{"user_ids":["\udc00"]}`},
		{"GET", "/v1/users/a%FFb/presence", ""},
		{"GET", "/v1/users/a\xffb/presence", ""},
		{"PUT", "/v1/teams/t%C3/members/bob", ""},
		{"PUT", "/v1/teams/t1/members/b%80ob", ""},
		{"GET", "/v1/teams/%ED%A0%80/presence", ""}, // a surrogate in UTF-8 form
	} {
		code, body := ts.do(tc.method, tc.path, tc.body)
		if code != 400 || !strings.Contains(body, `"code":"bad_request"`) {
			t.Errorf("%s %q %q: %d %s, want 400 bad_request", tc.method, tc.path, tc.body, code, body)
		}
	}
	// A real U+FFFD, sent as such, and a surrogate pair are valid.
	for _, body := range []string{`{"user_ids":["a\ufffdb","a` + "\uFFFD" + `b"]}`, `{"user_ids":["\ud83d\ude00"]}`} {
		if code, resp := ts.do("POST", "/v1/presence/query", body); code != 200 {
			t.Errorf("%q: %d %s, want 200", body, code, resp)
		}
	}
}

// The WebSocket query agrees with the HTTP one: a lone surrogate escape
// in an id is a bad_request error frame (the connection stays open), not
// an id silently rewritten to U+FFFD. Raw invalid UTF-8 never gets this
// far: the WebSocket layer closes with 1002 (invalid UTF-8 bytes).
func TestWebSocketQueryIDsMustBeValidUTF8(t *testing.T) {
	ts := startServer(t)
	c := ts.dial(t, "alice")
	for _, q := range []string{
		`{"type":"query","id":"q","user_ids":["a\ud800b"]}`,
		`{"type":"query","id":"q","user_ids":["ok","\udc00"]}`,
		`{"type":"query","id":"q","user_ids":["\ud83d"]}`, // the first half of a pair alone
	} {
		c.send(q)
		f := c.next("error")
		if f["code"] != "bad_request" || f["message"] != "query: every user id must be 1-128 bytes of printable UTF-8" {
			t.Errorf("%s: %v, want bad_request", q, f)
		}
	}
	// A real U+FFFD, escaped or not, and a surrogate pair are ids like others.
	c.send(`{"type":"query","id":"ok","user_ids":["a\ufffdb","a` + "\uFFFD" + `b","\ud83d\ude00"]}`)
	f := c.next("query_result")
	users, _ := f["users"].([]any)
	if f["id"] != "ok" || len(users) != 3 {
		t.Fatalf("valid ids: %v", f)
	}
	if u, _ := users[2].(map[string]any); u["user_id"] != "\U0001F600" {
		t.Errorf("the surrogate pair: %v, want U+1F600", u)
	}
}
