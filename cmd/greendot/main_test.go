package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func TestFlagsReadEnvironmentAndFlagsWin(t *testing.T) {
	env := map[string]string{
		"GREENDOT_TTL":                "40s",
		"GREENDOT_HEARTBEAT_INTERVAL": "15s",
		"GREENDOT_ADDR":               ":9999",
		"GREENDOT_JWT_SECRET":         "s3",
		"GREENDOT_FORGET_AFTER":       "48h",
	}
	var o serveOptions
	fs := serveFlags(&o)
	if err := parseWithEnv(fs, []string{"--addr", ":7000"}, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if o.addr != ":7000" || o.ttl != 40*time.Second || o.heartbeatInterval != 15*time.Second || o.jwtSecret != "s3" ||
		o.forgetAfter != 48*time.Hour {
		t.Fatalf("options = %+v", o)
	}
	if o.grace != 5*time.Second || o.storeKind != "memory" || o.maxConnecting != 64 {
		t.Fatalf("defaults lost: %+v", o)
	}
	o = serveOptions{}
	if err := parseWithEnv(serveFlags(&o), nil, func(string) string { return "" }); err != nil || o.forgetAfter != 720*time.Hour {
		t.Fatalf("--forget-after default = %v (%v), want 720h", o.forgetAfter, err)
	}
}

func TestBadEnvironmentValueIsAnError(t *testing.T) {
	var o serveOptions
	err := parseWithEnv(serveFlags(&o), nil, func(k string) string {
		if k == "GREENDOT_TTL" {
			return "soon"
		}
		return ""
	})
	if err == nil || !strings.Contains(err.Error(), "GREENDOT_TTL") {
		t.Fatalf("err = %v", err)
	}
}

func TestNonsenseRefusesToStart(t *testing.T) {
	for _, args := range [][]string{
		{"--ttl", "10s", "--heartbeat-interval", "10s"},
		{"--ttl", "5s"},
		{"--offline-grace", "-1s"},
		{"--forget-after", "-1h"},
		{"--forget-after", "1s"}, // shorter than the 5s grace
		{"--store", "etcd"},
		{"--store", "redis"},
		{"--store", "redis", "--redis-url", "redis://127.0.0.1:1"},
		{"--store", "redis", "--redis-url", "http://nope"},
		{"--heartbeat-interval", "0s"},
		{"--max-connecting", "0"},
		{"stray"},
	} {
		var out bytes.Buffer
		err := serve(context.Background(), args, &out)
		if err == nil {
			t.Errorf("%v started", args)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: reason is not one line: %q", args, err)
		}
	}
}

func TestTokenCommand(t *testing.T) {
	var out bytes.Buffer
	if err := token([]string{"--secret", "k", "--user", "alice", "--ttl", "1m"}, &out); err != nil {
		t.Fatal(err)
	}
	claims := jwt.RegisteredClaims{}
	_, err := jwt.ParseWithClaims(strings.TrimSpace(out.String()), &claims, func(*jwt.Token) (any, error) { return []byte("k"), nil },
		jwt.WithValidMethods([]string{"HS256"}))
	if err != nil || claims.Subject != "alice" || claims.ExpiresAt == nil {
		t.Fatalf("token: %v %+v", err, claims)
	}
	if err := token([]string{"--user", "alice"}, &out); err == nil {
		t.Fatal("token without a secret succeeded")
	}
}
