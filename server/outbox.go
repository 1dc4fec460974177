package server

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lesismal/nbio"
	"github.com/lesismal/nbio/nbhttp"
	"github.com/lesismal/nbio/nbhttp/websocket"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
)

// client is one WebSocket connection.
//
// Its outbox keeps at most one pending change per subject (presence is
// state, not a log: a newer change replaces a queued older one), so the
// memory a viewer can hold is bounded by the users it may see, and capped by
// MaxPending. The flusher writes pending changes in batches, and only into
// a socket that has taken everything written before (unsent is 0): while it
// has not, the connection is stalled, its changes wait in pending, coalesced,
// and nbio holds at most the rest of one frame. A reader stalled for
// SlowReaderTimeout is closed with 1013. nbio never blocks a write, and
// closes a reader that lets MaxWriteBuffer pile up (replies, a snapshot).
// Fan-out therefore never waits for any reader.
type client struct {
	srv    *Server
	ws     *websocket.Conn
	id     string
	user   string
	device string

	lastFrame  atomic.Int64 // unix nanos of the last frame received
	registered atomic.Bool  // the store knows this connection
	closed     atomic.Bool
	closeFrame atomic.Bool // the close was clean: a close frame, either way
	away       atomic.Bool // the device said it is idle

	// Bytes handed to nbio that the socket has not taken yet: send adds a
	// message's frames, onWritten subtracts what nbio writes to the socket.
	unsent atomic.Int64
	// backlogSince: unix nanos since unsent has not been 0 (0: it is). A
	// backlog older than SlowReaderTimeout closes the connection.
	backlogSince atomic.Int64
	// stalled: the flusher held changes back because unsent was not 0; the
	// connection stays on the dirty list (queued) and onWritten lists it
	// again once the socket has drained. Whoever clears it does that.
	stalled atomic.Bool
	// noted: its snapshot is recorded in views (a shared store), which
	// until then know nothing of what it holds: every change reaches it.
	noted atomic.Bool

	timerMu    sync.Mutex  // never held while writing
	stuckTimer *time.Timer // checkStuck; nil until the first backlog

	// Only the frame handler touches these; nbio calls it serially.
	tokens    float64
	refilled  int64 // unix nanos: 8 bytes where a time.Time takes 24
	limited   int32 // frames refused in a row by the rate limit
	badStreak int32

	// Fields are ordered so that the struct fits a smaller size class: a
	// node holds one per connection.
	ended       bool   // markClosed ran: arm no timer; guarded by timerMu
	welcomed    bool   // welcome sent: a reconnect frame may follow; the rest by mu
	ready       bool   // snapshot sent: changes may be written
	queued      bool   // on the hub's dirty list
	hiddenAll   bool   // see hidden
	statusKnown bool   // see statusVersion
	recentLive  uint16 // recent's entries not spent (at most maxRecent); by mu

	mu      sync.Mutex
	pending map[string]protocol.Change // by subject; nil when empty
	order   []string                   // subjects in arrival order
	bulk    int                        // pending entries queued by bulk pushes: exempt from MaxPending
	// Subjects this connection could see and no longer can, since a team
	// removal: its client may still hold their old state, so a re-join must
	// tell it even an offline, at a version above the one it may hold (the
	// value; 0 unknown). Past maxHidden, hiddenAll stands for them all.
	hidden map[string]uint64
	// Subjects this connection was told at a version above the store's (a
	// catch-up after a data loss): the teams' views hold the store's
	// version, so a later removal must remember this one (the value).
	// At most maxHidden.
	raised map[string]uint64
	// The snapshot's recent entries (versions from the last recentWindow,
	// with a shared store's time-based versions), until recentUntil: a
	// change read in the snapshot may still be in flight on the team
	// channels, and must not be sent again. Sorted by subject hash.
	recent      []recentEntry
	recentUntil int64       // unix nanos
	expiry      *time.Timer // token expiry; nil without exp
	// statusVersion is the version of the newest my_status this connection
	// was given, or before welcome is to be given (earlyStatus); meaningful
	// once statusKnown. After welcome only the version is kept.
	statusVersion uint64
	earlyStatus   *protocol.MyStatus
	// px: a Pusher socket (pusher.go), or its user's connection; it gets no
	// native frames.
	px *pxConn
}

