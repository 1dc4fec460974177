package protocol

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestDecodeClientFrame(t *testing.T) {
	for _, tc := range []struct {
		in   string
		code string // "" when valid
	}{
		{`{"type":"heartbeat"}`, ""},
		{`{"type":"heartbeat","id":7}`, ""},
		{`{"type":"heartbeat","id":"x"}`, ""},
		{`{"type":"heartbeat","id":null}`, ""},
		{`{"type":"heartbeat","id":{}}`, CodeBadRequest},
		{`{"type":"heartbeat","id":"a-b_9"}`, ""},
		{`{"type":"heartbeat","id":-12}`, ""},
		{`{"type":"heartbeat","id":1-2}`, CodeBadRequest},
		{`{"type":"heartbeat","id":""}`, ""},
		{`{"type":"heartbeat","id":"a\"}`, CodeBadRequest},
		{`{"type":"status","state":"away"}`, ""},
		{`{"type":"status","state":"offline"}`, CodeBadRequest},
		{`{"type":"query","id":"q","user_ids":[]}`, ""},
		{`{"type":"query","user_ids":null}`, CodeBadRequest},
		{`{"type":"query","user_ids":[` + strings.Repeat(`"a",`, 500) + `"a"]}`, CodeTooManyIDs},
		{`{"type":"query","user_ids":["a\ud800b"]}`, CodeBadRequest}, // a lone surrogate escape
		{`{"type":"query","user_ids":["\ufffd","\udfff"]}`, CodeBadRequest},
		{`{"type":"query","user_ids":["\ufffd","\ud83d\ude00","` + "\uFFFD" + `"]}`, ""},
		{`{"type":"nope"}`, CodeUnknownType},
		{`{"type":null}`, CodeBadRequest},
		{``, CodeBadRequest},
		{`null`, CodeBadRequest},
		{`{"type":"status","state":["online"]}`, CodeBadRequest},
	} {
		_, err := DecodeClientFrame([]byte(tc.in))
		var de *DecodeError
		switch {
		case tc.code == "" && err != nil:
			t.Errorf("%s: %v", tc.in, err)
		case tc.code != "" && (!errors.As(err, &de) || de.Code != tc.code):
			t.Errorf("%s: %v, want code %s", tc.in, err, tc.code)
		}
	}
}

// The fast path must agree with the general decoder on the id it returns.
func TestHeartbeatFastPathAgrees(t *testing.T) {
	for _, in := range []string{`{"type":"heartbeat","id":42}`, `{"type":"heartbeat","id":"ab-c"}`, `{"type":"heartbeat","id":-7}`, `{"type":"heartbeat"}`} {
		fast, ok := SimpleHeartbeat([]byte(in))
		var slow Heartbeat
		if err := json.Unmarshal([]byte(in), &slow); err != nil || !ok || string(fast) != string(slow.ID) {
			t.Errorf("%s: fast %q (%v), slow %q (%v)", in, fast, ok, slow.ID, err)
		}
	}
}

// TestHeartbeatIDWithLeadingZerosIsRefused: 007 is not JSON, and an ack
// echoing it would not be either.
func TestHeartbeatIDWithLeadingZerosIsRefused(t *testing.T) {
	for _, id := range []string{`007`, `00`, `-01`, `0123456789`} {
		in := `{"type":"heartbeat","id":` + id + `}`
		if _, ok := heartbeatWithSimpleID([]byte(in)); ok {
			t.Errorf("%s: taken by the fast path", in)
		}
		if f, err := DecodeClientFrame([]byte(in)); err == nil {
			t.Errorf("%s: decoded as %+v, want an error", in, f.Heartbeat)
		}
	}
	for _, id := range []string{`0`, `-0`, `10`, `-10`, `"007"`} {
		in := `{"type":"heartbeat","id":` + id + `}`
		if f, err := DecodeClientFrame([]byte(in)); err != nil || string(f.Heartbeat.ID) != id {
			t.Errorf("%s: %v, %+v", in, err, f.Heartbeat)
		}
	}
}

func TestValidID(t *testing.T) {
	for id, want := range map[string]bool{
		"alice": true, "ünï 🙂": true, "a b": true, strings.Repeat("x", 128): true,
		"": false, strings.Repeat("x", 129): false, "a\x00": false, "a\nb": false,
		"\x7f": false, "\u200b": false, string([]byte{0xff}): false, "\u0085": false,
	} {
		if got := ValidID(id); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", id, got, want)
		}
	}
}

func TestUnknownUserPresenceHasOnlyIDAndState(t *testing.T) {
	b, _ := json.Marshal(UserPresence{UserID: "zed", State: StateUnknown, ConnectionCount: 3})
	if string(b) != `{"user_id":"zed","state":"unknown"}` {
		t.Fatalf("unknown = %s", b)
	}
	b, _ = json.Marshal(UserPresence{UserID: "bob", State: StateOffline})
	if string(b) != `{"user_id":"bob","state":"offline","connection_count":0,"devices":[],"last_seen":null,"version":0,"since":null}` {
		t.Fatalf("never seen = %s", b)
	}
}

