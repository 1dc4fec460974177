package server_test

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/server"
	"github.com/greendot/greendot/store/memstore"
)

// frozenReader is a WebSocket client over TCP, with a tiny receive buffer,
// that reads its welcome and snapshot and then nothing until told to. It
// heartbeats all along, so that only its reading stops.
type frozenReader struct {
	t    *testing.T
	name string
	conn net.Conn
	r    *bufio.Reader
}

// heartbeat writes a masked heartbeat frame (no id: nothing answers it).
func (f *frozenReader) heartbeat() error {
	payload := []byte(`{"type":"heartbeat"}`)
	b := append([]byte{0x81, 0x80 | byte(len(payload)), 1, 2, 3, 4}, payload...)
	for i := range payload {
		b[6+i] ^= b[2+i%4]
	}
	_ = f.conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, err := f.conn.Write(b)
	return err
}

func (f *frozenReader) heartbeatEvery(d time.Duration) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if f.heartbeat() != nil {
					return // closed
				}
			}
		}
	}()
	f.t.Cleanup(func() { close(stop); <-done })
}

func dialFrozen(t *testing.T, addr, user string) *frozenReader {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 2048) })
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	fmt.Fprintf(conn, "GET /v1/connect?user=%s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", user, addr, base64.StdEncoding.EncodeToString(key))
	f := &frozenReader{t: t, name: user, conn: conn, r: bufio.NewReaderSize(conn, 512)}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	status, err := f.r.ReadString('\n')
	if err != nil || !strings.Contains(status, "101") {
		t.Fatalf("%s: handshake: %q %v", user, status, err)
	}
	for {
		line, err := f.r.ReadString('\n')
		if err != nil {
			t.Fatalf("%s: handshake: %v", user, err)
		}
		if line == "\r\n" {
			break
		}
	}
	for _, want := range []string{"welcome", "snapshot"} {
		if fr, _, err := f.message(); err != nil || fr.typ() != want {
			t.Fatalf("%s: %v %v, want a %s frame", user, fr, err, want)
		}
	}
	_ = conn.SetReadDeadline(time.Time{})
	f.heartbeatEvery(testHeartbeat)
	return f
}