// allow applies the token-bucket rate limit to something that costs cost
// tokens: a frame or a WebSocket ping costs 1, a query 1 more per 10 ids.
func (c *client) allow(now time.Time, cost int) bool {
	cfg := &c.srv.cfg
	// Wall-clock nanoseconds: a clock stepped back refills nothing for
	// one call, then counts from the new time.
	if d := now.UnixNano() - c.refilled; d > 0 {
		c.tokens += time.Duration(d).Seconds() * cfg.RateLimit
	}
	if c.tokens > float64(cfg.RateBurst) {
		c.tokens = float64(cfg.RateBurst)
	}
	c.refilled = now.UnixNano()
	if c.tokens >= float64(cost) {
		c.tokens -= float64(cost)
		c.limited = 0
		return true
	}
	c.refuse()
	return false
}

// refuse counts a frame refused by the rate limit in the current run of
// them: the run's first gets an error, one past 2 × RateBurst closes.
func (c *client) refuse() {
	cfg := &c.srv.cfg
	c.limited++
	c.srv.metrics.framesRejected.WithLabelValues(reasonRateLimited).Inc()
	switch {
	case int(c.limited) > 2*cfg.RateBurst:
		c.closeWith(protocol.ClosePolicy, "rate limit exceeded")
	case c.limited == 1:
		c.writeJSON(protocol.Error{Type: protocol.TypeError, Code: protocol.CodeRateLimited,
			Message: "too many frames; slow down or be disconnected"})
	}
}

// push queues a change for this connection without blocking. A bulk push
// (catching a viewer up after a team join or an outage) may queue past
// MaxPending: it is the server's doing, not a sign of a slow reader. It
// reports whether the change was queued (not dropped as stale).
func (c *client) push(ch protocol.Change, bulk bool) bool { return c.queue(ch, bulk, true) }

// queue is push; with wake false it leaves waking the flusher to the caller.
func (c *client) queue(ch protocol.Change, bulk, wake bool) bool {
	if c.px != nil {
		c.px.watchChange(ch)
		return true
	}
	m := c.srv.metrics
	c.mu.Lock()
	if c.recent != nil && c.inSnapshotLocked(ch) {
		c.mu.Unlock()
		m.dropped.WithLabelValues(reasonStale).Inc()
		return false
	}
	if held, ok := c.hidden[ch.UserID]; ok {
		// Visible again: the client holds the subject at held, so a change
		// not newer is no news (a late copy of one from before the removal).
		if ch.Version <= held {
			c.mu.Unlock()
			m.dropped.WithLabelValues(reasonStale).Inc()
			return false
		}
		delete(c.hidden, ch.UserID)
	}
	if held, ok := c.raised[ch.UserID]; ok {
		if ch.Version <= held {
			c.mu.Unlock()
			m.dropped.WithLabelValues(reasonStale).Inc()
			return false
		}
		delete(c.raised, ch.UserID) // the store's versions are past it
	}
	if c.pending == nil {
		c.pending = make(map[string]protocol.Change)
	}
	if old, ok := c.pending[ch.UserID]; ok {
		if old.Version >= ch.Version {
			c.mu.Unlock()
			m.dropped.WithLabelValues(reasonStale).Inc()
			return false
		}
		m.coalesced.Inc()
		if c.stalled.Load() {
			m.slowCoalesced.Inc()
		}
	} else {
		c.order = append(c.order, ch.UserID)
		if bulk {
			c.bulk++
		}
	}
	c.pending[ch.UserID] = ch
	pending := len(c.pending)
	slow := !bulk && pending > c.srv.cfg.MaxPending+c.bulk
	schedule := c.ready && !c.queued && !slow
	if schedule {
		c.queued = true
	}
	c.mu.Unlock()
	if slow {
		m.slowDisconnects.Inc()
		m.dropped.WithLabelValues(reasonSlow).Add(float64(pending))
		c.closeWith(protocol.CloseTryAgainLater, "slow consumer")
		return false
	}
	if schedule {
		c.srv.hub.flush.markDirty(c, wake)
	}
	return true
}

