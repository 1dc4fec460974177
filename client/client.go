package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/protocol"
)

// ConnState is the state of the client's connection.
type ConnState int32

const (
	// Connecting: a connect attempt is under way (handshake, welcome, snapshot).
	Connecting ConnState = iota
	// Connected: welcome and snapshot were received; the map is live.
	Connected
	// Disconnected: the connection dropped (or an attempt failed, or the
	// client is frozen); the client waits before the next attempt.
	Disconnected
	// Closed: Close was called; nothing runs any more.
	Closed
)

// StateChange reports a change of the connection state to
// Options.OnStateChange.
type StateChange struct {
	State ConnState
	// When State is Disconnected: why (the connection's end or the failed
	// attempt), the server's close code if it sent one (else 0), the wait
	// before the next attempt, and the backoff attempt count, which a
	// connection that stayed up 10s resets. Enough for a "reconnecting in
	// 4s" banner.
	Err       error
	CloseCode int
	Retry     time.Duration
	Attempt   int
}

func (s ConnState) String() string {
	switch s {
	case Connecting:
		return "connecting"
	case Connected:
		return "connected"
	case Disconnected:
		return "disconnected"
	case Closed:
		return "closed"
	}
	return "ConnState(" + strconv.Itoa(int(s)) + ")"
}

// Client is a connection to a greendot server that survives disconnects and
// keeps a local map of the presence of every user the viewer can see. Its
// methods are safe for concurrent use.
type Client struct {
	opts Options
	url  string

	ctx     context.Context // cancelled by Close; parent of background connects
	cancel  context.CancelFunc
	wg      sync.WaitGroup // the supervisor (run) and the changes forwarder
	closing atomic.Bool

	state atomic.Int32  // a ConnState
	seq   atomic.Uint64 // request ids

	presMu sync.RWMutex
	pres   *presenceMap // guarded by presMu

	changes *changeQueue

	mu      sync.Mutex
	sess    *session         // guarded by mu: the live connection, nil between connections
	ready   chan struct{}    // guarded by mu: closed once sess is set, replaced when it is cleared
	welcome protocol.Welcome // guarded by mu: of the latest connection
	status  string           // guarded by mu: the device status asked for, re-sent on reconnect
	frozen  bool             // guarded by mu
	// myStatus is the user's status from the last my_status; guarded by mu.
	myStatus UserStatus
	thawed   chan struct{} // guarded by mu: closed while not frozen
	// watched: the users watched (watch.go), watched again on every new
	// connection; teamCounts: the last counts of each large team. Guarded by mu.
	watched    map[string]struct{}
	teamCounts map[string]TeamCount
}

// Dial connects to a greendot server, such as ws://127.0.0.1:8080/v1/connect,
// and returns once the welcome and the snapshot have arrived, or with the
// error of that first attempt (it is not retried: a wrong address or a
// refused token fails fast). ctx and Options.DialTimeout bound this first
// attempt only.
//
// From then on the Client reconnects by itself whenever the connection ends,
// until Close.
func Dial(ctx context.Context, url string, opts Options) (*Client, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	u, err := opts.connectURL(url)
	if err != nil {
		return nil, err
	}
	c := &Client{
		opts:    opts,
		url:     u,
		pres:    newPresenceMap(),
		changes: newChangeQueue(changesCapacity(opts)),
		ready:   make(chan struct{}),
		status:  protocol.StateOnline,
		thawed:  make(chan struct{}),
	}
	close(c.thawed)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.state.Store(-1)
	c.setState(StateChange{State: Connecting})
	ctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	s, err := c.connect(ctx)
	if err != nil {
		c.cancel()
		c.setState(StateChange{State: Closed, Err: err})
		return nil, err
	}
	c.wg.Add(1)
	if opts.DisableChanges {
		// Nothing is ever queued: out only has to close with the client.
		context.AfterFunc(c.ctx, func() { close(c.changes.out) })
	} else {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.changes.run(c.ctx.Done())
		}()
	}
	go c.run(s)
	return c, nil
}

// changesCapacity is the Changes channel's buffer: none when it is never fed
// (a load generator's thousands of clients would hold 256 empty slots each).
func changesCapacity(o Options) int {
	if o.DisableChanges {
		return 0
	}
	return o.ChangesBuffer
}

