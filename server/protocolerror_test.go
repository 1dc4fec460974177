package server_test

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// rawWS is a WebSocket spoken by hand over TCP, to send what no client
// library would.
type rawWS struct {
	c  net.Conn
	br *bufio.Reader
}

func dialRawWS(t *testing.T, ts *testServer, user string) *rawWS {
	t.Helper()
	c := dialTCP(t, ts.addr)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second)) // only against a hang
	if _, err := io.WriteString(c, upgradeRequest(user)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	w := &rawWS{c: c, br: br}
	if op, _ := w.read(t); op != 1 { // the welcome: the connection is registered
		t.Fatalf("first frame: opcode %d, want a text welcome", op)
	}
	return w
}

// rawFrame builds a client frame: b0 as given, masked unless unmasked.
func rawFrame(b0 byte, payload []byte, unmasked bool) []byte {
	out := []byte{b0}
	n := len(payload)
	lenByte := byte(n)
	if n > 125 {
		lenByte = 126
	}
	if !unmasked {
		lenByte |= 0x80
	}
	out = append(out, lenByte)
	if n > 125 {
		out = binary.BigEndian.AppendUint16(out, uint16(n))
	}
	mask := []byte{9, 8, 7, 6}
	if unmasked {
		return append(out, payload...)
	}
	out = append(out, mask...)
	for i, b := range payload {
		out = append(out, b^mask[i%4])
	}
	return out
}

// read reads one server frame (servers do not mask).
func (w *rawWS) read(t *testing.T) (op byte, payload []byte) {
	t.Helper()
	var h [2]byte
	if _, err := io.ReadFull(w.br, h[:]); err != nil {
		t.Fatalf("read a frame: %v", err)
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var e [2]byte
		if _, err := io.ReadFull(w.br, e[:]); err != nil {
			t.Fatal(err)
		}
		n = uint64(binary.BigEndian.Uint16(e[:]))
	case 127:
		var e [8]byte
		if _, err := io.ReadFull(w.br, e[:]); err != nil {
			t.Fatal(err)
		}
		n = binary.BigEndian.Uint64(e[:])
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(w.br, payload); err != nil {
		t.Fatal(err)
	}
	return h[0] & 0x0f, payload
}

// closeCode reads frames until a close frame and returns its code; 0 when
// the server closed the TCP connection without one.
func (w *rawWS) closeCode(t *testing.T) int {
	t.Helper()
	for {
		if _, err := w.br.Peek(1); err != nil {
			return 0
		}
		op, p := w.read(t)
		if op == 8 {
			if len(p) < 2 {
				return 1005
			}
			return int(binary.BigEndian.Uint16(p))
		}
	}
}

func TestProtocolErrorsCloseWith1002(t *testing.T) {
	ts := startServer(t)
	hb := []byte(`{"type":"heartbeat"}`)
	for name, bad := range map[string][]byte{
		"rsv1 bit":                rawFrame(0xC1, hb, false),
		"rsv3 bit":                rawFrame(0x91, hb, false),
		"reserved data opcode 3":  rawFrame(0x83, hb, false),
		"reserved control opcode": rawFrame(0x8B, nil, false),
		"unmasked text frame":     rawFrame(0x81, hb, true),
		"fragmented ping":         rawFrame(0x09, nil, false),
		"ping over 125 bytes":     rawFrame(0x89, make([]byte, 200), false),
		// A good frame first, in the same write: it is handled, then the close.
		"after a good frame": append(rawFrame(0x81, hb, false), rawFrame(0x83, hb, false)...),
	} {
		t.Run(name, func(t *testing.T) {
			w := dialRawWS(t, ts, "alice")
			if _, err := w.c.Write(bad); err != nil {
				t.Fatal(err)
			}
			if code := w.closeCode(t); code != 1002 {
				t.Fatalf("close code %d, want 1002", code)
			}
		})
	}
	// A well-formed stream is left alone: masked, fragmented text with a
	// ping between its fragments.
	w := dialRawWS(t, ts, "bob")
	msg := []byte(`{"type":"heartbeat","id":7}`)
	stream := append(rawFrame(0x01, msg[:10], false), rawFrame(0x89, []byte("p"), false)...)
	stream = append(stream, rawFrame(0x80, msg[10:], false)...)
	if _, err := w.c.Write(stream); err != nil {
		t.Fatal(err)
	}
	for {
		op, p := w.read(t)
		if op == 8 {
			t.Fatalf("closed: %v", p)
		}
		if op == 1 && string(p) == `{"type":"heartbeat_ack","id":7}` {
			break
		}
	}
	if !metricLine(t, ts, `greendot_frames_rejected_total{reason="protocol_error"} 8`) {
		t.Error(`greendot_frames_rejected_total{reason="protocol_error"} is not 8`)
	}
}
