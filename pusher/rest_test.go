package pusher

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"
)

// The docs' worked example (library_auth_reference/rest-api): POST
// /apps/3/events at auth_timestamp 1353088179.
const (
	docBody      = `{"name":"foo","channels":["project-3"],"data":"{\"some\":\"data\"}"}`
	docBodyMD5   = "ec365a775a4cd0599faeb73354201b6f"
	docSignature = "da454824c97ba181a32ccc17a72625ba02771f50b50e1e7430e47a1f3f457e6c"
)

var docNow = time.Unix(1353088179, 0)

func TestRESTDocExample(t *testing.T) {
	q := SignRequest(docKey, docSecret, "POST", "/apps/3/events", nil, []byte(docBody), docNow)
	if got := q.Get("body_md5"); got != docBodyMD5 {
		t.Errorf("body_md5 = %s, want %s", got, docBodyMD5)
	}
	if got := q.Get("auth_signature"); got != docSignature {
		t.Errorf("auth_signature = %s, want %s", got, docSignature)
	}
	want := "POST\n/apps/3/events\nauth_key=278d425bdf160c739803&auth_timestamp=1353088179&auth_version=1.0&body_md5=ec365a775a4cd0599faeb73354201b6f"
	if got := stringToSign("post", "/apps/3/events", q); got != want {
		t.Errorf("string to sign\n got %q\nwant %q", got, want)
	}
	if err := VerifyRequest(docKey, docSecret, "POST", "/apps/3/events", q, []byte(docBody), docNow); err != nil {
		t.Error(err)
	}
}

// Requests the official Node SDK, pusher@5.3.4, sent to a local HTTP server,
// with Date.now fixed at 1353088179000, appId "3" and the docs' key and
// secret (node vectors.js in a scratch directory after npm install pusher@5):
//
//	p.trigger("project-3", "foo", {some: "data"})
//	p.trigger(["presence-eng"], "my-event", {n: 1}, {socket_id: "1234.1234", info: "user_count,subscription_count"})
//	p.triggerBatch([{channel: "presence-eng", name: "a", data: "x"}])
//	p.get({path: "/channels", params: {filter_by_prefix: "presence-", info: "user_count"}})
//	p.get({path: "/channels/presence-eng/users"})
//	p.get({path: "/channels", params: {info: "user count"}})
//	p.terminateUserConnections("12345")
//
// The SDK puts its values in the query unescaped and node-fetch escapes the
// space, so the last GET shows that the server must sign decoded values.
var sdkRequests = []struct {
	method, uri, body string
}{
	{"POST", "/apps/3/events?auth_key=278d425bdf160c739803&auth_timestamp=1353088179&auth_version=1.0&body_md5=45ff0dd3fcd388e766ebeec554920e41&auth_signature=3afbfced4119aeb18b1b441f623f438db238170e007bb8dda50203ad09031632",
		`{"name":"foo","data":"{\"some\":\"data\"}","channels":["project-3"]}`},
	{"POST", "/apps/3/events?auth_key=278d425bdf160c739803&auth_timestamp=1353088179&auth_version=1.0&body_md5=b955e746402f2eac38b80c62972e7b46&auth_signature=fa488cdaabe52d84e93412e8c68abcfd0e25ac730a07c38abed1757f441b0671",
		`{"name":"my-event","data":"{\"n\":1}","channels":["presence-eng"],"socket_id":"1234.1234","info":"user_count,subscription_count"}`},
	{"POST", "/apps/3/batch_events?auth_key=278d425bdf160c739803&auth_timestamp=1353088179&auth_version=1.0&body_md5=1e51e1b2dc9780b1f80cda8791deeb69&auth_signature=b26be49fb1dddde0939ab9843f47968a8a8c3b92eb9b4cb61733195650eca4a8",
		`{"batch":[{"channel":"presence-eng","name":"a","data":"x"}]}`},
	{"GET", "/apps/3/channels?auth_key=278d425bdf160c739803&auth_timestamp=1353088179&auth_version=1.0&filter_by_prefix=presence-&info=user_count&auth_signature=16819168891cb5dfd72b5c7a5d3d602605b26c6ba1930033b5e2eeeb65010291", ""},
	{"GET", "/apps/3/channels/presence-eng/users?auth_key=278d425bdf160c739803&auth_timestamp=1353088179&auth_version=1.0&auth_signature=0c78cbe70662f38317a514bc9cdbd9885ac02af68b4b4f3effee91ee5fd24699", ""},
	{"GET", "/apps/3/channels?auth_key=278d425bdf160c739803&auth_timestamp=1353088179&auth_version=1.0&info=user%20count&auth_signature=d35bdf5dbcac565e05bdff9a500d1c48bb41d1b3d84b6e432daa547f37d827da", ""},
	{"POST", "/apps/3/users/12345/terminate_connections?auth_key=278d425bdf160c739803&auth_timestamp=1353088179&auth_version=1.0&body_md5=99914b932bd37a50b983c5e7c90ae93b&auth_signature=01fa634edeb0cae84115307cad5c23f65a46cd286461b1c89637a3b5871a8f0e",
		`{}`},
}