// message reads one message: a text frame decoded, or the code of a close.
func (f *frozenReader) message() (frame, int, error) {
	var payload []byte
	for {
		var h [2]byte
		if _, err := io.ReadFull(f.r, h[:]); err != nil {
			return nil, 0, err
		}
		n := uint64(h[1] & 0x7f)
		switch n {
		case 126:
			var b [2]byte
			if _, err := io.ReadFull(f.r, b[:]); err != nil {
				return nil, 0, err
			}
			n = uint64(binary.BigEndian.Uint16(b[:]))
		case 127:
			var b [8]byte
			if _, err := io.ReadFull(f.r, b[:]); err != nil {
				return nil, 0, err
			}
			n = binary.BigEndian.Uint64(b[:])
		}
		if h[1]&0x80 != 0 || n > 1<<20 {
			return nil, 0, fmt.Errorf("bad server frame header % x (length %d)", h, n)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(f.r, b); err != nil {
			return nil, 0, err
		}
		switch op := h[0] & 0x0f; op {
		case 0x8:
			if len(b) < 2 {
				return nil, 1005, nil
			}
			return nil, int(binary.BigEndian.Uint16(b)), nil
		case 0x9, 0xa: // a ping or pong: not a message
			continue
		case 0x0, 0x1:
			payload = append(payload, b...)
		default:
			return nil, 0, fmt.Errorf("unexpected opcode %d", op)
		}
		if h[0]&0x80 == 0 {
			continue // more fragments follow
		}
		var fr frame
		if err := json.Unmarshal(payload, &fr); err != nil {
			return nil, 0, fmt.Errorf("frame is not JSON: %q", payload)
		}
		return fr, 0, nil
	}
}

// readChanges reads presence frames until done says stop, or the connection
// ends; it returns the changes read and the close code (0: none came).
func (f *frozenReader) readChanges(done func(change map[string]any) bool) (changes, closeCode int) {
	f.t.Helper()
	_ = f.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer func() { _ = f.conn.SetReadDeadline(time.Time{}) }()
	for {
		fr, code, err := f.message()
		if err != nil {
			return changes, 0
		}
		if code != 0 {
			return changes, code
		}
		if fr.typ() != "presence" {
			f.t.Errorf("%s: unexpected frame %v", f.name, fr)
			continue
		}
		for _, ch := range fr["changes"].([]any) {
			changes++
			if done != nil && done(ch.(map[string]any)) {
				return changes, 0
			}
		}
	}
}

// subject flaps; its long id makes frames of some 230 bytes, which fill
// buffers sooner.
var subject = "flapper-" + strings.Repeat("x", 100)

// flip sends n status frames from the subject's connection c, away first,
// each once the previous one has reached the reading viewer pacer: each
// change is then a flush round of its own, as with changes spread over
// time (a burst would be batched into a few frames).
func flip(t *testing.T, c, pacer *wsClient, n int) {
	t.Helper()
	for i := range n {
		state := "away"
		if i%2 == 1 {
			state = "online"
		}
		setStatus(t, c, pacer, state)
	}
}

func setStatus(t *testing.T, c, pacer *wsClient, state string) {
	t.Helper()
	c.send(`{"type":"status","state":"` + state + `"}`)
	pacer.expectChanges(5*time.Second, subject+"="+state)
}

// slowReaderServer has a long ttl: with a 2 KiB receive buffer on
// loopback, the kernel drops segments towards a frozen reader and backs off
// its retransmissions (seen: 1.6 s timers, the reader's own heartbeats held
// up behind them), so a short ttl would expire frozen readers meanwhile.
func slowReaderServer(t *testing.T, timeout time.Duration) (*testServer, *prometheus.Registry) {
	const ttl = 30 * time.Second
	st, err := memstore.New(memstore.Config{TTL: ttl, Grace: testGrace})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	ts := startServer(t, func(c *server.Config) {
		c.Store, c.TTL = st, ttl
		c.SocketSendBuffer = 4 << 10
		c.Registry = reg
		c.RateLimit, c.RateBurst = 1e6, 1e6
		c.SlowReaderTimeout = timeout
	})
	ts.store = st
	return ts, reg
}

// A viewer that stops reading while one subject flaps is not written every
// change: once its socket stops draining, the changes wait in its outbox,
// one per subject, and when it reads again it gets the latest state. Before,
// every change went into nbio's buffer: 3,001 of 3,001.
func TestFrozenReaderIsCoalesced(t *testing.T) {
	ts, reg := slowReaderServer(t, time.Hour)
	ts.join("t1", "alice", "carol", subject)
	alice := dialFrozen(t, ts.addr, "alice")
	carol := ts.dial(t, "carol")
	bob := ts.dial(t, subject)
	carol.expectChanges(time.Second, subject+"=online")
	const n = 401 // ends away
	flip(t, bob, carol, n)
	checkFor(t, 5*time.Second, func() error {
		if v := gauge(t, reg, "greendot_slow_consumers"); v != 1 {
			return errorf("slow consumers = %v, want 1 (alice)", v)
		}
		return nil
	})
	// Every change queued while the previous one waited counts as
	// coalesced; those while the socket was marked stalled also count as the
	// slow consumer's. A change can be coalesced in the ordinary batching
	// window, or while a drain had just cleared the mark: the unwritten
	// ones are counted by the first, not the second (a run had 365 of 366).
	coalesced := gauge(t, reg, "greendot_deliveries_coalesced_total")
	if slow := gauge(t, reg, "greendot_slow_consumer_coalesced_total"); slow <= 0 {
		t.Fatalf("no change coalesced while the reader was stalled")
	}
	last := uint64(ts.presenceOf(subject)["version"].(float64))

	got, code := alice.readChanges(func(ch map[string]any) bool {
		return ch["user_id"] == subject && uint64(ch["version"].(float64)) == last
	})
	if code != 0 {
		t.Fatalf("alice closed with %d", code)
	}
	// n+2 changes: carol's online, the subject's online and n flips. The
	// kernel buffers (2 KiB asked to receive, 4 KiB to send; the kernel
	// doubles them) hold some 60 frames of one change.
	t.Logf("changes written to the frozen reader: %d of %d; coalesced: %v", got, n+2, coalesced)
	if got > 150 {
		t.Fatalf("the frozen reader was written %d of %d changes, want at most 150", got, n+2)
	}
	if coalesced < float64(n+2-got) {
		t.Fatalf("coalesced: %v, want at least the %d not written", coalesced, n+2-got)
	}
	// Drained: nothing is held any more, and later changes flow.
	checkFor(t, 5*time.Second, func() error {
		if v := gauge(t, reg, "greendot_slow_consumers"); v != 0 {
			return errorf("slow consumers = %v after draining, want 0", v)
		}
		return nil
	})
	setStatus(t, bob, carol, "online")
	setStatus(t, bob, carol, "away")
	if got, _ := alice.readChanges(func(ch map[string]any) bool { return ch["state"] == "away" }); got != 2 {
		t.Fatalf("after draining, %d changes to reach online then away, want 2", got)
	}
}

// Ten viewers that stop reading beside a flapping subject are closed with
// 1013 once their sockets have taken nothing for SlowReaderTimeout, with
// only what their kernel buffers hold written to them, while a reading
// viewer gets every latest state. Before, none was closed within 60 s.
func TestStuckReadersAreClosedWith1013(t *testing.T) {
	// Long enough for the readers to take their close frames below.
	ts, reg := slowReaderServer(t, 3*time.Second)
	users := []string{subject, "carol"}
	for i := range 10 {
		users = append(users, fmt.Sprint("frozen", i))
	}
	ts.join("t1", users...)
	var frozen []*frozenReader
	for _, u := range users[2:] {
		frozen = append(frozen, dialFrozen(t, ts.addr, u))
	}
	carol := ts.dial(t, "carol")
	bob := ts.dial(t, subject)
	carol.expectChanges(time.Second, subject+"=online")
	const n = 401 // ends away
	// carol reads throughout, and gets every change.
	flip(t, bob, carol, n)
	// No change comes after the flips: the timer, not a change, closes.
	checkFor(t, 20*time.Second, func() error {
		if v := gauge(t, reg, "greendot_slow_consumer_timeouts_total"); v != 10 {
			return errorf("slow consumer timeouts = %v, want 10", v)
		}
		return nil
	})
	var wg sync.WaitGroup
	got := make([]int, len(frozen))
	codes := make([]int, len(frozen))
	for i, f := range frozen {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], codes[i] = f.readChanges(nil)
		}()
	}
	wg.Wait()
	for i := range frozen {
		if codes[i] != 1013 {
			t.Errorf("%s: close code %d, want 1013", frozen[i].name, codes[i])
		}
		if got[i] > 150 {
			t.Errorf("%s: written %d changes (the subject alone made %d), want at most 150", frozen[i].name, got[i], n+1)
		}
	}
	t.Logf("changes written to each stuck reader: %v (the subject alone made %d)", got, n+1)
	checkFor(t, 10*time.Second, func() error {
		if v := gauge(t, reg, "greendot_connections"); v != 2 {
			return errorf("connections = %v, want the subject and carol", v)
		}
		if v := gauge(t, reg, "greendot_slow_consumers"); v != 0 {
			return errorf("slow consumers = %v, want 0", v)
		}
		return nil
	})
}
