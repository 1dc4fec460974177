package pusher

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestFrame(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  []byte
		want string
	}{
		{
			"connection_established, as the protocol document shows it",
			Frame(EventConnectionEstablished, "", map[string]any{"socket_id": "123.456", "activity_timeout": 120}),
			`{"event":"pusher:connection_established","data":"{\"activity_timeout\":120,\"socket_id\":\"123.456\"}"}`,
		},
		{
			"a channel event",
			Frame(EventMemberRemoved, "presence-eng", map[string]string{"user_id": "u1"}),
			`{"event":"pusher_internal:member_removed","channel":"presence-eng","data":"{\"user_id\":\"u1\"}"}`,
		},
		{
			"no HTML escaping",
			Frame("e", "", map[string]string{"n": "<a&b>"}),
			`{"event":"e","data":"{\"n\":\"<a&b>\"}"}`,
		},
		{
			"a client event relayed as sent, with its sender",
			FrameRaw("client-typing", "presence-eng", json.RawMessage(`{"on":true}`), "u1"),
			`{"event":"client-typing","channel":"presence-eng","data":{"on":true},"user_id":"u1"}`,
		},
		{
			"a REST event's data string",
			FrameRaw("foo", "project-3", json.RawMessage(`"{\"some\":\"data\"}"`), ""),
			`{"event":"foo","channel":"project-3","data":"{\"some\":\"data\"}"}`,
		},
		{
			"pong without data",
			FrameRaw(EventPong, "", nil, ""),
			`{"event":"pusher:pong"}`,
		},
		{
			"error",
			ErrorFrame(CodeUnauthorized, "Connection is unauthorized"),
			`{"event":"pusher:error","data":{"code":4009,"message":"Connection is unauthorized"}}`,
		},
		{
			"error without a code",
			ErrorFrame(0, "unknown event"),
			`{"event":"pusher:error","data":{"code":null,"message":"unknown event"}}`,
		},
		{
			"subscription error",
			SubscriptionError("private-x", "AuthError", "Invalid signature", 401),
			`{"event":"pusher:subscription_error","channel":"private-x","data":{"type":"AuthError","error":"Invalid signature","status":401}}`,
		},
	} {
		if string(tc.got) != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, tc.got, tc.want)
		}
	}
}

func TestFramePanicsOnBadData(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	FrameRaw("e", "", json.RawMessage(`{`), "")
}

func TestPresenceData(t *testing.T) {
	got := Frame(EventSubscriptionSucceeded, "presence-eng", PresenceData([]Member{
		{ID: "b", Info: json.RawMessage(`{"name":"Bo"}`)},
		{ID: "a"},
		{ID: "b", Info: json.RawMessage(`{"name":"again"}`)},
	}))
	want := `{"event":"pusher_internal:subscription_succeeded","channel":"presence-eng","data":"{\"presence\":{\"ids\":[\"b\",\"a\"],\"hash\":{\"a\":{},\"b\":{\"name\":\"Bo\"}},\"count\":2}}"}`
	if string(got) != want {
		t.Errorf("\n got %s\nwant %s", got, want)
	}
	// What pusher-js reads after undoing the double encoding.
	var f struct{ Data string }
	var d struct {
		Presence struct {
			IDs   []string
			Hash  map[string]map[string]string
			Count int
		}
	}
	if err := json.Unmarshal(Frame("e", "", PresenceData(nil)), &f); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(f.Data), &d); err != nil || d.Presence.IDs == nil || d.Presence.Hash == nil || d.Presence.Count != 0 {
		t.Errorf("empty channel: %s %v", f.Data, err)
	}
}

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		in                   string
		event, channel, data string
		bad                  bool
	}{
		{in: `{"event":"pusher:ping","data":{}}`, event: "pusher:ping", data: `{}`},
		{in: `{"event":"pusher:subscribe","data":{"auth":"","channel":"orders"}}`, event: "pusher:subscribe", data: `{"auth":"","channel":"orders"}`},
		{in: `{"event":"client-typing","channel":"private-x","data":"hi"}`, event: "client-typing", channel: "private-x", data: `"hi"`},
		{in: `{"event":"client-n","channel":"private-x","data":7}`, event: "client-n", channel: "private-x", data: `7`},
		{in: `{"event":"pusher:pong"}`, event: "pusher:pong"},
		{in: `{"event":"e","channel":null,"data":null}`, event: "e"},
		{in: ` {"event":"e"} `, event: "e"},
		{in: `{"event":""}`, bad: true},
		{in: `{"event":null}`, bad: true},
		{in: `{"event":7}`, bad: true},
		{in: `{"Event":"e"}`, bad: true}, // keys are exact
		{in: `{"data":{}}`, bad: true},
		{in: `{"event":"e","channel":7}`, bad: true},
		{in: `{"event":"e","channel":["a"]}`, bad: true},
		{in: `["event"]`, bad: true},
		{in: `"event"`, bad: true},
		{in: `null`, bad: true},
		{in: ``, bad: true},
		{in: `{"event":"e"`, bad: true},
		{in: `{"event":"e"} x`, bad: true},
	} {
		in, err := Decode([]byte(tc.in))
		if tc.bad {
			if !errors.Is(err, ErrBadFrame) {
				t.Errorf("%s: err %v, want ErrBadFrame", tc.in, err)
			}
			continue
		}
		if err != nil || in.Event != tc.event || in.Channel != tc.channel || string(in.Data) != tc.data {
			t.Errorf("%s: %+v %v", tc.in, in, err)
		}
	}
}