// Close ends the connection (with a close handshake unless frozen), stops
// every goroutine of the client and waits for them. It is idempotent; it
// must not be called from OnChange or OnStateChange.
func (c *Client) Close() error {
	if c.closing.CompareAndSwap(false, true) {
		c.cancel()
	}
	c.wg.Wait()
	c.setState(StateChange{State: Closed})
	return nil
}

// State returns the connection state.
func (c *Client) State() ConnState { return ConnState(c.state.Load()) }

func (c *Client) setState(sc StateChange) {
	if old := ConnState(c.state.Swap(int32(sc.State))); old != sc.State && c.opts.OnStateChange != nil {
		c.opts.OnStateChange(sc)
	}
}

// Welcome returns the welcome frame of the latest connection: its
// connection id, the user id the server sees, the heartbeat interval and ttl.
func (c *Client) Welcome() protocol.Welcome {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.welcome
}

// Get returns what the client holds about a user. ok is false if it holds
// nothing, which for a user the viewer can see means offline (a snapshot
// lists only users who are not). The viewer is never in the map.
//
// After a user leaves the viewer's teams nothing more is sent about them, so
// their last state stays until the next reconnect's snapshot.
func (c *Client) Get(userID string) (s State, ok bool) {
	c.presMu.RLock()
	defer c.presMu.RUnlock()
	return c.pres.get(userID)
}

// All returns every user held who is online or away, sorted by user id.
func (c *Client) All() []State {
	c.presMu.RLock()
	defer c.presMu.RUnlock()
	return c.pres.all()
}

// Changes returns the channel of applied changes (the same ones OnChange
// sees), closed after Close. Reading it is optional.
//
// The client never waits for its reader. The channel holds ChangesBuffer
// changes; while it is full, later changes wait outside it, one per user:
// a newer change for a user replaces the one still waiting (presence is
// state, not a log), so a slow reader sees every user's latest state, in
// order per user, but not every intermediate one. ChangesCoalesced counts
// the replaced ones.
func (c *Client) Changes() <-chan Change { return c.changes.out }

// ChangesCoalesced returns how many changes were replaced by a newer one for
// the same user before the Changes reader took them.
func (c *Client) ChangesCoalesced() uint64 { return c.changes.coalescedCount() }

func (c *Client) emit(changes []Change) {
	if len(changes) == 0 {
		return
	}
	if c.opts.OnChange != nil {
		for _, ch := range changes {
			c.opts.OnChange(ch)
		}
	}
	if !c.opts.DisableChanges {
		c.changes.push(changes)
	}
}

// Freeze stops (on=true) or resumes (on=false) all sending, for expiry
// tests: while frozen the client writes nothing on the socket, not even a
// pong to a WebSocket ping, yet keeps the TCP connection open and reads, so
// the server sees a hung client. Calls that would send return ErrFrozen. If
// the server ends the connection meanwhile, the client does not reconnect
// until it is resumed.
func (c *Client) Freeze(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case on && !c.frozen:
		c.frozen = true
		c.thawed = make(chan struct{})
	case !on && c.frozen:
		c.frozen = false
		close(c.thawed)
	}
}

func (c *Client) isFrozen() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frozen
}

// SetStatus marks this device active ("online") or idle ("away"). The
// client remembers it and sends "away" again after every reconnect. If
// connected, SetStatus returns once the frame is written; if not, it returns
// nil and the status goes out with the next connection.
func (c *Client) SetStatus(ctx context.Context, state string) error {
	if state != protocol.StateOnline && state != protocol.StateAway {
		return fmt.Errorf("client: status must be %q or %q", protocol.StateOnline, protocol.StateAway)
	}
	c.mu.Lock()
	if c.frozen {
		c.mu.Unlock()
		return ErrFrozen
	}
	c.status = state
	s := c.sess
	c.mu.Unlock()
	if c.ctx.Err() != nil {
		return ErrClosed
	}
	if s == nil {
		return nil
	}
	err := s.send(ctx, protocol.TypeStatus, protocol.Status{Type: protocol.TypeStatus, State: state})
	if errors.Is(err, ErrDisconnected) {
		return nil // recorded: the next connection carries it
	}
	return err
}

