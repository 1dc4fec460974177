package pusher

import (
	"errors"
	"strings"
	"testing"
)

// Pusher's worked examples (library_auth_reference/auth-signatures).
const (
	docKey    = "278d425bdf160c739803"
	docSecret = "7ad3773142a6692b25b8"
	docSocket = "1234.1234"
)

// The signature vectors below are checked three ways: against Pusher's docs
// where the docs have them, against openssl
// (printf '%s' "$string" | openssl dgst -sha256 -hmac 7ad3773142a6692b25b8),
// and against the official Node SDK, pusher@5.3.4, whose output they are:
//
//	p := new Pusher({appId: "3", key: docKey, secret: docSecret, ...})
//	p.authorizeChannel("1234.1234", "private-foobar")
//	p.authorizeChannel("1234.1234", "presence-foobar", {user_id: 10, user_info: {name: "Mr. Channels"}})
//	p.authenticateUser("1234.1234", {id: "12345"})
//	p.authenticateUser("1234.1234", {id: "12345", user_info: {name: "Ann"}, watchlist: ["a", "b"]})
//
// run with `node vectors.js` in a scratch directory after `npm install pusher@5`.
var channelVectors = []struct {
	name, channel, channelData, auth string
}{
	{
		// docs and SDK
		"private", "private-foobar", "",
		"278d425bdf160c739803:58df8b0c36d6982b82c3ecf6b4662e34fe8c25bba48f5369f135bf843651c3a4",
	},
	{
		// SDK and openssl. The docs print this channel_data with afaed369…,
		// which is the signature of the "Mr. Pusher" data below: the example
		// was renamed without being signed again.
		"presence", "presence-foobar", `{"user_id":10,"user_info":{"name":"Mr. Channels"}}`,
		"278d425bdf160c739803:31935e7d86dba64c2a90aed31fdc61869f9b22ba9d8863bba239c03ca481bc80",
	},
	{
		// the docs' signature, over the data it was computed for
		"presence, older docs", "presence-foobar", `{"user_id":10,"user_info":{"name":"Mr. Pusher"}}`,
		"278d425bdf160c739803:afaed3695da2ffd16931f457e338e6c9f2921fa133ce7dac49f529792be6304c",
	},
}

func TestChannelAuthVectors(t *testing.T) {
	for _, v := range channelVectors {
		t.Run(v.name, func(t *testing.T) {
			if got := docKey + ":" + SignChannel(docSecret, docSocket, v.channel, v.channelData); got != v.auth {
				t.Errorf("SignChannel = %s, want %s", got, v.auth)
			}
			if !CheckChannelAuth(docKey, docSecret, docSocket, v.channel, v.channelData, v.auth) {
				t.Error("CheckChannelAuth refused the vector")
			}
		})
	}
}

