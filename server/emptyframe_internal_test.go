package server

import (
	"bytes"
	"testing"
)

// The walker finds empty text frames however the stream is cut.
func TestEmptyFramesAcrossReads(t *testing.T) {
	// masked frames: empty text, text "hi", empty text, 200-byte text, empty binary, empty text
	var stream []byte
	mask := []byte{1, 2, 3, 4}
	add := func(b0 byte, payload []byte) {
		stream = append(stream, b0)
		switch n := len(payload); {
		case n < 126:
			stream = append(stream, 0x80|byte(n))
		default:
			stream = append(stream, 0x80|126, byte(n>>8), byte(n))
		}
		stream = append(stream, mask...)
		stream = append(stream, payload...)
	}
	add(0x81, nil)
	add(0x81, []byte("hi"))
	add(0x81, nil)
	add(0x81, make([]byte, 200))
	add(0x82, nil)
	add(0x81, nil)
	for cut := 1; cut <= len(stream); cut++ {
		var w frameWalker
		got := 0
		for i := 0; i < len(stream); i += cut {
			n, bad, _ := w.walk(stream[i:min(i+cut, len(stream))])
			if bad != "" {
				t.Fatalf("reads of %d bytes: %s", cut, bad)
			}
			got += n
		}
		if got != 3 {
			t.Fatalf("reads of %d bytes: %d empty text frames, want 3", cut, got)
		}
	}
}

// A read holding maxRun frames of one token (pings, empty text frames; pongs
// aside) is a flood, cut where the run's last frame begins; a frame of
// another kind ends the run, and so does the end of a read.
func TestWalkerCutsARunOfOneTokenFrames(t *testing.T) {
	frame := func(b0 byte, payload string) []byte {
		return append([]byte{b0, 0x80 | byte(len(payload)), 1, 2, 3, 4}, payload...)
	}
	ping, empty, pong, text := frame(0x89, "p"), frame(0x81, ""), frame(0x8a, "p"), frame(0x81, "hi")
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	for name, tc := range map[string]struct {
		reads [][]byte
		flood bool
		at    int // in the last read
	}{
		"pings":                  {[][]byte{cat(ping, ping, ping, ping)}, true, 2 * len(ping)},
		"pings and empty frames": {[][]byte{cat(empty, ping, pong, empty, ping)}, true, len(empty) + len(ping) + len(pong)},
		"a text frame between":   {[][]byte{cat(ping, ping, text, ping, ping)}, false, 0},
		"over two reads":         {[][]byte{cat(ping, ping), cat(ping, ping)}, false, 0},
		"a header cut by a read": {[][]byte{cat(ping, ping[:3]), cat(ping[3:], ping, ping)}, true, len(ping) - 3 + len(ping)},
	} {
		t.Run(name, func(t *testing.T) {
			w := frameWalker{maxRun: 3}
			at := 0
			for _, r := range tc.reads {
				_, _, at = w.walk(r)
			}
			if w.flood != tc.flood || at != tc.at {
				t.Fatalf("flood %v at %d, want %v at %d", w.flood, at, tc.flood, tc.at)
			}
		})
	}
}
