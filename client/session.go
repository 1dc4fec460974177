package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/protocol"
)

// errAdvisedReconnect ends a connection the server asked us to leave (a
// reconnect frame) but did not close by the advised time.
var errAdvisedReconnect = errors.New("client: reconnecting as the server advised")

// session is one WebSocket connection, from welcome to close. It runs
// exactly two goroutines, started by start and waited for through wg: the
// reader (readLoop), the only one to read the socket, and the writer
// (writeLoop), the only one to write frames (plus the close handshake the
// supervisor starts). Either ends the session by cancelling ctx with the
// cause; the other follows.
type session struct {
	c       *Client
	conn    *websocket.Conn
	welcome protocol.Welcome
	opened  time.Time // when the snapshot arrived

	ctx    context.Context // cancelled, with the cause, when the session ends
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup

	out      chan outFrame // unbuffered, never closed: frames for the writer
	lastRecv atomic.Int64  // the latest frame read, as mono nanoseconds

	mu             sync.Mutex
	pending        map[string]chan<- reply // guarded by mu: requests awaiting a reply, by id
	reconnectAt    time.Time               // guarded by mu: when the server advised reconnecting
	reconnectTimer *time.Timer             // guarded by mu
	stopped        bool                    // guarded by mu
}

type outFrame struct {
	typ  string
	data []byte
	done chan error // capacity 1: the write's result
}

type reply struct {
	at    time.Time // receipt of the reply frame
	users []protocol.UserPresence
}

// connect makes one attempt: token, handshake, welcome, snapshot. On success
// the snapshot is applied, the session's goroutines run and it is the
// client's live session.
func (c *Client) connect(ctx context.Context) (*session, error) {
	header := c.opts.Header.Clone()
	if header == nil {
		header = http.Header{}
	}
	token := c.opts.Token
	if c.opts.TokenFunc != nil {
		t, err := c.opts.TokenFunc(ctx)
		if err != nil {
			return nil, fmt.Errorf("client: token: %w", err)
		}
		token = t
	}
	if token != "" {
		header.Set("Authorization", "Bearer "+token)
	}
	conn, resp, err := websocket.Dial(ctx, c.url, &websocket.DialOptions{
		HTTPClient: c.opts.HTTPClient,
		HTTPHeader: header,
		// A frozen client must send nothing, not even a pong.
		OnPingReceived: func(context.Context, []byte) bool { return !c.isFrozen() },
	})
	if err != nil {
		return nil, handshakeError(resp, err)
	}
	conn.SetReadLimit(c.opts.ReadLimit)

	var welcome protocol.Welcome
	if _, err := readFrame(ctx, conn, protocol.TypeWelcome, &welcome); err != nil {
		_ = conn.CloseNow()
		return nil, err
	}
	// v2: the user's status may come between welcome and snapshot.
	var snap protocol.Snapshot
	var my protocol.MyStatus
	received, err := readFrame(ctx, conn, protocol.TypeSnapshot, &snap, protocol.TypeMyStatus, &my)
	if err == nil && my.Type != "" {
		received, err = readFrame(ctx, conn, protocol.TypeSnapshot, &snap)
	}
	if err != nil {
		_ = conn.CloseNow()
		return nil, err
	}
	if my.Type != "" {
		c.applyMyStatus(my)
	}

	s := &session{
		c:       c,
		conn:    conn,
		welcome: welcome,
		opened:  received,
		out:     make(chan outFrame),
		pending: make(map[string]chan<- reply),
	}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	s.lastRecv.Store(0) // the snapshot: opened

	c.presMu.Lock()
	changes := c.pres.applySnapshot(snap.Users, received)
	c.presMu.Unlock()
	c.emit(changes)

	s.wg.Add(2)
	go s.readLoop()
	go s.writeLoop()
	c.setSession(s)
	c.setState(StateChange{State: Connected})
	c.opts.Logger.Info("greendot: connected", "connection_id", welcome.ConnectionID,
		"user_id", welcome.UserID, "heartbeat_interval_ms", welcome.HeartbeatIntervalMS,
		"snapshot_users", len(snap.Users))
	return s, nil
}

