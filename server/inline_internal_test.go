package server

import "testing"

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
		if ok && tc.name == "heartbeat" && string(h.ID) != "12" {
			t.Errorf("%s: id %s, want 12", tc.name, h.ID)
		}
	}
}

// BenchmarkHeartbeatFrame is the poller's decode of a heartbeat read.
func BenchmarkHeartbeatFrame(b *testing.B) {
	data := maskedFrame(0x81, `{"type":"heartbeat","id":12}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := heartbeatFrame(data, 4096); !ok {
			b.Fatal("not a heartbeat")
		}
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
