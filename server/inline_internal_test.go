package server

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/greendot/greendot/protocol"
)

// maskedFrame is a client frame of b0 with payload, masked.
func maskedFrame(b0 byte, payload string) []byte {
	mask := [4]byte{1, 2, 3, 4}
	out := []byte{b0, 0x80 | byte(len(payload))}
	out = append(out, mask[:]...)
	for i := range len(payload) {
		out = append(out, payload[i]^mask[i&3])
	}
	return out
}

func TestHeartbeatFrame(t *testing.T) {
	hb := `{"type":"heartbeat","id":12}`
	two := append(maskedFrame(0x81, hb), maskedFrame(0x81, hb)...)
	unmasked := maskedFrame(0x81, hb)
	unmasked[1] &^= 0x80
	for _, tc := range []struct {
		name string
		data []byte
		max  int
		ok   bool
	}{
		{"heartbeat", maskedFrame(0x81, hb), 4096, true},
		{"without id", maskedFrame(0x81, `{"type":"heartbeat"}`), 4096, true},
		{"status", maskedFrame(0x81, `{"type":"status","state":"away"}`), 4096, false},
		{"bad json", maskedFrame(0x81, `{"type":"heartbeat"`), 4096, false},
		{"two frames", two, 4096, false},
		{"part of a frame", maskedFrame(0x81, hb)[:10], 4096, false},
		{"first fragment", maskedFrame(0x01, hb), 4096, false},
		{"binary", maskedFrame(0x82, hb), 4096, false},
		{"unmasked", unmasked, 4096, false},
		{"invalid utf-8", maskedFrame(0x81, "{\"type\":\"heartbeat\",\"x\":\"\xff\"}"), 4096, false},
		{"over the limit", maskedFrame(0x81, hb), 10, false},
	} {
		h, ok := heartbeatFrame(tc.data, tc.max)
		if ok != tc.ok {
			t.Errorf("%s: ok %v, want %v", tc.name, ok, tc.ok)
		}
		if ok && tc.name == "heartbeat" && string(h) != "12" {
			t.Errorf("%s: id %s, want 12", tc.name, h)
		}
	}
}

// TestAckFrameIsWhatMarshalWrites checks ackFrame against json.Marshal for
// ids as a heartbeat's decode gives them, and that it leaves to Marshal an
// id that Marshal would compact or escape.
func TestAckFrameIsWhatMarshalWrites(t *testing.T) {
	ids := []string{`12`, `0`, `-3.5e+7`, `1E5`, `"abc"`, `"a.b_c+d-e"`, `""`, `"ABC123"`, `true`, `false`}
	const plain = "abcxyzABCXYZ0189._+-"
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		b := []byte{'"'}
		for range r.IntN(20) {
			b = append(b, plain[r.IntN(len(plain))])
		}
		ids = append(ids, string(append(b, '"')), string(rune('1'+r.IntN(9)))+string(b[1:]))
	}
	fast := 0
	for _, id := range append(ids, `"a b"`, `"<x>"`, `"a&b"`, `"\u0041"`, `[1, 2]`, `{"a":1}`, `"é"`, "\"\u2028\"") {
		f, err := protocol.DecodeClientFrame([]byte(`{"type":"heartbeat","id":` + id + `}`))
		if err != nil || f.Heartbeat == nil {
			continue // not an id a heartbeat can carry
		}
		want, err := json.Marshal(protocol.HeartbeatAck{Type: protocol.TypeHeartbeatAck, ID: f.Heartbeat.ID})
		if err != nil {
			t.Fatal(err)
		}
		got := ackFrame(f.Heartbeat.ID)
		if got == nil {
			continue
		}
		fast++
		if string(got) != string(want) {
			t.Errorf("id %s: ackFrame %s, Marshal %s", f.Heartbeat.ID, got, want)
		}
	}
	if fast < 200 {
		t.Errorf("ackFrame encoded %d ids itself, want the plain ones (200 or more)", fast)
	}
	for _, id := range []string{`"a b"`, `"<x>"`, `"a&b"`, `"\u0041"`, `[1,2]`, `{"a":1}`, `"é"`} {
		if b := ackFrame([]byte(id)); b != nil {
			t.Errorf("ackFrame(%s) = %s, want nil: Marshal's to write", id, b)
		}
	}
}

var ackSink []byte

// BenchmarkAckFrame is the ack's encoding, beside Marshal's.
func BenchmarkAckFrame(b *testing.B) {
	id := json.RawMessage(`12`)
	b.Run("ackFrame", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if ackSink = ackFrame(id); ackSink == nil {
				b.Fatal("not encoded")
			}
		}
	})
	b.Run("Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if ackSink, err = json.Marshal(protocol.HeartbeatAck{Type: protocol.TypeHeartbeatAck, ID: id}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkHeartbeatFrame is the poller's decode of a heartbeat read.
func BenchmarkHeartbeatFrame(b *testing.B) {
	for _, tc := range []struct{ name, frame string }{
		{"id", `{"type":"heartbeat","id":12}`},
		{"plain", `{"type":"heartbeat"}`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			data := maskedFrame(0x81, tc.frame)
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := heartbeatFrame(data, 4096); !ok {
					b.Fatal("not a heartbeat")
				}
			}
		})
	}
}

func TestPusherPingFrame(t *testing.T) {
	ping := `{"event":"pusher:ping","data":{}}`
	for _, tc := range []struct {
		name string
		data []byte
		ok   bool
	}{
		{"ping", maskedFrame(0x81, ping), true},
		{"ping without data", maskedFrame(0x81, `{"event":"pusher:ping"}`), true},
		{"pong", maskedFrame(0x81, `{"event":"pusher:pong","data":{}}`), false},
		{"ping as data", maskedFrame(0x81, `{"event":"client-x","channel":"private-a","data":"pusher:ping"}`), false},
		{"ping as channel", maskedFrame(0x81, `{"event":"pusher:subscribe","data":{"channel":"pusher:ping"}}`), false},
		{"bad json", maskedFrame(0x81, `{"event":"pusher:ping"`), false},
		{"two frames", append(maskedFrame(0x81, ping), maskedFrame(0x81, ping)...), false},
		{"first fragment", maskedFrame(0x01, ping), false},
		{"binary", maskedFrame(0x82, ping), false},
	} {
		if ok := pusherPingFrame(tc.data, 4096); ok != tc.ok {
			t.Errorf("%s: ok %v, want %v", tc.name, ok, tc.ok)
		}
	}
}

// BenchmarkPusherPingFrame is the poller's decode of a pusher:ping read.
func BenchmarkPusherPingFrame(b *testing.B) {
	data := maskedFrame(0x81, `{"event":"pusher:ping","data":{}}`)
	b.ReportAllocs()
	for b.Loop() {
		if !pusherPingFrame(data, 4096) {
			b.Fatal("not a ping")
		}
	}
}