// handshakeError explains a failed handshake, with the server's message
// when it sent its JSON error body.
func handshakeError(resp *http.Response, err error) error {
	if resp == nil {
		return fmt.Errorf("client: connect: %w", err)
	}
	msg := http.StatusText(resp.StatusCode)
	if resp.Body != nil {
		var body struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.NewDecoder(resp.Body).Decode(&body) == nil && body.Error.Message != "" {
			msg = body.Error.Message
		}
	}
	if resp.StatusCode == http.StatusUnauthorized {
		return fmt.Errorf("%w: %s", ErrUnauthorized, msg)
	}
	err = fmt.Errorf("client: connect: HTTP %d: %s: %w", resp.StatusCode, msg, err)
	if secs, perr := strconv.Atoi(resp.Header.Get("Retry-After")); perr == nil && secs > 0 {
		return &retryAfterError{err: err, after: time.Duration(secs) * time.Second}
	}
	return err
}

// retryAfterError is a refused handshake whose server said when to retry
// (a node shedding a reconnect storm answers 503 with Retry-After).
type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// readFrame reads one frame that must be of type want into v.
// A frame of type alt (when given) is decoded into altV instead.
func readFrame(ctx context.Context, conn *websocket.Conn, want string, v any, alt ...any) (time.Time, error) {
	_, data, err := conn.Read(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("client: waiting for %s: %w", want, err)
	}
	received := time.Now()
	var head struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return received, fmt.Errorf("%w: %s frame: %v", ErrProtocol, want, err)
	}
	if len(alt) == 2 && head.Type == alt[0] {
		v = alt[1]
	} else if head.Type != want {
		return received, fmt.Errorf("%w: got %q where %q belongs", ErrProtocol, head.Type, want)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return received, fmt.Errorf("%w: %s frame: %v", ErrProtocol, want, err)
	}
	return received, nil
}

// mono is t as nanoseconds since the session opened, from the monotonic
// readings that time.Now carries (UnixNano drops them): a step of the wall
// clock can neither drop a healthy connection nor keep a silent one.
func (s *session) mono(t time.Time) int64 { return int64(t.Sub(s.opened)) }

// stop releases the session's timer and returns the advised reconnect time.
func (s *session) stop() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	if s.reconnectTimer != nil {
		s.reconnectTimer.Stop()
	}
	return s.reconnectAt
}

func (s *session) readLoop() {
	defer s.wg.Done()
	for {
		typ, data, err := s.conn.Read(s.ctx)
		if err != nil {
			s.cancel(err)
			return
		}
		now := time.Now()
		s.lastRecv.Store(s.mono(now))
		if typ == websocket.MessageText {
			s.dispatch(data, now)
		}
	}
}

// dispatch handles one server frame read at now. Frames it cannot make sense
// of are logged and skipped: a newer server may send more.
func (s *session) dispatch(data []byte, now time.Time) {
	c := s.c
	var head struct {
		Type string `json:"type"`
	}
	if t, ok := leadingType(data); ok {
		head.Type = t
	} else if err := json.Unmarshal(data, &head); err != nil {
		c.opts.Logger.Warn("greendot: undecodable frame", "err", err)
		return
	}
	var err error
	switch head.Type {
	case protocol.TypePresence:
		var p protocol.Presence
		if err = json.Unmarshal(data, &p); err == nil {
			c.presMu.Lock()
			applied := c.pres.applyChanges(p.Changes, now)
			c.presMu.Unlock()
			c.emit(applied)
		}
	case protocol.TypeSnapshot:
		var p protocol.Snapshot
		if err = json.Unmarshal(data, &p); err == nil {
			c.presMu.Lock()
			applied := c.pres.applySnapshot(p.Users, now)
			c.presMu.Unlock()
			c.emit(applied)
		}
	case protocol.TypeHeartbeatAck:
		var a protocol.HeartbeatAck
		if err = json.Unmarshal(data, &a); err == nil {
			s.deliver(a.ID, reply{at: now})
		}
	case protocol.TypeQueryResult:
		var r protocol.QueryResult
		if err = json.Unmarshal(data, &r); err == nil {
			s.deliver(r.ID, reply{at: now, users: r.Users})
		}
	case protocol.TypeWatchResult:
		var r protocol.WatchResult
		if err = json.Unmarshal(data, &r); err == nil {
			s.deliver(r.ID, reply{at: now, users: r.Users})
		}
	case protocol.TypeTeamCounts:
		var f protocol.TeamCounts
		if err = json.Unmarshal(data, &f); err == nil {
			c.applyTeamCounts(f)
		}
	case protocol.TypeReconnect:
		var r protocol.Reconnect
		if err = json.Unmarshal(data, &r); err == nil {
			s.adviseReconnect(time.Duration(r.AfterMS)*time.Millisecond, now)
		}
	case protocol.TypeError:
		var e protocol.Error
		if err = json.Unmarshal(data, &e); err == nil {
			c.opts.Logger.Warn("greendot: server refused a frame", "code", e.Code, "message", e.Message)
		}
	case protocol.TypeMyStatus:
		var m protocol.MyStatus
		if err = json.Unmarshal(data, &m); err == nil {
			c.applyMyStatus(m)
		}
	case protocol.TypeWelcome:
	default:
		c.opts.Logger.Debug("greendot: unknown frame type", "type", head.Type)
	}
	if err != nil {
		c.opts.Logger.Warn("greendot: bad frame", "type", head.Type, "err", err)
	}
}

