package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/protocol"
)

// A light socket is a native connection that does what the server sees of
// a client (the handshake, heartbeats at the advertised interval with the
// client's jitter and ack rule, reading every frame) and nothing else: it
// decodes no frame past the welcome and keeps no presence. At 100,000
// connections on one machine the load processes' decoding and bookkeeping
// took more CPU than the servers and starved their own heartbeats
// (docs/benchmarks.md); light sockets keep the load on the servers what it
// was, and sampled viewers (full clients) check the dots.

// lightSocket is one light connection of the run.
type lightSocket struct {
	conn     *websocket.Conn
	interval time.Duration
	ttl      time.Duration

	cancel   context.CancelFunc // ends the reader
	done     chan struct{}      // closed when the reader returns
	lastRead atomic.Int64       // unix nanos of the last frame read
	closing  atomic.Bool        // Close was called: the end is the run's
	downAt   atomic.Int64       // unix nanos the socket ended; 0 while up

	mu       sync.Mutex // guards beat and timer against Close
	beat     uint64
	timer    *time.Timer    // the next heartbeat; nil once closed
	inflight sync.WaitGroup // a heartbeat being written; Close waits for it
}

// frameBufs holds read buffers: a socket borrows one per frame, so an idle
// socket holds none.
var frameBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

var (
	typePresence = []byte(`{"type":"presence"`)
	typeSnapshot = []byte(`{"type":"snapshot"`)
	userIDField  = []byte(`"user_id"`)
)

// dialLight connects m as a light socket, trying three times.
func (d *dialer) dialLight(ctx context.Context, m *member) (*lightSocket, error) {
	var err error
	for attempt := range 3 {
		var s *lightSocket
		if s, err = d.dialLightOnce(ctx, m); err == nil {
			d.ctr.dials.Add(1)
			return s, nil
		}
		if !sleepCtx(ctx, time.Duration(100<<attempt)*time.Millisecond) {
			break
		}
	}
	d.ctr.dialErrs.Add(1)
	return nil, err
}

func (d *dialer) dialLightOnce(ctx context.Context, m *member) (*lightSocket, error) {
	o := d.o
	q := url.Values{"device": {m.device}}
	header := http.Header{}
	if o.JWTSecret != "" {
		tok, err := signToken(o.JWTSecret, m.user, o.MaxTime+time.Hour)
		if err != nil {
			return nil, err
		}
		header.Set("Authorization", "Bearer "+tok)
	} else {
		q.Set("user", m.user)
	}
	u := o.Targets[m.target] + "/v1/connect?" + q.Encode()
	hs, cancelHS := context.WithTimeout(ctx, 15*time.Second)
	defer cancelHS()
	conn, _, err := websocket.Dial(hs, u, &websocket.DialOptions{HTTPClient: d.hc, HTTPHeader: header})
	if err != nil {
		return nil, fmt.Errorf("loadgen: light: dial %s: %w", u, err)
	}
	conn.SetReadLimit(pxReadLimit) // a snapshot of a large team
	fail := func(err error) (*lightSocket, error) {
		_ = conn.CloseNow()
		return nil, err
	}
	_, b, err := conn.Read(hs)
	if err != nil {
		return fail(fmt.Errorf("loadgen: light: welcome: %w", err))
	}
	var w protocol.Welcome
	if err := json.Unmarshal(b, &w); err != nil || w.Type != protocol.TypeWelcome || w.HeartbeatIntervalMS <= 0 {
		return fail(fmt.Errorf("loadgen: light: first frame %.200s, want a welcome", b))
	}
	// The user's status (v2) may come before the snapshot.
	for {
		_, b, err := conn.Read(hs)
		if err != nil {
			return fail(fmt.Errorf("loadgen: light: snapshot: %w", err))
		}
		if bytes.HasPrefix(b, typeSnapshot) {
			break
		}
	}
	rctx, cancel := context.WithCancel(context.Background())
	s := &lightSocket{conn: conn, interval: time.Duration(w.HeartbeatIntervalMS) * time.Millisecond,
		ttl: time.Duration(w.TTLMS) * time.Millisecond, cancel: cancel, done: make(chan struct{})}
	if s.ttl <= 0 {
		s.ttl = s.interval * 5 / 2
	}
	s.lastRead.Store(time.Now().UnixNano())
	m.up.Store(true)
	d.ctr.conns.Add(1)
	s.mu.Lock()
	s.timer = time.AfterFunc(heartbeatGap(s.interval), s.heartbeat)
	s.mu.Unlock()
	go s.read(rctx, m, d.ctr)
	return s, nil
}

