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