func TestDecodeSubscribe(t *testing.T) {
	for _, tc := range []struct {
		data string
		want Subscribe
		bad  bool
	}{
		{data: `{"auth":"","channel":"orders"}`, want: Subscribe{Channel: "orders"}}, // pusher-js, public
		{data: `{"channel":"orders"}`, want: Subscribe{Channel: "orders"}},
		{data: `{"auth":"k:s","channel":"private-x"}`, want: Subscribe{Channel: "private-x", Auth: "k:s"}},
		{
			data: `{"auth":"k:s","channel_data":"{\"user_id\":10}","channel":"presence-x"}`,
			want: Subscribe{Channel: "presence-x", Auth: "k:s", ChannelData: `{"user_id":10}`},
		},
		{data: `"{\"channel\":\"orders\",\"auth\":\"k:s\"}"`, want: Subscribe{Channel: "orders", Auth: "k:s"}}, // old clients
		{data: `{"auth":"k:s"}`, bad: true},
		{data: `{"channel":""}`, bad: true},
		{data: `{"channel":7}`, bad: true},
		{data: `{"channel":"x","auth":1}`, bad: true},
		{data: `{"channel":"presence-x","channel_data":{"user_id":10}}`, bad: true}, // the signed string must be a string
		{data: `"orders"`, bad: true},
		{data: `"\"{\\\"channel\\\":\\\"x\\\"}\""`, bad: true}, // one level of string only
		{data: `[]`, bad: true},
		{data: ``, bad: true},
	} {
		got, err := DecodeSubscribe(json.RawMessage(tc.data))
		if tc.bad {
			if !errors.Is(err, ErrBadFrame) {
				t.Errorf("%s: err %v, want ErrBadFrame", tc.data, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v %v, want %+v", tc.data, got, err, tc.want)
		}
	}
}

func TestDecodeSignin(t *testing.T) {
	ud := `{"id":"12345"}`
	for _, tc := range []struct {
		data string
		want Signin
		bad  bool
	}{
		{data: `{"auth":"k:s","user_data":"{\"id\":\"12345\"}"}`, want: Signin{Auth: "k:s", UserData: ud}},
		{data: `"{\"auth\":\"k:s\",\"user_data\":\"{\\\"id\\\":\\\"12345\\\"}\"}"`, want: Signin{Auth: "k:s", UserData: ud}},
		{data: `{"auth":"k:s"}`, bad: true},
		{data: `{"user_data":"{}"}`, bad: true},
		{data: `{"auth":"","user_data":"{}"}`, bad: true},
		{data: `{"auth":"k:s","user_data":{"id":"1"}}`, bad: true},
	} {
		got, err := DecodeSignin(json.RawMessage(tc.data))
		if tc.bad {
			if !errors.Is(err, ErrBadFrame) {
				t.Errorf("%s: err %v, want ErrBadFrame", tc.data, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v %v, want %+v", tc.data, got, err, tc.want)
		}
	}
}

func TestDecodeUnsubscribe(t *testing.T) {
	for _, tc := range []struct {
		data, want string
		bad        bool
	}{
		{data: `{"channel":"orders"}`, want: "orders"},
		{data: `"{\"channel\":\"orders\"}"`, want: "orders"},
		{data: `{}`, bad: true},
		{data: `{"channel":null}`, bad: true},
		{data: `{"channel":false}`, bad: true},
	} {
		got, err := DecodeUnsubscribe(json.RawMessage(tc.data))
		if tc.bad {
			if !errors.Is(err, ErrBadFrame) {
				t.Errorf("%s: err %v, want ErrBadFrame", tc.data, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %q %v, want %q", tc.data, got, err, tc.want)
		}
	}
}

func TestCheckProtocol(t *testing.T) {
	for _, tc := range []struct {
		q    string
		code int
		ok   bool
	}{
		{"7", 0, true},
		{"6", 0, true},
		{"5", 0, true},
		{"07", 0, true},
		{"", CodeNoProtocol, false},
		{"4", CodeUnsupportedProtocol, false},
		{"8", CodeUnsupportedProtocol, false},
		{"0", CodeUnsupportedProtocol, false},
		{strings.Repeat("9", 40), CodeUnsupportedProtocol, false},
		{"7.0", CodeInvalidVersion, false},
		{"-7", CodeInvalidVersion, false},
		{"+7", CodeInvalidVersion, false},
		{" 7", CodeInvalidVersion, false},
		{"seven", CodeInvalidVersion, false},
	} {
		code, ok := CheckProtocol(tc.q)
		if code != tc.code || ok != tc.ok {
			t.Errorf("CheckProtocol(%q) = %d, %v; want %d, %v", tc.q, code, ok, tc.code, tc.ok)
		}
	}
}

// Decode must never panic, and what it accepts relays as a valid frame.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"event":"pusher:ping","data":{}}`,
		`{"event":"client-x","channel":"private-x","data":"s"}`,
		`{"event":"pusher:subscribe","data":"{\"channel\":\"x\"}"}`,
		`{"event":null}`, `[]`, ``, `{"event":"e","data":[1,{"a":null}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := Decode(b)
		if err != nil {
			return
		}
		if in.Event == "" {
			t.Fatal("accepted an empty event")
		}
		out := FrameRaw(in.Event, in.Channel, in.Data, "")
		if !json.Valid(out) {
			t.Fatalf("relayed an invalid frame %q", out)
		}
		DecodeSubscribe(in.Data)
		DecodeSignin(in.Data)
		DecodeUnsubscribe(in.Data)
	})
}
