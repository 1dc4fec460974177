package pusher

import (
	"crypto/hmac"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// MaxTimestampSkew is how far auth_timestamp may be from the server's clock.
const MaxTimestampSkew = 600 * time.Second

// AuthVersion is the only auth_version the REST API knows.
const AuthVersion = "1.0"

// RESTError is a failed REST API request check. Message is safe to send back.
type RESTError struct {
	Status  int // HTTP status
	Message string
}

func (e *RESTError) Error() string { return "pusher: " + e.Message }

func unauthorized(format string, args ...any) error {
	return &RESTError{Status: 401, Message: fmt.Sprintf(format, args...)}
}

// one returns the single value of key in q; ok is false when it is missing
// or repeated.
func one(q url.Values, key string) (v string, ok bool) {
	vs := q[key]
	if len(vs) != 1 {
		return "", false
	}
	return vs[0], true
}

// VerifyRequest checks a REST API request signed as the official server SDKs
// sign it: auth_key is key, auth_version is 1.0, auth_timestamp is within
// MaxTimestampSkew of now, body_md5 is the hex MD5 of a non-empty body, and
// auth_signature is the hex HMAC-SHA256, keyed by secret, of
// METHOD\npath\nquery, query being every other parameter, keys lowercased,
// sorted and joined k=v by "&" with the values as decoded, not escaped again.
// path is the request's decoded path. A failure is a *RESTError with status
// 401 that says which check failed.
func VerifyRequest(key, secret, method, path string, query url.Values, body []byte, now time.Time) error {
	gotKey, ok := one(query, "auth_key")
	switch {
	case !ok:
		return unauthorized("auth_key must be given once")
	case gotKey != key:
		return unauthorized("unknown auth_key %q", gotKey)
	}
	sig, ok := one(query, "auth_signature")
	if !ok {
		return unauthorized("auth_signature must be given once")
	}
	if v, ok := one(query, "auth_version"); !ok || v != AuthVersion {
		return unauthorized("auth_version must be %s", AuthVersion)
	}
	tsText, ok := one(query, "auth_timestamp")
	if !ok {
		return unauthorized("auth_timestamp must be given once")
	}
	ts, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return unauthorized("auth_timestamp %q is not a number of seconds", tsText)
	}
	if d := now.Unix() - ts; d > int64(MaxTimestampSkew/time.Second) || -d > int64(MaxTimestampSkew/time.Second) {
		return unauthorized("auth_timestamp %d is more than %d s from the server's time %d", ts, int64(MaxTimestampSkew/time.Second), now.Unix())
	}
	md5s, hasMD5 := query["body_md5"]
	switch {
	case len(body) > 0 && !hasMD5:
		return unauthorized("body_md5 is required with a body")
	case hasMD5 && (len(md5s) != 1 || !strings.EqualFold(md5s[0], bodyMD5(body))):
		return unauthorized("body_md5 does not match the body")
	}
	toSign := stringToSign(method, path, query)
	want := restMAC(secret, toSign)
	got, err := hex.DecodeString(sig)
	if err != nil || !hmac.Equal(got, want) {
		// Like Pusher, say what was expected to be signed: it is the request's
		// own content, and it is what an SDK author needs to see.
		return unauthorized("invalid auth_signature: expected the HMAC-SHA256 hex digest of %q", toSign)
	}
	return nil
}

// SignRequest returns a copy of query with auth_key, auth_timestamp,
// auth_version, body_md5 (when body is not empty) and auth_signature set, as
// the official SDKs send them.
func SignRequest(key, secret, method, path string, query url.Values, body []byte, now time.Time) url.Values {
	q := make(url.Values, len(query)+5)
	for k, vs := range query {
		q[k] = append([]string(nil), vs...)
	}
	delete(q, "auth_signature")
	delete(q, "body_md5")
	q.Set("auth_key", key)
	q.Set("auth_timestamp", strconv.FormatInt(now.Unix(), 10))
	q.Set("auth_version", AuthVersion)
	if len(body) > 0 {
		q.Set("body_md5", bodyMD5(body))
	}
	q.Set("auth_signature", hex.EncodeToString(restMAC(secret, stringToSign(method, path, q))))
	return q
}

func bodyMD5(body []byte) string {
	sum := md5.Sum(body)
	return hex.EncodeToString(sum[:])
}

func restMAC(secret, toSign string) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(toSign))
	return m.Sum(nil)
}

// stringToSign is METHOD\npath\nquery. The SDKs build the query from values
// they do not escape, so the server joins the decoded values the same way.
// A key given more than once contributes each value in the order received;
// keys that lowercase alike are ordered by their original spelling, so the
// result never depends on map order.
func stringToSign(method, path string, query url.Values) string {
	keys := make([]string, 0, len(query))
	for k := range query {
		if k != "auth_signature" {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		li, lj := strings.ToLower(keys[i]), strings.ToLower(keys[j])
		if li != lj {
			return li < lj
		}
		return keys[i] < keys[j]
	})
	var b strings.Builder
	b.WriteString(strings.ToUpper(method))
	b.WriteByte('\n')
	b.WriteString(path)
	b.WriteByte('\n')
	first := true
	for _, k := range keys {
		lk := strings.ToLower(k)
		for _, v := range query[k] {
			if !first {
				b.WriteByte('&')
			}
			first = false
			b.WriteString(lk)
			b.WriteByte('=')
			b.WriteString(v)
		}
	}
	return b.String()
}

// SignWebhook returns the X-Pusher-Signature of a webhook body: the hex
// HMAC-SHA256 of the body keyed by secret.
func SignWebhook(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}
