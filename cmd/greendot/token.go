package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/protocol"
)

// token prints an HS256 client token, for trying auth mode by hand.
func token(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	secret := fs.String("secret", "", "HS256 secret (the server's --jwt-secret); or GREENDOT_JWT_SECRET")
	user := fs.String("user", "", "user id, the token's sub claim")
	var ttl time.Duration
	durationVar(fs, &ttl, "ttl", time.Hour, "the `duration` the token is valid for; 0 for no exp claim")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *secret == "" {
		*secret = os.Getenv("GREENDOT_JWT_SECRET")
	}
	if *secret == "" {
		return errors.New("token: --secret is required")
	}
	if !protocol.ValidID(*user) {
		return errors.New("token: --user must be 1-128 bytes of printable UTF-8")
	}
	now := time.Now()
	claims := jwt.RegisteredClaims{Subject: *user, IssuedAt: jwt.NewNumericDate(now)}
	if ttl > 0 {
		claims.ExpiresAt = jwt.NewNumericDate(now.Add(ttl))
	}
	signed, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(*secret))
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	_, err = fmt.Fprintln(stdout, signed)
	return err
}

func randomSuffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
