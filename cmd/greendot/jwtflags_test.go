package main

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/internal/nodetest"
	"github.com/greendot/greendot/internal/testwait"
)

// startupLog starts a node with flags and returns its log once the last
// start-up line (the open API warning) is out.
func startupLog(t *testing.T, flags ...string) (*nodetest.Node, string) {
	t.Helper()
	t.Setenv("GREENDOT_TEST_MAIN", "1")
	node := nodetest.Start(t, os.Args[0], "jwt", flags...)
	testwait.For(t, 10*time.Second, func() error {
		if !strings.Contains(node.Log.String(), "no --api-key set") {
			return errors.New("start-up not logged yet")
		}
		return nil
	})
	return node, node.Log.String()
}

func TestShortJWTSecretIsWarnedAbout(t *testing.T) {
	_, log := startupLog(t, "--jwt-secret", "abc")
	if n := strings.Count(log, "--jwt-secret is short"); n != 1 || !strings.Contains(log, "bytes=3") {
		t.Errorf("%d warnings, want one line with bytes=3:\n%s", n, log)
	}
	_, log = startupLog(t, "--jwt-secret", strings.Repeat("k", 32))
	if strings.Contains(log, "--jwt-secret is short") {
		t.Errorf("a 32-byte secret was warned about:\n%s", log)
	}
}

func TestJWTAudienceAndIssuerFlags(t *testing.T) {
	secret := strings.Repeat("s", 32)
	node, _ := startupLog(t, "--jwt-secret", secret, "--jwt-audience", "greendot", "--jwt-issuer", "auth")
	dial := func(claims jwt.MapClaims) (int, string) {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(secret))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, resp, err := websocket.Dial(ctx, "ws://"+node.Addr+"/v1/connect?token="+tok, nil)
		if err == nil {
			_ = conn.CloseNow()
			return 101, ""
		}
		if resp == nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := dial(jwt.MapClaims{"sub": "alice", "aud": []string{"greendot"}, "iss": "auth"}); code != 101 {
		t.Errorf("matching token: %d %s", code, body)
	}
	if code, body := dial(jwt.MapClaims{"sub": "alice", "iss": "auth"}); code != 401 || !strings.Contains(body, `no \"aud\" claim`) {
		t.Errorf("token without aud: %d %s, want 401 naming aud", code, body)
	}
	if code, body := dial(jwt.MapClaims{"sub": "alice", "aud": "greendot", "iss": "other"}); code != 401 || !strings.Contains(body, `\"iss\" is not \"auth\"`) {
		t.Errorf("token of another issuer: %d %s, want 401 naming iss", code, body)
	}
}

func TestJWTClaimFlagsNeedASecret(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--jwt-audience", "greendot"},
		{"serve", "--jwt-issuer", "auth"},
	} {
		r := runGreendot(t, nil, args...)
		want := "greendot: --jwt-audience and --jwt-issuer check tokens: they need --jwt-secret\n"
		if r.code != 1 || r.stderr != want {
			t.Errorf("%q: exit %d, stderr %q, want exit 1 and %q", args, r.code, r.stderr, want)
		}
	}
}