// leadingType reads the type of a frame that starts with it, as every frame
// of greendot's server does, sparing a decoding pass over the whole frame.
// The frame is still decoded in full (and checked) by its type's decoder.
func leadingType(data []byte) (string, bool) {
	const prefix = `{"type":"`
	if !bytes.HasPrefix(data, []byte(prefix)) {
		return "", false
	}
	rest := data[len(prefix):]
	end := bytes.IndexByte(rest, '"')
	if end < 0 || bytes.IndexByte(rest[:end], '\\') >= 0 {
		return "", false
	}
	return string(rest[:end]), true
}

// adviseReconnect records a reconnect frame: come back after the advised
// delay plus up to 10% (0.1s-1s) of jitter. The server closes with 1012
// next; should it not, the client leaves by itself 2s past that time.
func (s *session) adviseReconnect(after time.Duration, now time.Time) {
	after = min(max(after, 0), s.c.opts.ReconnectMax)
	after += rand.N(min(max(after/10, 100*time.Millisecond), time.Second))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reconnectAt = now.Add(after)
	if s.reconnectTimer != nil || s.stopped {
		return
	}
	s.reconnectTimer = time.AfterFunc(after+2*time.Second, func() { s.cancel(errAdvisedReconnect) })
}

// deliver hands a reply to the request waiting for its id, if any.
func (s *session) deliver(id json.RawMessage, r reply) {
	var key string
	if json.Unmarshal(id, &key) != nil {
		return // not one of ours: automatic heartbeats carry numbers
	}
	s.mu.Lock()
	ch, ok := s.pending[key]
	delete(s.pending, key)
	s.mu.Unlock()
	if ok {
		ch <- r // capacity 1, one reply per id
	}
}

// request sends a frame carrying id and waits for the reply with that id.
func (s *session) request(ctx context.Context, id requestID, typ string, frame any) (reply, error) {
	ch := make(chan reply, 1)
	s.mu.Lock()
	s.pending[id.key] = ch
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.pending, id.key)
		s.mu.Unlock()
	}()
	if err := s.send(ctx, typ, frame); err != nil {
		return reply{}, err
	}
	select {
	case r := <-ch:
		return r, nil
	case <-s.ctx.Done():
		select {
		case r := <-ch:
			return r, nil
		default:
		}
		return reply{}, s.endedErr()
	case <-ctx.Done():
		return reply{}, ctx.Err()
	}
}

