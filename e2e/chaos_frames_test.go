package e2e

import (
	"bytes"
	byteorder "encoding/binary"
	"encoding/json"
	"net"
	"sync"
	"time"
)

// A frame tap reads the raw server → client byte stream of one WebSocket
// connection (the HTTP answer, then unmasked frames) as the client's socket
// receives it, and records every presence entry delivered: the order and
// versions as sent, before the client drops what it considers stale.

// wireEntry is one user's state as a snapshot or presence frame carried it.
type wireEntry struct {
	recv     time.Time
	snapshot bool
	user     string
	state    string
	version  uint64
	at       int64 // ms; 0 in snapshots
}

// rawConn is one TCP connection of a device to a node.
type rawConn struct {
	node   string
	dialed time.Time
	conn   *tapConn

	mu        sync.Mutex
	upgraded  bool // the HTTP answer was 101
	entries   []wireEntry
	reconnect time.Time     // when a reconnect frame arrived (drain)
	closeRecv time.Time     // when a close frame arrived
	frozen    chan struct{} // non-nil while the device does not read
	parser    frameParser
}

// tapConn is the client's socket: it records what the server sends and,
// while its device is frozen, stops reading it (the client's own Freeze
// stops sending only).
type tapConn struct {
	net.Conn
	rc        *rawConn
	closeOnce sync.Once
	closed    chan struct{} // closed by Close
}

func (c *tapConn) Read(p []byte) (int, error) {
	if g := c.rc.gate(); g != nil {
		select {
		case <-g:
		case <-c.closed:
			return 0, net.ErrClosed
		}
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.rc.feed(p[:n], time.Now())
	}
	return n, err
}

func (c *tapConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// gate is open (nil) unless the device is frozen: then reads wait for it.
func (rc *rawConn) gate() chan struct{} {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.frozen
}

func (rc *rawConn) setFrozen(on bool) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	switch {
	case on && rc.frozen == nil:
		rc.frozen = make(chan struct{})
	case !on && rc.frozen != nil:
		close(rc.frozen)
		rc.frozen = nil
	}
}

func (rc *rawConn) feed(b []byte, now time.Time) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.parser.feed(b, func(op byte, payload []byte) { rc.onMessageLocked(op, payload, now) }, &rc.upgraded)
}

func (rc *rawConn) onMessageLocked(op byte, payload []byte, now time.Time) {
	switch op {
	case 8:
		if rc.closeRecv.IsZero() {
			rc.closeRecv = now
		}
		return
	case 1:
	default:
		return
	}
	var f struct {
		Type  string `json:"type"`
		Users []struct {
			UserID  string `json:"user_id"`
			State   string `json:"state"`
			Version uint64 `json:"version"`
		} `json:"users"`
		Changes []struct {
			UserID  string `json:"user_id"`
			State   string `json:"state"`
			Version uint64 `json:"version"`
			At      int64  `json:"at"`
		} `json:"changes"`
	}
	if json.Unmarshal(payload, &f) != nil {
		return
	}
	switch f.Type {
	case "snapshot":
		for _, u := range f.Users {
			rc.entries = append(rc.entries, wireEntry{recv: now, snapshot: true, user: u.UserID, state: u.State, version: u.Version})
		}
	case "presence":
		for _, c := range f.Changes {
			rc.entries = append(rc.entries, wireEntry{recv: now, user: c.UserID, state: c.State, version: c.Version, at: c.At})
		}
	case "reconnect":
		if rc.reconnect.IsZero() {
			rc.reconnect = now
		}
	}
}

// frameParser splits a server's byte stream into messages.
type frameParser struct {
	buf    []byte
	header bool // the HTTP answer has been read
	dead   bool // not a WebSocket stream (the answer was not 101)
	msg    []byte
	msgOp  byte
}

func (fp *frameParser) feed(b []byte, deliver func(op byte, payload []byte), upgraded *bool) {
	if fp.dead {
		return
	}
	fp.buf = append(fp.buf, b...)
	if !fp.header {
		end := bytes.Index(fp.buf, []byte("\r\n\r\n"))
		if end < 0 {
			return
		}
		status := fp.buf[:bytes.IndexByte(fp.buf, '\n')+1]
		if !bytes.Contains(status, []byte(" 101 ")) {
			fp.dead, fp.buf = true, nil
			return
		}
		*upgraded = true
		fp.header = true
		fp.buf = fp.buf[end+4:]
	}
	for {
		if len(fp.buf) < 2 {
			return
		}
		fin := fp.buf[0]&0x80 != 0
		op := fp.buf[0] & 0x0f
		masked := fp.buf[1]&0x80 != 0
		n := uint64(fp.buf[1] & 0x7f)
		pos := 2
		switch n {
		case 126:
			if len(fp.buf) < 4 {
				return
			}
			n = uint64(byteorder.BigEndian.Uint16(fp.buf[2:4]))
			pos = 4
		case 127:
			if len(fp.buf) < 10 {
				return
			}
			n = byteorder.BigEndian.Uint64(fp.buf[2:10])
			pos = 10
		}
		var key []byte
		if masked {
			if len(fp.buf) < pos+4 {
				return
			}
			key = fp.buf[pos : pos+4]
			pos += 4
		}
		if uint64(len(fp.buf)-pos) < n {
			return
		}
		payload := append([]byte(nil), fp.buf[pos:pos+int(n)]...)
		for i := range payload {
			if key != nil {
				payload[i] ^= key[i%4]
			}
		}
		fp.buf = fp.buf[pos+int(n):]
		switch {
		case op >= 8: // control frames come whole, between fragments too
			deliver(op, payload)
		case op == 0:
			fp.msg = append(fp.msg, payload...)
			if fin {
				deliver(fp.msgOp, fp.msg)
				fp.msg = nil
			}
		default:
			if fin {
				deliver(op, payload)
			} else {
				fp.msgOp, fp.msg = op, payload
			}
		}
		if len(fp.buf) == 0 {
			fp.buf = nil
		}
	}
}