// read is the socket's one goroutine: it reads every frame, counting the
// changes of presence frames by their user ids, until the socket ends.
func (s *lightSocket) read(ctx context.Context, m *member, ctr *counters) {
	defer close(s.done)
	for {
		n, err := s.readFrame(ctx)
		if err != nil {
			s.downAt.Store(time.Now().UnixNano())
			m.up.Store(false)
			ctr.conns.Add(-1)
			if !s.closing.Load() {
				ctr.drop("light socket: " + err.Error())
			}
			s.stopHeartbeats()
			return
		}
		s.lastRead.Store(time.Now().UnixNano())
		ctr.changes.Add(int64(n))
	}
}

// readFrame reads one frame into a pooled buffer and returns the changes it
// carries (0 unless it is a presence frame).
func (s *lightSocket) readFrame(ctx context.Context) (int, error) {
	_, r, err := s.conn.Reader(ctx)
	if err != nil {
		return 0, err
	}
	buf := frameBufs.Get().(*bytes.Buffer)
	buf.Reset()
	_, err = buf.ReadFrom(r)
	n := 0
	if b := buf.Bytes(); err == nil && bytes.HasPrefix(b, typePresence) {
		n = bytes.Count(b, userIDField)
	}
	if buf.Cap() <= 64<<10 { // a large frame's buffer goes back to the heap
		frameBufs.Put(buf)
	}
	return n, err
}

// heartbeat writes one heartbeat and arms the next, the client's way: an id
// (asking for an ack) only after half a ttl without a frame from the server.
func (s *lightSocket) heartbeat() {
	s.mu.Lock()
	if s.timer == nil {
		s.mu.Unlock()
		return
	}
	// Added under mu while the timer is set: Close clears it under mu
	// before it waits, so no Add comes after its Wait.
	s.inflight.Add(1)
	defer s.inflight.Done()
	frame := []byte(`{"type":"heartbeat"}`)
	if time.Since(time.Unix(0, s.lastRead.Load())) >= s.ttl/2 {
		s.beat++
		frame = []byte(`{"type":"heartbeat","id":` + strconv.FormatUint(s.beat, 10) + `}`)
	}
	s.mu.Unlock()
	// The client's default write timeout; past it the library closes the
	// connection, which the reader reports as a drop.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := s.conn.Write(ctx, websocket.MessageText, frame)
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && s.timer != nil {
		s.timer.Reset(heartbeatGap(s.interval))
	}
}

// heartbeatGap is the client's: uniform in [0.7, 1.0] of the interval.
func heartbeatGap(interval time.Duration) time.Duration {
	return time.Duration(float64(interval) * (0.7 + 0.3*rand.Float64()))
}

func (s *lightSocket) stopHeartbeats() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
}

// up reports whether the socket is open, and when it ended if not.
func (s *lightSocket) up() (bool, time.Time) {
	if at := s.downAt.Load(); at != 0 {
		return false, time.Unix(0, at)
	}
	return true, time.Time{}
}

// Close ends the socket with a normal close and waits for its reader.
func (s *lightSocket) Close() error {
	s.closing.Store(true)
	s.stopHeartbeats()
	err := s.conn.Close(websocket.StatusNormalClosure, "")
	s.cancel()
	<-s.done
	s.inflight.Wait()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}