// send hands a frame to the writer and waits until it is written.
func (s *session) send(ctx context.Context, typ string, frame any) error {
	data, err := json.Marshal(frame)
	if err != nil {
		return fmt.Errorf("client: encoding %s: %w", typ, err)
	}
	if s.c.isFrozen() {
		return ErrFrozen
	}
	f := outFrame{typ: typ, data: data, done: make(chan error, 1)}
	select {
	case s.out <- f:
	case <-s.ctx.Done():
		return s.endedErr()
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-f.done:
		return err
	case <-s.ctx.Done():
		select {
		case err := <-f.done:
			return err
		default:
		}
		return s.endedErr()
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *session) endedErr() error {
	if s.c.ctx.Err() != nil {
		return ErrClosed
	}
	return ErrDisconnected
}

// heartbeatInterval is the interval in force, 0 when heartbeats are off.
func (s *session) heartbeatInterval() time.Duration {
	o := &s.c.opts
	switch {
	case o.DisableHeartbeats:
		return 0
	case o.HeartbeatInterval > 0:
		return o.HeartbeatInterval
	case s.welcome.HeartbeatIntervalMS > 0:
		return time.Duration(s.welcome.HeartbeatIntervalMS) * time.Millisecond
	}
	return 10 * time.Second
}

func (s *session) writeLoop() {
	defer s.wg.Done()
	interval := s.heartbeatInterval()
	var tick <-chan time.Time
	var timer *time.Timer
	if interval > 0 {
		timer = time.NewTimer(heartbeatGap(interval))
		defer timer.Stop()
		tick = timer.C
	}
	// A heartbeat asks for an ack (carries an id) only when the server has
	// been quiet for half the ttl: an ack is a liveness probe, and writing
	// one per heartbeat was a third of the server's CPU per heartbeat. A
	// connection that hears nothing for the ttl plus one interval after a
	// probe is dead (a half-open TCP connection is not left hanging).
	ttl := time.Duration(s.welcome.TTLMS) * time.Millisecond
	if ttl <= 0 {
		ttl = interval * 5 / 2
	}
	silence := ttl + interval
	var beat uint64
	var unanswered time.Time // first probe sent since the latest frame read

	// A new connection starts online; re-assert an idle device.
	if s.c.wantedStatus() == protocol.StateAway {
		data, _ := json.Marshal(protocol.Status{Type: protocol.TypeStatus, State: protocol.StateAway})
		if err := s.write(protocol.TypeStatus, data); err != nil && !errors.Is(err, ErrFrozen) {
			s.fail(err)
			return
		}
	}
	for {
		select {
		case <-s.ctx.Done():
			return
		case f := <-s.out:
			err := s.write(f.typ, f.data)
			f.done <- err
			if err != nil && !errors.Is(err, ErrFrozen) {
				s.fail(err)
				return
			}
		case <-tick:
			if !s.c.isFrozen() {
				if !unanswered.IsZero() && s.lastRecv.Load() >= s.mono(unanswered) {
					unanswered = time.Time{}
				}
				if !unanswered.IsZero() && time.Since(unanswered) > silence {
					s.fail(ErrServerSilent)
					return
				}
				hb := protocol.Heartbeat{Type: protocol.TypeHeartbeat}
				if now := time.Now(); s.mono(now)-s.lastRecv.Load() >= int64(ttl/2) {
					if unanswered.IsZero() {
						unanswered = now
					}
					beat++
					hb.ID = json.RawMessage(strconv.FormatUint(beat, 10))
				}
				data, _ := json.Marshal(hb)
				if err := s.write(protocol.TypeHeartbeat, data); err != nil && !errors.Is(err, ErrFrozen) {
					s.fail(err)
					return
				}
			}
			timer.Reset(heartbeatGap(interval))
		}
	}
}

// write writes one frame, unless the client is frozen. A write that takes
// longer than WriteTimeout ends the session with ErrWriteTimeout as its
// cause, set before the connection closes: a deadline on the write's
// context would have the library close it first, and the reader's "use of
// closed network connection" would stand as the cause instead.
func (s *session) write(typ string, data []byte) error {
	if s.c.isFrozen() {
		return ErrFrozen
	}
	t := time.AfterFunc(s.c.opts.WriteTimeout, func() {
		s.fail(fmt.Errorf("client: writing %s: %w after %v", typ, ErrWriteTimeout, s.c.opts.WriteTimeout))
	})
	err := s.conn.Write(s.ctx, websocket.MessageText, data)
	t.Stop()
	if err != nil {
		if cause := context.Cause(s.ctx); errors.Is(cause, ErrWriteTimeout) {
			return cause
		}
		return fmt.Errorf("client: writing %s: %w", typ, err)
	}
	if h := s.c.opts.hooks.onSend; h != nil {
		h(typ, time.Now())
	}
	return nil
}

// fail ends the session with cause; the reader's read is interrupted.
func (s *session) fail(cause error) {
	s.cancel(cause)
	_ = s.conn.CloseNow()
}
