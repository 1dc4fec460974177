package server_test

import (
	"io"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/server"
)

// With JWTAudience and JWTIssuer set, a token must carry both, matching;
// each refusal is a 401 that says which claim is wrong.
func TestJWTAudienceAndIssuer(t *testing.T) {
	ts := startServer(t, func(c *server.Config) {
		c.JWTSecret = secret
		c.JWTAudience = "greendot"
		c.JWTIssuer = "https://auth.example.com"
	})
	iss := "https://auth.example.com"
	for _, tc := range []struct {
		name   string
		claims jwt.MapClaims
		want   string // "" = accepted
	}{
		{"aud string", jwt.MapClaims{"sub": "a1", "aud": "greendot", "iss": iss}, ""},
		{"aud array", jwt.MapClaims{"sub": "a2", "aud": []string{"other", "greendot"}, "iss": iss}, ""},
		{"no aud", jwt.MapClaims{"sub": "a3", "iss": iss}, `token has no \"aud\" claim; it must include \"greendot\"`},
		{"wrong aud", jwt.MapClaims{"sub": "a4", "aud": "other", "iss": iss}, `token \"aud\" does not include \"greendot\"`},
		{"wrong aud array", jwt.MapClaims{"sub": "a5", "aud": []string{"x", "y"}, "iss": iss}, `token \"aud\" does not include \"greendot\"`},
		{"no iss", jwt.MapClaims{"sub": "a6", "aud": "greendot"}, `token has no \"iss\" claim; it must be \"https://auth.example.com\"`},
		{"wrong iss", jwt.MapClaims{"sub": "a7", "aud": "greendot", "iss": "https://evil.example.com"}, `token \"iss\" is not \"https://auth.example.com\"`},
	} {
		c, resp, err := ts.dialRaw(t, "token="+sign(t, tc.claims, jwt.SigningMethodHS256, []byte(secret)))
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v, want accepted", tc.name, err)
				continue
			}
			if w := c.next("welcome"); w["user_id"] != tc.claims["sub"] {
				t.Errorf("%s: welcome %v", tc.name, w)
			}
			continue
		}
		if err == nil || resp == nil {
			t.Errorf("%s: accepted, want 401", tc.name)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 401 || !strings.Contains(string(body), `"code":"unauthorized"`) || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s: %d %s, want 401 with %s", tc.name, resp.StatusCode, body, tc.want)
		}
	}
}

// Unset, neither claim is checked.
func TestJWTAudienceAndIssuerUnchecked(t *testing.T) {
	ts := startServer(t, func(c *server.Config) { c.JWTSecret = secret })
	c, _, err := ts.dialRaw(t, "token="+sign(t, jwt.MapClaims{"sub": "alice", "aud": "anything", "iss": "anyone"}, jwt.SigningMethodHS256, []byte(secret)))
	if err != nil {
		t.Fatal(err)
	}
	c.next("welcome")
}