// maxHidden bounds a connection's hidden set; beyond it, a re-join sends
// offlines the client may already hold (harmless) rather than miss one.
const maxHidden = 4096

// hide is for a subject this connection can no longer see, after a team
// removal: it drops the subject's pending change, and remembers that the
// client may hold a state of theirs that nothing will update.
func (c *client) hide(subject string, held uint64) (dropped bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, dropped = c.pending[subject]
	if !c.hiddenAll {
		if len(c.hidden) >= maxHidden {
			c.hidden, c.hiddenAll = nil, true
		} else {
			if c.hidden == nil {
				c.hidden = make(map[string]uint64)
			}
			c.hidden[subject] = max(c.hidden[subject], held, c.raised[subject])
		}
	}
	delete(c.raised, subject)
	c.dropLocked(subject)
	return dropped
}

// unhide is for a subject visible again: it reports whether the client may
// hold a stale state of theirs, which an offline must then correct, and the
// version it may hold (0: unknown).
func (c *client) unhide(subject string) (bool, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hiddenAll {
		return true, 0
	}
	held, ok := c.hidden[subject]
	if !ok {
		return false, 0
	}
	delete(c.hidden, subject)
	if len(c.hidden) == 0 {
		c.hidden = nil
	}
	return true, held
}

// catchUp is the change that tells a connection seeing subject again its
// state p: newer than the version it may hold from before, even if the
// store lost that version with its data (and reads the user as never seen,
// version 0). Later versions of the store are its clock, far above.
//
// At held itself the client already holds p: nothing is sent (ok false).
// Below it, p (a fresh read) comes from a store that lost its data. No
// other path raises a version: a late copy of an old change would win.
func catchUp(p presence.Presence, held uint64, now time.Time) (protocol.Change, bool) {
	v := p.Version
	switch {
	case held != 0 && v == held:
		return protocol.Change{}, false
	case v < held:
		v = held + 1
	}
	return changeOf(p, v, now), true
}

// pushCatchUp queues catchUp(p, held, now) and reports what it queued. A
// version raised above the store's is remembered: the views hold the
// store's, and a removal would otherwise hide the subject at that one, so
// a later catch-up would send it again, below what the client holds.
func (c *client) pushCatchUp(p presence.Presence, held uint64, now time.Time) (protocol.Change, bool) {
	ch, ok := catchUp(p, held, now)
	if !ok || !c.push(ch, true) {
		return ch, false
	}
	c.noteRaised(ch, p.Version)
	return ch, true
}

// noteRaised remembers ch, sent to this connection, when its version is
// above read, the store's.
func (c *client) noteRaised(ch protocol.Change, read uint64) {
	if ch.Version <= read || c.px != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.raised == nil {
		c.raised = make(map[string]uint64)
	}
	if _, ok := c.raised[ch.UserID]; ok || len(c.raised) < maxHidden {
		c.raised[ch.UserID] = max(c.raised[ch.UserID], ch.Version)
	}
}

func (c *client) dropLocked(subject string) {
	if _, ok := c.pending[subject]; !ok {
		return
	}
	delete(c.pending, subject)
	if len(c.pending) == 0 {
		c.pending, c.order, c.bulk = nil, nil, 0
		return
	}
	for i, s := range c.order {
		if s == subject {
			c.order = append(c.order[:i], c.order[i+1:]...)
			break
		}
	}
}

// queuedHolds is what c has queued, by subject (nil if nothing): the changes a
// snapshot sent now would fold in.
func (c *client) queuedHolds() map[string]held {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 {
		return nil
	}
	out := make(map[string]held, len(c.pending))
	for s, ch := range c.pending {
		out[s] = held{version: ch.Version, look: lookOf(ch)}
	}
	return out
}