func (c *Client) wantedStatus() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

// Query asks the server for the full presence of up to protocol.MaxQueryIDs
// users, one answer per id in order, waiting for a connection if there is
// none; if the connection drops before the answer, it asks again on the
// next one, until ctx ends. Users who share no team with the viewer come
// back with State "unknown" and nothing else; the viewer may ask about
// themselves.
func (c *Client) Query(ctx context.Context, userIDs []string) ([]UserPresence, error) {
	if len(userIDs) == 0 {
		return nil, nil
	}
	if len(userIDs) > protocol.MaxQueryIDs {
		return nil, fmt.Errorf("client: a query takes at most %d user ids", protocol.MaxQueryIDs)
	}
	for _, id := range userIDs {
		if !protocol.ValidID(id) {
			return nil, fmt.Errorf("client: invalid user id %q", id)
		}
	}
	id := c.nextID("q")
	frame := protocol.Query{Type: protocol.TypeQuery, ID: id.raw, UserIDs: userIDs}
	for {
		s, err := c.awaitSession(ctx)
		if err != nil {
			return nil, err
		}
		r, err := s.request(ctx, id, protocol.TypeQuery, frame)
		if errors.Is(err, ErrDisconnected) {
			continue // asked again on the next connection
		}
		if err != nil {
			return nil, err
		}
		out := make([]UserPresence, len(r.users))
		for i, u := range r.users {
			out[i] = userPresence(u)
		}
		return out, nil
	}
}

// Ping sends a heartbeat carrying an id and returns the time until its ack
// arrived (measured from the call to the ack's receipt), waiting for a
// connection if there is none. It works whether automatic heartbeats are on
// or not. If the connection drops first it returns ErrDisconnected.
func (c *Client) Ping(ctx context.Context) (time.Duration, error) {
	s, err := c.awaitSession(ctx)
	if err != nil {
		return 0, err
	}
	id := c.nextID("p")
	start := time.Now()
	r, err := s.request(ctx, id, protocol.TypeHeartbeat, protocol.Heartbeat{Type: protocol.TypeHeartbeat, ID: id.raw})
	if err != nil {
		return 0, err
	}
	return r.at.Sub(start), nil
}

type requestID struct {
	key string          // as matched against replies
	raw json.RawMessage // as sent
}

func (c *Client) nextID(prefix string) requestID {
	key := prefix + strconv.FormatUint(c.seq.Add(1), 10)
	return requestID{key: key, raw: json.RawMessage(strconv.Quote(key))}
}

// awaitSession returns the live connection, waiting for one until ctx ends.
func (c *Client) awaitSession(ctx context.Context) (*session, error) {
	for {
		c.mu.Lock()
		s, ready, frozen := c.sess, c.ready, c.frozen
		c.mu.Unlock()
		if c.ctx.Err() != nil {
			return nil, ErrClosed
		}
		if frozen {
			return nil, ErrFrozen
		}
		if s != nil {
			return s, nil
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.ctx.Done():
			return nil, ErrClosed
		}
	}
}

func (c *Client) setSession(s *session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sess = s
	c.welcome = s.welcome
	close(c.ready)
}

func (c *Client) clearSession(s *session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess == s {
		c.sess = nil
		c.ready = make(chan struct{})
	}
}

// run is the supervisor: it owns the live session, and when it ends, waits
// and reconnects, until Close. It is the only goroutine that connects after
// Dial.
func (c *Client) run(s *session) {
	defer c.wg.Done()
	attempt := 0
	for {
		end := c.await(s)
		c.clearSession(s)
		if c.ctx.Err() != nil {
			return
		}
		next := c.afterSession(end, &attempt)
		for {
			c.setState(next)
			c.opts.Logger.Info("greendot: disconnected", "err", next.Err, "close_code", next.CloseCode,
				"retry_in", next.Retry, "attempt", next.Attempt)
			if !c.sleep(next.Retry) || !c.waitThawed() {
				return
			}
			c.setState(StateChange{State: Connecting, Attempt: attempt})
			ctx, cancel := context.WithTimeout(c.ctx, c.opts.DialTimeout)
			var err error
			s, err = c.connect(ctx)
			cancel()
			if err == nil {
				// On the supervisor: the session's end waits for it, and
				// it stops when the session ends.
				c.rewatch(s)
				break
			}
			if c.ctx.Err() != nil {
				return
			}
			next = StateChange{State: Disconnected, Err: err, Retry: c.retryDelay(err, &attempt), Attempt: attempt}
		}
	}
}

