package server

import (
	"net/http/httptest"
	"testing"
	"time"
	"unsafe"
)

// within reports whether s's bytes lie inside of's.
func within(s, of string) bool {
	if len(s) == 0 || len(of) == 0 {
		return false
	}
	p, start := uintptr(unsafe.Pointer(unsafe.StringData(s))), uintptr(unsafe.Pointer(unsafe.StringData(of)))
	return p >= start && p < start+uintptr(len(of))
}

// TestConnectKeepsNoPieceOfTheURI: the ids a connection keeps for its
// lifetime are copies. A substring of the query would keep the whole
// request URI in memory (the token with it, when there is one): ~100 bytes
// per idle connection in dev mode, a few hundred with a JWT.
func TestConnectKeepsNoPieceOfTheURI(t *testing.T) {
	r := httptest.NewRequest("GET", "/v1/connect?user=alice&device=phone&token=", nil)
	raw := r.URL.RawQuery
	if !within(r.URL.Query().Get("user"), raw) {
		t.Fatal("the query's values are not substrings of the URI here: this test checks nothing")
	}
	r = httptest.NewRequest("GET", "/v1/connect?user=alice&device=phone", nil)
	raw = r.URL.RawQuery
	id, err := newAuthenticator("", "", "", time.Now).authenticate(r)
	if err != nil || id.userID != "alice" {
		t.Fatalf("authenticate = %+v, %v", id, err)
	}
	if within(id.userID, raw) {
		t.Error("the user id is a substring of the request URI")
	}
	device, ok := deviceOf(r)
	if !ok || device != "phone" {
		t.Fatalf("deviceOf = %q, %v", device, ok)
	}
	if within(device, raw) {
		t.Error("the device is a substring of the request URI")
	}
	if d, ok := deviceOf(httptest.NewRequest("GET", "/v1/connect?user=alice", nil)); !ok || d != "web" {
		t.Errorf("no device: %q, %v; want web", d, ok)
	}
	if _, ok := deviceOf(httptest.NewRequest("GET", "/v1/connect?user=alice&device=", nil)); ok {
		t.Error("an empty device was accepted")
	}
}