// lookOf is what ch shows a viewer.
func lookOf(ch protocol.Change) presence.Look {
	st, _ := presence.ParseState(ch.State)
	return presence.Look{State: st, Text: ch.Text, Emoji: ch.Emoji, ExpiresAt: ch.ExpiresAt, LastSeen: ch.LastSeen}
}

// sendSnapshot writes the snapshot, with the changes queued while it was
// read folded in: a snapshot is a whole map that a client puts in place of
// its own, so a subject it left out but a queued change then brought (such
// as a team joined during the connect) would flicker offline in between.
func (c *client) sendSnapshot(users []presence.Presence) {
	c.mu.Lock()
	frame := foldSnapshot(users, c.pending, c.order)
	// Changes that raced the snapshot can fill a map of a whole team; an
	// empty one still holds its buckets.
	c.pending, c.order, c.bulk = nil, nil, 0
	c.noteRecentLocked(users, frame)
	// Written under mu so no flush can overtake it.
	if c.px == nil {
		c.writeLocked(protocol.AppendSnapshot(make([]byte, 0, protocol.SnapshotSize(frame)), frame))
	}
	c.ready = true
	c.mu.Unlock()
}

// foldSnapshot is the snapshot frame of users as read, updated by the
// pending changes (newer versions win; subjects only they name are added, in
// their order). Offline users are left out.
func foldSnapshot(users []presence.Presence, pending map[string]protocol.Change, order []string) protocol.Snapshot {
	frame := protocol.Snapshot{Type: protocol.TypeSnapshot, Users: make([]protocol.UserState, 0, len(users)+len(order))}
	for _, p := range users {
		st := userState(p)
		if q, ok := pending[p.UserID]; ok && q.Version > p.Version {
			st = stateOfChange(q)
		}
		if st.State != protocol.StateOffline {
			frame.Users = append(frame.Users, st)
		}
	}
	if len(order) == 0 {
		return frame
	}
	folded := make(map[string]struct{}, len(users))
	for _, p := range users {
		folded[p.UserID] = struct{}{}
	}
	for _, s := range order {
		q, ok := pending[s]
		if _, done := folded[s]; done || !ok || q.State == protocol.StateOffline {
			continue
		}
		frame.Users = append(frame.Users, stateOfChange(q))
	}
	return frame
}

// stateOfChange is a snapshot entry of a change folded in.
func stateOfChange(q protocol.Change) protocol.UserState {
	return protocol.UserState{UserID: q.UserID, State: q.State, Version: q.Version,
		Text: q.Text, Emoji: q.Emoji, ExpiresAt: q.ExpiresAt, Since: q.Since}
}

// flush writes every pending change as one presence frame, unless the
// socket has not taken the earlier frames yet: then they wait, coalesced,
// until onWritten lists c again. enc caches the encoding of single-change
// frames for one flush round: one change fanned out to a thousand viewers
// is encoded once.
func (c *client) flush(enc *frameCache) {
	c.mu.Lock()
	if len(c.pending) == 0 || c.closed.Load() {
		c.queued = false
		c.mu.Unlock()
		return
	}
	if c.stallLocked() {
		c.mu.Unlock() // still queued: queue schedules nothing meanwhile
		return
	}
	c.queued = false
	var b []byte
	n := len(c.pending)
	if n == 1 {
		for _, ch := range c.pending {
			b = enc.single(ch)
		}
	} else {
		frame := protocol.Presence{Type: protocol.TypePresence, Changes: make([]protocol.Change, 0, n)}
		for _, s := range c.order {
			if ch, ok := c.pending[s]; ok {
				frame.Changes = append(frame.Changes, ch)
			}
		}
		b = protocol.AppendPresence(make([]byte, 0, protocol.PresenceSize(frame)), frame)
	}
	// An idle connection keeps neither: the arrays of its busiest moment,
	// kept for reuse, were a fifth of the heap of 15,000 idle connections.
	c.pending = nil
	c.order = nil
	c.bulk = 0
	c.writeLocked(b)
	c.mu.Unlock()
	c.srv.metrics.deliveries.Add(float64(n))
}

