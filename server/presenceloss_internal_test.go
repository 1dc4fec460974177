package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/greendot/greendot/presence"
)

// A presence query just after Redis lost its data, before any sweep has
// found the loss: the store answers "offline, never seen" for a user whose
// device is live and about to be written back. The answer must be refused
// (503, retry), not given: a backend that trusts it acts on a false offline.
func TestPresenceReadDuringALossIsRefused(t *testing.T) {
	for _, topo := range []string{"redis", "cluster"} {
		t.Run(topo, func(t *testing.T) {
			ctx := context.Background()
			s, rs, flush := lossServer(t, topo)
			if err := rs.AddMember(ctx, "t", "bob"); err != nil {
				t.Fatal(err)
			}
			if err := rs.Connect(ctx, presence.Conn{ID: "cb", UserID: "bob", Device: "web"}); err != nil {
				t.Fatal(err)
			}
			mux := http.NewServeMux()
			mux.HandleFunc("GET /v1/users/{user}/presence", s.api(s.handleUserPresence))
			mux.HandleFunc("GET /v1/teams/{team}/presence", s.api(s.handleTeamPresence))
			get := func(path string) (int, string, string) {
				w := httptest.NewRecorder()
				mux.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
				return w.Code, w.Header().Get("Retry-After"), w.Body.String()
			}
			if code, _, body := get("/v1/users/bob/presence"); code != http.StatusOK {
				t.Fatalf("before the loss: %d %s", code, body)
			} else {
				var p struct{ State string }
				if err := json.Unmarshal([]byte(body), &p); err != nil || p.State != "online" {
					t.Fatalf("before the loss: %s (%v), want bob online", body, err)
				}
			}

			flush()
			for _, path := range []string{"/v1/users/bob/presence", "/v1/teams/t/presence"} {
				code, retry, body := get(path)
				if code != http.StatusServiceUnavailable || retry == "" {
					t.Errorf("GET %s just after the loss: %d (Retry-After %q) %s; want 503 with Retry-After: bob is live", path, code, retry, body)
				}
			}
		})
	}
}