// FuzzDecodeClientFrame: the decoder never panics, refuses with a known code
// and a message, and accepts only frames whose fields make sense.
func FuzzDecodeClientFrame(f *testing.F) {
	for _, seed := range []string{
		`{"type":"heartbeat","id":1}`, `{"type":"status","state":"online"}`,
		`{"type":"set_status","mode":"dnd","text":"x","emoji":"📅","expires_at":1764500000000}`,
		`{"type":"query","id":"q","user_ids":["a","b"]}`, `{"type":"x"}`, `{`, `[]`, `""`,
		`{"type":"query","user_ids":[{"a":1}]}`, `{"type":"heartbeat","id":"\ud800"}`,
	} {
		f.Add([]byte(seed))
	}
	codes := map[string]bool{CodeBadRequest: true, CodeUnknownType: true, CodeTooManyIDs: true}
	f.Fuzz(func(t *testing.T, data []byte) {
		// The fast path takes only what the general one reads the same.
		if id, ok := SimpleHeartbeat(data); ok {
			var slow struct {
				Type string          `json:"type"`
				ID   json.RawMessage `json:"id"`
			}
			if err := json.Unmarshal(data, &slow); err != nil || slow.Type != TypeHeartbeat || string(slow.ID) != string(id) || checkID(slow.ID) != nil {
				t.Fatalf("fast path took %q as id %q; general path: %+v, %v", data, id, slow, err)
			}
		}
		fr, err := DecodeClientFrame(data)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) || !codes[de.Code] || de.Message == "" {
				t.Fatalf("error %v is not a DecodeError with a known code", err)
			}
			return
		}
		n := 0
		if fr.Heartbeat != nil {
			n++
		}
		if fr.Status != nil {
			n++
			if fr.Status.State != StateOnline && fr.Status.State != StateAway {
				t.Fatalf("accepted status %q", fr.Status.State)
			}
		}
		if fr.Query != nil {
			n++
			if fr.Query.UserIDs == nil || len(fr.Query.UserIDs) > MaxQueryIDs {
				t.Fatalf("accepted query with %d ids", len(fr.Query.UserIDs))
			}
		}
		if fr.SetStatus != nil {
			n++
			if !ValidMode(fr.SetStatus.Mode) {
				t.Fatalf("accepted set_status mode %q", fr.SetStatus.Mode)
			}
		}
		if n != 1 {
			t.Fatalf("decoded %d frames from %q", n, data)
		}
	})
}

func BenchmarkEncodePresence(b *testing.B) {
	frame := Presence{Type: TypePresence, Changes: []Change{
		{UserID: "bob", State: StateOnline, Version: 8, At: 1764500000000},
		{UserID: "carol", State: StateAway, Version: 3, At: 1764500000001},
	}}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := json.Marshal(frame); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeHeartbeat(b *testing.B) {
	data := []byte(`{"type":"heartbeat","id":42}`)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := DecodeClientFrame(data); err != nil {
			b.Fatal(err)
		}
	}
}

// A watch's or unwatch's lone surrogate id names the frame it came in; a
// literal U+FFFD is a valid character and passes.
func TestDecodeWatchMessages(t *testing.T) {
	for frame, want := range map[string]string{
		`{"type":"watch","user_ids":["a\ud800"]}`:                                MsgBadWatchID,
		`{"type":"unwatch","user_ids":["a\ud800"]}`:                              MsgBadWatchID,
		`{"type":"query","user_ids":["a\ud800"]}`:                                MsgBadQueryID,
		`{"type":"unwatch","user_ids":[` + strings.Repeat(`"a",`, 500) + `"a"]}`: "an unwatch frame takes at most 500 user ids",
		`{"type":"watch","user_ids":[` + strings.Repeat(`"a",`, 500) + `"a"]}`:   "a watch frame takes at most 500 user ids",
	} {
		_, err := DecodeClientFrame([]byte(frame))
		var de *DecodeError
		if !errors.As(err, &de) || de.Message != want {
			t.Errorf("%.60s: err %v, want %q", frame, err, want)
		}
	}
	if _, err := DecodeClientFrame([]byte(`{"type":"set_status","mode":"dnd","text":"a\ufffd"}`)); err != nil {
		t.Errorf("a literal U+FFFD was refused: %v", err)
	}
}

func TestDecodeSetStatus(t *testing.T) {
	f, err := DecodeClientFrame([]byte(`{"type":"set_status","mode":"dnd","text":"In a meeting","emoji":"📅","expires_at":1764500000000}`))
	if err != nil || f.SetStatus == nil {
		t.Fatalf("decode: %v, %+v", err, f)
	}
	if st := f.SetStatus; st.Mode != ModeDND || st.Text != "In a meeting" || st.Emoji != "📅" || st.ExpiresAt == nil || *st.ExpiresAt != 1764500000000 {
		t.Fatalf("set_status = %+v", st)
	}
	f, err = DecodeClientFrame([]byte(`{"type":"set_status","mode":"auto","expires_at":null}`))
	if err != nil || f.SetStatus == nil || f.SetStatus.ExpiresAt != nil {
		t.Fatalf("decode auto: %v, %+v", err, f.SetStatus)
	}
	for _, bad := range []string{
		`{"type":"set_status"}`,
		`{"type":"set_status","mode":"busy"}`,
		`{"type":"set_status","mode":"dnd","text":5}`,
		`{"type":"set_status","mode":"dnd","expires_at":"soon"}`,
		`{"type":"set_status","mode":"dnd","expires_at":1.5}`,
		`{"type":"set_status","mode":"dnd","text":"a\udcff"}`, // lone surrogates, as HTTP refuses them
		`{"type":"set_status","mode":"dnd","emoji":"\ud83d"}`,
	} {
		_, err := DecodeClientFrame([]byte(bad))
		var de *DecodeError
		if !errors.As(err, &de) || de.Code != CodeBadRequest {
			t.Errorf("%s: err %v, want bad_request", bad, err)
		}
	}
}