// stallLocked reports whether the socket still holds bytes of earlier
// writes, and if so marks c stalled, for onWritten to list it again once
// they are written. The flag is set before the second look, so a drain in
// between is seen by one side or the other.
func (c *client) stallLocked() bool {
	if c.stalled.Load() {
		return true // listed again by onWritten only
	}
	if c.unsent.Load() <= 0 {
		return false
	}
	// Every setting of the flag counts up, every clearing down.
	c.stalled.Store(true)
	c.srv.metrics.slowConsumers.Inc()
	if c.unsent.Load() <= 0 && c.stalled.CompareAndSwap(true, false) {
		c.srv.metrics.slowConsumers.Dec()
		return false // drained meanwhile, and onWritten did not see the flag
	}
	return true // or onWritten has cleared it and listed c: the next round writes
}

// drained is onWritten's: the socket took every byte handed to nbio.
func (c *client) drained() {
	if c.backlogSince.Load() != 0 {
		c.backlogSince.Store(0)
		if c.unsent.Load() > 0 {
			c.noteBacklog() // a write came meanwhile, and found the old date
		}
	}
	if c.stalled.Load() && c.stalled.CompareAndSwap(true, false) {
		c.srv.metrics.slowConsumers.Dec()
		c.srv.hub.flush.markDirty(c, true)
	}
}

// noteBacklog is send's, after a write that left bytes unsent: it dates the
// backlog, if new, and arms checkStuck for when it is SlowReaderTimeout old.
// Dated before the second look, as in stallLocked.
func (c *client) noteBacklog() {
	d := c.srv.cfg.SlowReaderTimeout
	now := time.Now().UnixNano()
	if d <= 0 || !c.backlogSince.CompareAndSwap(0, now) {
		return
	}
	if c.unsent.Load() <= 0 {
		c.backlogSince.CompareAndSwap(now, 0) // drained meanwhile
		return
	}
	c.armStuck(d)
}

func (c *client) armStuck(d time.Duration) {
	c.timerMu.Lock()
	defer c.timerMu.Unlock()
	switch {
	case c.ended:
	case c.stuckTimer == nil:
		c.stuckTimer = time.AfterFunc(d, c.checkStuck)
	default:
		c.stuckTimer.Reset(d)
	}
}

// checkStuck closes the connection with 1013 if its socket has not drained
// for SlowReaderTimeout (the backlog dated by noteBacklog is that old), or
// re-arms itself for when the current backlog will be. After such
// a close it runs once more, when the close frame's time is up.
func (c *client) checkStuck() {
	if c.closed.Load() {
		closeWS(c.ws) // the close frame was not taken in time, or another close is under way
		return
	}
	since := c.backlogSince.Load()
	if since == 0 {
		return // drained; the next backlog arms the timer again
	}
	d := c.srv.cfg.SlowReaderTimeout
	if left := time.Duration(since + int64(d) - time.Now().UnixNano()); left > 0 {
		c.armStuck(left) // a later backlog than the one this was armed for
		return
	}
	c.closeStuck()
}

// closeStuck closes a connection whose socket did not drain for
// SlowReaderTimeout. The close frame waits behind what the reader has not
// taken: it gets as long again to take it, then the connection is closed.
func (c *client) closeStuck() {
	if c.closed.Swap(true) {
		return
	}
	m := c.srv.metrics
	m.slowTimeouts.Inc()
	m.slowDisconnects.Inc()
	c.mu.Lock()
	m.dropped.WithLabelValues(reasonSlow).Add(float64(len(c.pending)))
	c.pending, c.order, c.bulk = nil, nil, 0
	c.mu.Unlock()
	c.armStuck(c.srv.cfg.SlowReaderTimeout)
	_ = c.send(websocket.CloseMessage, closePayload(protocol.CloseTryAgainLater, "slow consumer"))
}

