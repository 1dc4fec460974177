package server

import "testing"

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