func TestCheckChannelAuthRefuses(t *testing.T) {
	good := channelVectors[1]
	sig := strings.TrimPrefix(good.auth, docKey+":")
	for _, tc := range []struct {
		name                                   string
		key, secret, socket, channel, cd, auth string
	}{
		{"other key", "other", docSecret, docSocket, good.channel, good.channelData, good.auth},
		{"other secret", docKey, "x", docSocket, good.channel, good.channelData, good.auth},
		{"other socket", docKey, docSecret, "1234.1235", good.channel, good.channelData, good.auth},
		{"other channel", docKey, docSecret, docSocket, "presence-foobaz", good.channelData, good.auth},
		{"other channel_data", docKey, docSecret, docSocket, good.channel, `{"user_id":11}`, good.auth},
		{"no channel_data", docKey, docSecret, docSocket, good.channel, "", good.auth},
		{"no key", docKey, docSecret, docSocket, good.channel, good.channelData, sig},
		{"empty key", docKey, docSecret, docSocket, good.channel, good.channelData, ":" + sig},
		{"short signature", docKey, docSecret, docSocket, good.channel, good.channelData, good.auth[:len(good.auth)-2]},
		{"not hex", docKey, docSecret, docSocket, good.channel, good.channelData, docKey + ":" + strings.Repeat("zz", 32)},
		{"empty", docKey, docSecret, docSocket, good.channel, good.channelData, ""},
		// A socket id with a colon could carry another channel's signature.
		{"colon in socket id", docKey, docSecret, "1234.1234:private-foobar", "x", "", docKey + ":" + SignChannel(docSecret, "1234.1234:private-foobar", "x", "")},
		{"invalid channel", docKey, docSecret, docSocket, "private-a:b", "", docKey + ":" + SignChannel(docSecret, docSocket, "private-a:b", "")},
	} {
		if CheckChannelAuth(tc.key, tc.secret, tc.socket, tc.channel, tc.cd, tc.auth) {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	// Hex case does not matter to the comparison.
	if !CheckChannelAuth(docKey, docSecret, docSocket, good.channel, good.channelData, docKey+":"+strings.ToUpper(sig)) {
		t.Error("upper-case hex refused")
	}
}

var userVectors = []struct {
	name, userData, auth string
}{
	{
		// docs and SDK
		"id only", `{"id":"12345"}`,
		"278d425bdf160c739803:4708d583dada6a56435fb8bc611c77c359a31eebde13337c16ab43aa6de336ba",
	},
	{
		// SDK
		"info and watchlist", `{"id":"12345","user_info":{"name":"Ann"},"watchlist":["a","b"]}`,
		"278d425bdf160c739803:b72aa402fbdcaaa961bf8f912b3193d17abe090852057b45a55f40606ac6e550",
	},
}

func TestUserAuthVectors(t *testing.T) {
	for _, v := range userVectors {
		t.Run(v.name, func(t *testing.T) {
			if got := docKey + ":" + SignUser(docSecret, docSocket, v.userData); got != v.auth {
				t.Errorf("SignUser = %s, want %s", got, v.auth)
			}
			if !CheckUserAuth(docKey, docSecret, docSocket, v.userData, v.auth) {
				t.Error("CheckUserAuth refused the vector")
			}
			if CheckUserAuth(docKey, docSecret, "1234.1235", v.userData, v.auth) {
				t.Error("accepted for another socket")
			}
			if CheckUserAuth(docKey, docSecret, docSocket, v.userData+" ", v.auth) {
				t.Error("accepted for other user_data")
			}
		})
	}
	// The two signed strings can meet only through a channel named
	// ":user::x", which is not a valid name, so a signin signature never
	// passes as a subscription's.
	userSig := docKey + ":" + SignUser(docSecret, docSocket, "x")
	if CheckChannelAuth(docKey, docSecret, docSocket, ":user::x", "", userSig) {
		t.Error("a user signature passed as a channel signature")
	}
}

func TestParseChannelData(t *testing.T) {
	for _, tc := range []struct {
		in, id, info string
		bad          bool
	}{
		{in: `{"user_id":10,"user_info":{"name":"Mr. Channels"}}`, id: "10", info: `{"name":"Mr. Channels"}`},
		{in: `{"user_id":"u1"}`, id: "u1"},
		{in: `{"user_id":"u1","user_info":null}`, id: "u1"},
		{in: ` { "user_id" : "u1", "user_info" : { "a" : [ 1, 2 ] } } `, id: "u1", info: `{"a":[1,2]}`},
		{in: `{"user_id":"u1","user_info":"just a string"}`, id: "u1", info: `"just a string"`},
		{in: `{"user_id":-7}`, id: "-7"},
		{in: `{"user_id":0}`, id: "0"},
		{in: `{"user_id":12345678901234567890123}`, id: "12345678901234567890123"},
		{in: `{"user_id":"a<b&c"}`, id: "a<b&c"},
		{in: `{"user_id":"u","user_info":"` + strings.Repeat("x", MaxUserInfo-2) + `"}`, id: "u", info: `"` + strings.Repeat("x", MaxUserInfo-2) + `"`},
		{in: `{"user_id":"u","user_info":"` + strings.Repeat("x", MaxUserInfo-1) + `"}`, bad: true},
		{in: `{"user_id":1.5}`, bad: true},
		{in: `{"user_id":1e3}`, bad: true},
		{in: `{"user_id":01}`, bad: true},
		{in: `{"user_id":""}`, bad: true},
		{in: `{"user_id":null}`, bad: true},
		{in: `{"user_id":true}`, bad: true},
		{in: `{"user_id":["u"]}`, bad: true},
		{in: `{"user_info":{}}`, bad: true},
		{in: `{"USER_ID":"u"}`, bad: true}, // keys match exactly
		{in: `{}`, bad: true},
		{in: ``, bad: true},
		{in: `null`, bad: true},
		{in: `"{\"user_id\":\"u\"}"`, bad: true},
		{in: `[{"user_id":"u"}]`, bad: true},
		{in: `{"user_id":"u"`, bad: true},
	} {
		cd, err := ParseChannelData(tc.in)
		if tc.bad {
			if !errors.Is(err, ErrBadChannelData) {
				t.Errorf("%s: err %v, want ErrBadChannelData", tc.in, err)
			}
			continue
		}
		if err != nil || cd.UserID != tc.id || string(cd.UserInfo) != tc.info {
			t.Errorf("%s: %q %q %v; want %q %q", tc.in, cd.UserID, cd.UserInfo, err, tc.id, tc.info)
		}
		if tc.info == "" && cd.UserInfo != nil {
			t.Errorf("%s: UserInfo %q, want nil", tc.in, cd.UserInfo)
		}
	}
}

func TestParseUserData(t *testing.T) {
	ids := make([]string, MaxWatchlist+1)
	for i := range ids {
		ids[i] = `"u"`
	}
	for _, tc := range []struct {
		in, id, info string
		watch        []string
		bad          bool
	}{
		{in: `{"id":"12345"}`, id: "12345"},
		{in: `{"id":"12345","user_info":{"name":"Ann"},"watchlist":["a","b"]}`, id: "12345", info: `{"name":"Ann"}`, watch: []string{"a", "b"}},
		{in: `{"id":"1","watchlist":null}`, id: "1"},
		{in: `{"id":"1","watchlist":[]}`, id: "1", watch: []string{}},
		{in: `{"id":"1","watchlist":[` + strings.Join(ids[:MaxWatchlist], ",") + `]}`, id: "1", watch: strings.Split(strings.Repeat("u", MaxWatchlist), "")},
		{in: `{"id":"1","watchlist":[` + strings.Join(ids, ",") + `]}`, bad: true},
		{in: `{"id":"1","watchlist":[""]}`, bad: true},
		{in: `{"id":"1","watchlist":[1]}`, bad: true},
		{in: `{"id":"1","watchlist":"a"}`, bad: true},
		{in: `{"id":"1","user_info":"` + strings.Repeat("x", MaxUserInfo) + `"}`, bad: true},
		{in: `{"id":12345}`, bad: true}, // Pusher wants a string id here
		{in: `{"id":""}`, bad: true},
		{in: `{"user_id":"1"}`, bad: true},
		{in: `[]`, bad: true},
		{in: `nope`, bad: true},
	} {
		ud, err := ParseUserData(tc.in)
		if tc.bad {
			if !errors.Is(err, ErrBadUserData) {
				t.Errorf("%s: err %v, want ErrBadUserData", tc.in, err)
			}
			continue
		}
		if err != nil || ud.ID != tc.id || string(ud.UserInfo) != tc.info || strings.Join(ud.Watchlist, ",") != strings.Join(tc.watch, ",") || (tc.watch == nil) != (ud.Watchlist == nil) {
			t.Errorf("%s: %+v %v", tc.in, ud, err)
		}
	}
}

func TestSocketID(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id := NewSocketID()
		if !ValidSocketID(id) {
			t.Fatalf("NewSocketID() = %q, not valid", id)
		}
		if seen[id] {
			t.Fatalf("NewSocketID() repeated %q", id)
		}
		seen[id] = true
	}
	for _, tc := range []struct {
		s  string
		ok bool
	}{
		{"1234.1234", true},
		{"0.0", true},
		{strings.Repeat("9", 20) + "." + strings.Repeat("9", 20), true},
		{strings.Repeat("9", 21) + ".1", false},
		{"1." + strings.Repeat("9", 21), false},
		{"1234", false},
		{"1234.", false},
		{".1234", false},
		{"1.2.3", false},
		{"1234.1234:private-foobar", false},
		{"-1.2", false},
		{"1.2\n", false},
		{"١.٢", false}, // Arabic-Indic digits are not \d to the SDKs
		{"", false},
	} {
		if got := ValidSocketID(tc.s); got != tc.ok {
			t.Errorf("ValidSocketID(%q) = %v, want %v", tc.s, got, tc.ok)
		}
	}
}