func TestRESTSDKRequests(t *testing.T) {
	for _, r := range sdkRequests {
		t.Run(r.method+" "+r.uri[:strings.IndexByte(r.uri, '?')], func(t *testing.T) {
			u, err := url.ParseRequestURI(r.uri)
			if err != nil {
				t.Fatal(err)
			}
			q := u.Query()
			if err := VerifyRequest(docKey, docSecret, r.method, u.Path, q, []byte(r.body), docNow); err != nil {
				t.Fatal(err)
			}
			// SignRequest signs the same parameters to the same signature.
			params := url.Values{}
			for k, vs := range q {
				if !strings.HasPrefix(k, "auth_") && k != "body_md5" {
					params[k] = vs
				}
			}
			again := SignRequest(docKey, docSecret, r.method, u.Path, params, []byte(r.body), docNow)
			if again.Encode() != q.Encode() {
				t.Errorf("SignRequest\n got %s\nwant %s", again.Encode(), q.Encode())
			}
			// Through an encoded URL and back, as the bench and tests send it.
			back, err := url.ParseQuery(again.Encode())
			if err != nil {
				t.Fatal(err)
			}
			if err := VerifyRequest(docKey, docSecret, r.method, u.Path, back, []byte(r.body), docNow.Add(MaxTimestampSkew)); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestVerifyRequestRefuses(t *testing.T) {
	path := "/apps/3/events"
	body := []byte(docBody)
	signed := func(edit func(q url.Values)) url.Values {
		q := SignRequest(docKey, docSecret, "POST", path, url.Values{"info": {"user_count"}}, body, docNow)
		if edit != nil {
			edit(q)
		}
		return q
	}
	for _, tc := range []struct {
		name   string
		key    string
		method string
		path   string
		query  url.Values
		body   []byte
		now    time.Time
		says   string
	}{
		{name: "unknown key", key: "other", says: "unknown auth_key"},
		{name: "no key", query: signed(func(q url.Values) { q.Del("auth_key") }), says: "auth_key"},
		{name: "key twice", query: signed(func(q url.Values) { q.Add("auth_key", docKey) }), says: "auth_key"},
		{name: "no signature", query: signed(func(q url.Values) { q.Del("auth_signature") }), says: "auth_signature must be given"},
		{name: "signature twice", query: signed(func(q url.Values) { q.Add("auth_signature", q.Get("auth_signature")) }), says: "auth_signature must be given"},
		{name: "bad signature", query: signed(func(q url.Values) { q.Set("auth_signature", strings.Repeat("0", 64)) }), says: "invalid auth_signature"},
		{name: "signature not hex", query: signed(func(q url.Values) { q.Set("auth_signature", "xyz") }), says: "invalid auth_signature"},
		{name: "other secret", query: SignRequest(docKey, "x", "POST", path, nil, body, docNow), says: "invalid auth_signature"},
		{name: "other method", method: "PUT", says: "invalid auth_signature"},
		{name: "other path", path: "/apps/4/events", says: "invalid auth_signature"},
		{name: "added parameter", query: signed(func(q url.Values) { q.Set("socket_id", "1.1") }), says: "invalid auth_signature"},
		{name: "changed parameter", query: signed(func(q url.Values) { q.Set("info", "subscription_count") }), says: "invalid auth_signature"},
		{name: "no version", query: signed(func(q url.Values) { q.Del("auth_version") }), says: "auth_version must be 1.0"},
		{name: "other version", query: signed(func(q url.Values) { q.Set("auth_version", "2.0") }), says: "auth_version must be 1.0"},
		{name: "no timestamp", query: signed(func(q url.Values) { q.Del("auth_timestamp") }), says: "auth_timestamp must be given"},
		{name: "timestamp not a number", query: signed(func(q url.Values) { q.Set("auth_timestamp", "soon") }), says: "not a number"},
		{name: "timestamp 601 s old", now: docNow.Add(MaxTimestampSkew + time.Second), says: "more than 600 s"},
		{name: "timestamp 601 s ahead", now: docNow.Add(-MaxTimestampSkew - time.Second), says: "more than 600 s"},
		{name: "body changed", body: []byte(docBody + " "), says: "body_md5 does not match"},
		{name: "body without md5", query: signed(func(q url.Values) { q.Del("body_md5") }), says: "body_md5 is required"},
		{name: "md5 without body", body: []byte{}, says: "body_md5 does not match"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, method, p, q, b, now := docKey, "POST", path, tc.query, body, docNow
			if tc.key != "" {
				key = tc.key
			}
			if tc.method != "" {
				method = tc.method
			}
			if tc.path != "" {
				p = tc.path
			}
			if q == nil {
				q = signed(nil)
			}
			if tc.body != nil {
				b = tc.body
			}
			if !tc.now.IsZero() {
				now = tc.now
			}
			err := VerifyRequest(key, docSecret, method, p, q, b, now)
			var re *RESTError
			if !errors.As(err, &re) || re.Status != 401 || !strings.Contains(re.Message, tc.says) {
				t.Fatalf("err %v, want a 401 saying %q", err, tc.says)
			}
		})
	}
	// The edges of the window pass.
	for _, now := range []time.Time{docNow.Add(MaxTimestampSkew), docNow.Add(-MaxTimestampSkew)} {
		if err := VerifyRequest(docKey, docSecret, "POST", path, signed(nil), body, now); err != nil {
			t.Errorf("at %v: %v", now.Sub(docNow), err)
		}
	}
	// A GET has no body and needs no body_md5.
	q := SignRequest(docKey, docSecret, "GET", "/apps/3/channels", nil, nil, docNow)
	if q.Has("body_md5") {
		t.Error("body_md5 for an empty body")
	}
	if err := VerifyRequest(docKey, docSecret, "GET", "/apps/3/channels", q, nil, docNow); err != nil {
		t.Error(err)
	}
}

func TestStringToSign(t *testing.T) {
	for _, tc := range []struct {
		name  string
		query url.Values
		want  string
	}{
		// The docs' own example of lowercasing without escaping.
		{"docs", url.Values{"auth_key": {"foo"}, "Name": {"Something else"}}, "auth_key=foo&name=Something else"},
		{"signature left out", url.Values{"b": {"2"}, "auth_signature": {"s"}, "a": {"1"}}, "a=1&b=2"},
		{"repeated key in order", url.Values{"channels[]": {"b", "a"}, "auth_key": {"k"}}, "auth_key=k&channels[]=b&channels[]=a"},
		{"keys alike once lowered", url.Values{"info": {"2"}, "Info": {"1"}}, "info=1&info=2"},
		{"empty value", url.Values{"x": {""}}, "x="},
		{"none", url.Values{}, ""},
	} {
		if got := stringToSign("get", "/p", tc.query); got != "GET\n/p\n"+tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, "GET\n/p\n"+tc.want)
		}
	}
}

func TestSignRequestCopies(t *testing.T) {
	in := url.Values{"info": {"user_count"}, "auth_signature": {"stale"}}
	out := SignRequest(docKey, docSecret, "GET", "/apps/3/channels", in, nil, docNow)
	if len(in) != 2 || in.Get("auth_signature") != "stale" {
		t.Errorf("input changed: %v", in)
	}
	if out.Get("auth_signature") == "stale" || out.Get("info") != "user_count" {
		t.Errorf("output %v", out)
	}
}

func TestSignWebhook(t *testing.T) {
	// The Node SDK's webhook({headers: {"x-pusher-signature": want, ...}, rawBody}).isValid()
	// is true for it; openssl: printf '%s' '{"time_ms":1,"events":[]}' | openssl dgst -sha256 -hmac 7ad3773142a6692b25b8
	const want = "e84ad185684cff3a96d27bc8ba07b8be14b7479c43784ab14d8a256d25638f76"
	if got := SignWebhook(docSecret, []byte(`{"time_ms":1,"events":[]}`)); got != want {
		t.Errorf("SignWebhook = %s, want %s", got, want)
	}
}
