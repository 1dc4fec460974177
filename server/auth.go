package server

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/protocol"
)

// identity is who a connecting client is.
type identity struct {
	userID string
	expiry time.Time // zero when the token has no exp (or in dev mode)
}

// authenticator checks client tokens (HS256 JWTs, sub = user id) or, in dev
// mode, accepts ?user=.
type authenticator struct {
	secret   []byte // nil: dev mode
	audience string // "" = not checked
	issuer   string // "" = not checked
	parser   *jwt.Parser
	now      func() time.Time
}

func newAuthenticator(secret, audience, issuer string, now func() time.Time) *authenticator {
	a := &authenticator{now: now, audience: audience, issuer: issuer}
	if secret != "" {
		a.secret = []byte(secret)
		opts := []jwt.ParserOption{
			jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
			jwt.WithTimeFunc(now),
			jwt.WithLeeway(0),
		}
		// The library requires the claim when asked to check it: a token
		// without "aud" or "iss" fails like one with the wrong value.
		if audience != "" {
			opts = append(opts, jwt.WithAudience(audience))
		}
		if issuer != "" {
			opts = append(opts, jwt.WithIssuer(issuer))
		}
		a.parser = jwt.NewParser(opts...)
	}
	return a
}

func (a *authenticator) devMode() bool { return a.secret == nil }

// authenticate returns the client's identity or an error whose message is
// safe to show the client (it never echoes the token).
func (a *authenticator) authenticate(r *http.Request) (identity, error) {
	q := r.URL.Query()
	token := q.Get("token")
	if token == "" {
		if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
			token = strings.TrimSpace(h[7:])
		}
	}
	_, hasUser := q["user"]
	if a.devMode() {
		if token != "" {
			return identity{}, errors.New("this server has no --jwt-secret to verify tokens; in dev mode connect with ?user=<id>")
		}
		user := q.Get("user")
		if !hasUser {
			return identity{}, errors.New("dev mode: connect with ?user=<id>")
		}
		if !protocol.ValidID(user) {
			return identity{}, errBadID("user")
		}
		// Copied: a substring of the query would keep the whole request
		// URI in memory for as long as the connection.
		return identity{userID: strings.Clone(user)}, nil
	}
	if hasUser {
		return identity{}, errors.New("?user= is not accepted: identify with a token")
	}
	if token == "" {
		return identity{}, errors.New("missing token: pass ?token= or Authorization: Bearer")
	}
	claims := jwt.RegisteredClaims{}
	_, err := a.parser.ParseWithClaims(token, &claims, func(*jwt.Token) (any, error) { return a.secret, nil })
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return identity{}, errors.New("token expired")
	// Claims are checked only once the signature is good, so saying which
	// one failed tells a forger nothing.
	case a.audience != "" && errors.Is(err, jwt.ErrTokenRequiredClaimMissing) && len(claims.Audience) == 0:
		return identity{}, fmt.Errorf(`token has no "aud" claim; it must include %q`, a.audience)
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return identity{}, fmt.Errorf(`token "aud" does not include %q`, a.audience)
	case a.issuer != "" && errors.Is(err, jwt.ErrTokenRequiredClaimMissing) && claims.Issuer == "":
		return identity{}, fmt.Errorf(`token has no "iss" claim; it must be %q`, a.issuer)
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return identity{}, fmt.Errorf(`token "iss" is not %q`, a.issuer)
	case err != nil:
		return identity{}, errors.New("invalid token")
	}
	if claims.Subject == "" {
		return identity{}, errors.New(`token has no "sub" claim`)
	}
	if !protocol.ValidID(claims.Subject) {
		return identity{}, errors.New(`token "sub" is not a valid user id`)
	}
	id := identity{userID: claims.Subject}
	if claims.ExpiresAt != nil {
		id.expiry = claims.ExpiresAt.Time
	}
	return id, nil
}

// badIDError marks an invalid id: a 400, not a 401.
type badIDError string

func errBadID(what string) error { return badIDError(what) }

func (e badIDError) Error() string {
	return string(e) + " id must be 1-128 bytes of printable UTF-8"
}

// apiKeyOK reports whether r carries the API key (or none is required).
func apiKeyOK(key string, r *http.Request) bool {
	if key == "" {
		return true
	}
	h := r.Header.Get("Authorization")
	if len(h) <= 7 || !strings.EqualFold(h[:7], "bearer ") {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(h[7:])), []byte(key)) == 1
}
