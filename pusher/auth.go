package pusher

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// MaxUserInfo is the largest user_info, in bytes of compact JSON, that a
// presence member or a signed-in user may carry. Every member's info goes to
// every other member, so it is kept small.
const MaxUserInfo = 1024

// MaxWatchlist is the most user ids a pusher:signin user_data may watch.
const MaxWatchlist = 100

// SignChannel returns the hex HMAC-SHA256, keyed by secret, of
// socketID:channel, or socketID:channel:channelData when channelData is not
// empty (presence channels). The auth string a client sends is key:signature.
func SignChannel(secret, socketID, channel, channelData string) string {
	return hex.EncodeToString(channelMAC(secret, socketID, channel, channelData))
}

func channelMAC(secret, socketID, channel, channelData string) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(socketID))
	m.Write([]byte{':'})
	m.Write([]byte(channel))
	if channelData != "" {
		m.Write([]byte{':'})
		m.Write([]byte(channelData))
	}
	return m.Sum(nil)
}

// CheckChannelAuth reports whether auth is "key:signature" with the signature
// SignChannel gives, compared in constant time. A socket id or channel that is
// not valid never checks: a colon in either could make one signed string
// stand for another socket or channel.
func CheckChannelAuth(key, secret, socketID, channel, channelData, auth string) bool {
	if !ValidSocketID(socketID) || !ValidChannel(channel) {
		return false
	}
	return checkAuth(key, auth, channelMAC(secret, socketID, channel, channelData))
}

// SignUser returns the hex HMAC-SHA256, keyed by secret, of
// socketID::user::userData, the signature of a pusher:signin.
func SignUser(secret, socketID, userData string) string {
	return hex.EncodeToString(userMAC(secret, socketID, userData))
}

func userMAC(secret, socketID, userData string) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(socketID))
	m.Write([]byte("::user::"))
	m.Write([]byte(userData))
	return m.Sum(nil)
}

// CheckUserAuth reports whether auth is "key:signature" with the signature
// SignUser gives, compared in constant time.
func CheckUserAuth(key, secret, socketID, userData, auth string) bool {
	if !ValidSocketID(socketID) {
		return false
	}
	return checkAuth(key, auth, userMAC(secret, socketID, userData))
}

func checkAuth(key, auth string, want []byte) bool {
	gotKey, sig, ok := strings.Cut(auth, ":")
	if !ok || gotKey != key || len(sig) != 2*sha256.Size {
		return false
	}
	got, err := hex.DecodeString(sig)
	return err == nil && hmac.Equal(got, want)
}

// ChannelData is the channel_data of a presence subscription.
type ChannelData struct {
	UserID   string          // a JSON number is kept as its decimal digits
	UserInfo json.RawMessage // compact JSON; nil when absent or null
}

// ParseChannelData reads a presence subscription's channel_data:
// {"user_id": string or integer, "user_info": any JSON (optional)}.
// Laravel sends integer ids; they become their decimal string, as pusher-js
// shows them.
func ParseChannelData(s string) (ChannelData, error) {
	var raw map[string]json.RawMessage // keys match exactly, unlike a struct's
	if err := decodeObject([]byte(s), &raw); err != nil {
		return ChannelData{}, fmt.Errorf("%w: %v", ErrBadChannelData, err)
	}
	id, err := userID(raw["user_id"], true)
	if err != nil {
		return ChannelData{}, fmt.Errorf("%w: user_id %v", ErrBadChannelData, err)
	}
	info, err := userInfo(raw["user_info"])
	if err != nil {
		return ChannelData{}, fmt.Errorf("%w: %v", ErrBadChannelData, err)
	}
	return ChannelData{UserID: id, UserInfo: info}, nil
}

// UserData is the user_data of a pusher:signin.
type UserData struct {
	ID        string
	UserInfo  json.RawMessage // compact JSON; nil when absent or null
	Watchlist []string        // nil when absent
}

// ParseUserData reads a pusher:signin's user_data: {"id": non-empty string,
// "user_info": any JSON (optional), "watchlist": [user ids] (optional, at most
// MaxWatchlist)}.
func ParseUserData(s string) (UserData, error) {
	var raw map[string]json.RawMessage
	if err := decodeObject([]byte(s), &raw); err != nil {
		return UserData{}, fmt.Errorf("%w: %v", ErrBadUserData, err)
	}
	id, err := userID(raw["id"], false)
	if err != nil {
		return UserData{}, fmt.Errorf("%w: id %v", ErrBadUserData, err)
	}
	info, err := userInfo(raw["user_info"])
	if err != nil {
		return UserData{}, fmt.Errorf("%w: %v", ErrBadUserData, err)
	}
	var watch []string
	if wl := raw["watchlist"]; len(wl) > 0 && string(wl) != "null" {
		if err := json.Unmarshal(wl, &watch); err != nil {
			return UserData{}, fmt.Errorf("%w: watchlist must be an array of strings", ErrBadUserData)
		}
		if len(watch) > MaxWatchlist {
			return UserData{}, fmt.Errorf("%w: watchlist has %d ids, more than %d", ErrBadUserData, len(watch), MaxWatchlist)
		}
		for _, w := range watch {
			if w == "" {
				return UserData{}, fmt.Errorf("%w: watchlist has an empty id", ErrBadUserData)
			}
		}
	}
	return UserData{ID: id, UserInfo: info, Watchlist: watch}, nil
}

// decodeObject unmarshals b, which must be a JSON object, into v.
func decodeObject(b []byte, v any) error {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 || b[0] != '{' {
		return fmt.Errorf("not a JSON object")
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("not valid JSON: %v", err)
	}
	return nil
}

// userID reads a non-empty string id or, when numbers are allowed, an
// integer literal kept as written.
func userID(raw json.RawMessage, numbers bool) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", fmt.Errorf("is missing")
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("is not a valid string")
		}
		if s == "" {
			return "", fmt.Errorf("is empty")
		}
		return s, nil
	}
	if numbers && integerLiteral(string(raw)) {
		return string(raw), nil
	}
	if numbers {
		return "", fmt.Errorf("must be a string or an integer")
	}
	return "", fmt.Errorf("must be a string")
}

// integerLiteral reports whether s is a JSON integer: no fraction, no exponent.
func integerLiteral(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" || (s[0] == '0' && len(s) > 1) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func userInfo(raw json.RawMessage) (json.RawMessage, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, fmt.Errorf("user_info is not valid JSON")
	}
	if buf.Len() > MaxUserInfo {
		return nil, fmt.Errorf("user_info is %d bytes, more than %d", buf.Len(), MaxUserInfo)
	}
	return json.RawMessage(buf.Bytes()), nil
}

// NewSocketID returns a random socket id in Pusher's form, two decimal
// numbers joined by a dot. It is unguessable, so one client cannot ask an
// auth endpoint to sign for another's socket.
func NewSocketID() string {
	var b [16]byte
	rand.Read(b[:]) // never fails: crypto/rand crashes the program rather than return an error
	return strconv.FormatUint(binary.BigEndian.Uint64(b[:8]), 10) + "." +
		strconv.FormatUint(binary.BigEndian.Uint64(b[8:]), 10)
}

// ValidSocketID reports whether s looks like a Pusher socket id: 1 to 20
// digits, a dot, 1 to 20 digits. The SDKs check the same before they sign.
func ValidSocketID(s string) bool {
	a, b, ok := strings.Cut(s, ".")
	return ok && digits(a) && digits(b)
}

func digits(s string) bool {
	if len(s) == 0 || len(s) > 20 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