func closePayload(code int, reason string) []byte {
	b := make([]byte, 2+len(reason))
	binary.BigEndian.PutUint16(b, uint16(code))
	copy(b[2:], reason)
	return b
}

// send writes one message, its bytes counted in unsent until nbio reports
// them written to the socket (onWritten).
func (c *client) send(mt websocket.MessageType, b []byte) error {
	c.unsent.Add(wsFrameLen(len(b), c.maxFramePayload()))
	err := c.ws.WriteMessage(mt, b)
	if c.unsent.Load() > 0 {
		c.noteBacklog()
	}
	return err
}

func (c *client) maxFramePayload() int {
	if e := c.ws.Engine; e != nil && e.MaxWebsocketFramePayloadSize > 0 {
		return e.MaxWebsocketFramePayloadSize
	}
	return nbhttp.DefaultMaxWebsocketFramePayloadSize
}

// wsFrameLen is what nbio writes for a server message of n payload bytes:
// fragments of at most maxPayload bytes, each with an unmasked header.
func wsFrameLen(n, maxPayload int) int64 {
	if n == 0 {
		return 2
	}
	var total int64
	for n > 0 {
		k := min(n, maxPayload)
		switch {
		case k < 126:
			total += 2
		case k <= 65535:
			total += 4
		default:
			total += 10
		}
		total += int64(k)
		n -= k
	}
	return total
}

// frameCache holds the encoded single-change frames of one flush round.
type frameCache struct {
	m map[protocol.Change][]byte
}

func (f *frameCache) single(ch protocol.Change) []byte {
	if b, ok := f.m[ch]; ok {
		return b
	}
	frame := protocol.Presence{Type: protocol.TypePresence, Changes: []protocol.Change{ch}}
	b := protocol.AppendPresence(make([]byte, 0, protocol.PresenceSize(frame)), frame)
	if f.m == nil {
		f.m = make(map[protocol.Change][]byte)
	}
	f.m[ch] = b
	return b
}

func (c *client) writeJSON(v any) {
	c.mu.Lock()
	c.writeJSONLocked(v)
	c.mu.Unlock()
}

// writeJSONLocked writes one frame; c.mu orders frames of one connection.
func (c *client) writeJSONLocked(v any) {
	if c.closed.Load() || c.px != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		c.srv.log.Error("encode frame", "err", err)
		return
	}
	c.writeLocked(b)
}

// writeLocked writes one encoded frame.
func (c *client) writeLocked(b []byte) {
	if c.closed.Load() {
		return
	}
	if err := c.send(websocket.TextMessage, b); err != nil {
		if errors.Is(err, nbio.ErrOverflow) {
			// More than MaxWriteBuffer is waiting for this reader.
			c.srv.metrics.slowDisconnects.Inc()
		}
		c.closed.Store(true)
		closeWS(c.ws)
	}
}

// closeWith sends a close frame with code and closes the connection.
func (c *client) closeWith(code int, reason string) {
	if c.closed.Swap(true) {
		return
	}
	// Our close is no sign of life from the client: only its answering
	// close frame is (the close handler notes it).
	_ = c.send(websocket.CloseMessage, closePayload(code, reason))
	closeWS(c.ws)
}

func (c *client) markClosed() {
	c.closed.Store(true)
	c.timerMu.Lock()
	c.ended = true
	if c.stuckTimer != nil {
		c.stuckTimer.Stop()
	}
	c.timerMu.Unlock()
	c.mu.Lock()
	if c.expiry != nil {
		c.expiry.Stop()
	}
	if c.stalled.CompareAndSwap(true, false) {
		c.srv.metrics.slowConsumers.Dec()
	}
	c.pending = nil
	c.order = nil
	c.mu.Unlock()
}

// setExpiry closes the connection with 4001 when its token expires.
func (c *client) setExpiry(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return
	}
	c.expiry = time.AfterFunc(d, func() { c.closeWith(protocol.CloseTokenExpired, "token expired") })
}