// Reconnect timing, as in the JavaScript client.
const (
	stableAfter   = 10 * time.Second       // a connection this old resets the backoff
	restartJitter = time.Second            // spread after a 1012 that gave no advice
	refreshJitter = 250 * time.Millisecond // spread after a 4001, at most
)

// sessionEnd says how a session ended.
type sessionEnd struct {
	cause       error
	lived       time.Duration
	reconnectAt time.Time // when the server advised coming back; zero if it did not
}

// await waits for s to end, or ends it when the client closes.
func (c *Client) await(s *session) sessionEnd {
	select {
	case <-s.ctx.Done():
	case <-c.ctx.Done():
		if c.isFrozen() {
			_ = s.conn.CloseNow()
		} else {
			_ = s.conn.Close(websocket.StatusNormalClosure, "")
		}
		s.cancel(ErrClosed)
	}
	s.wg.Wait()
	_ = s.conn.CloseNow()
	cause := context.Cause(s.ctx)
	if c.opts.hooks.onSessionEnd != nil {
		c.opts.hooks.onSessionEnd(cause)
	}
	return sessionEnd{cause: cause, lived: time.Since(s.opened), reconnectAt: s.stop()}
}

// afterSession picks the wait before reconnecting after a connection ended.
func (c *Client) afterSession(end sessionEnd, attempt *int) StateChange {
	code := max(int(websocket.CloseStatus(end.cause)), 0)
	var delay time.Duration
	switch {
	case !end.reconnectAt.IsZero():
		// A draining node said when to come back.
		*attempt = 0
		delay = min(max(time.Until(end.reconnectAt), 0), c.opts.ReconnectMax)
	case code == protocol.CloseServiceRestart:
		*attempt = 0
		delay = rand.N(restartJitter)
	case code == protocol.CloseTokenExpired:
		// Not a failure: the next connect fetches a fresh token.
		*attempt = 0
		delay = rand.N(min(c.opts.ReconnectBase, refreshJitter))
	case code == protocol.ClosePolicy:
		// The server took us for a flood: back off, never reset.
		delay = max(4*c.opts.ReconnectBase, c.backoff(attempt))
	default:
		if end.lived >= stableAfter {
			*attempt = 0
		}
		delay = c.backoff(attempt)
	}
	return StateChange{State: Disconnected, Err: end.cause, CloseCode: code, Retry: delay, Attempt: *attempt}
}

// retryDelay is the backoff after a failed connect, but no sooner than the
// server's Retry-After (plus up to as much again, so that the refused do not
// all come back together), within ReconnectMax.
func (c *Client) retryDelay(err error, attempt *int) time.Duration {
	d := c.backoff(attempt)
	var ra *retryAfterError
	if errors.As(err, &ra) {
		d = max(d, ra.after+rand.N(ra.after))
	}
	return min(d, c.opts.ReconnectMax)
}

// backoff returns the delay for attempt and counts it.
func (c *Client) backoff(attempt *int) time.Duration {
	d := backoffDelay(c.opts.ReconnectBase, c.opts.ReconnectMax, *attempt)
	*attempt++
	return d
}

// sleep waits d, or returns false if the client closes first.
func (c *Client) sleep(d time.Duration) bool {
	if d <= 0 {
		return c.ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.ctx.Done():
		return false
	}
}

// waitThawed waits while the client is frozen, or returns false if it closes.
func (c *Client) waitThawed() bool {
	c.mu.Lock()
	thawed := c.thawed
	c.mu.Unlock()
	select {
	case <-thawed:
		return c.ctx.Err() == nil
	case <-c.ctx.Done():
		return false
	}
}
