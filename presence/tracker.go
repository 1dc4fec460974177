package presence

import (
	"container/heap"
	"slices"
	"sort"
	"time"
)

type connEntry struct {
	Conn
	active   bool
	lastSeen stamp // reported, not a deadline: the wall clock will do
	deadline time.Time
}

// stamp is a time a user entry reports, kept as Unix nanoseconds (0 for
// the zero time): 8 bytes where a time.Time takes 24, in an entry per user
// held. Deadlines stay time.Time, for the monotonic clock.
type stamp int64

func stampOf(t time.Time) stamp {
	if t.IsZero() {
		return 0
	}
	return stamp(t.UnixNano())
}

func (s stamp) time() time.Time {
	if s == 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(s))
}

type userEntry struct {
	id      string
	conns   []*connEntry // few per user: a slice beats a map
	version uint64
	// status: nil while the status is the zero one, as most users' is: 8
	// bytes in the entry where a Status takes 64.
	status *Status
	// What viewers were last told (look), since when its state holds, and
	// the last seen told with an offline.
	look        Look
	since       stamp
	shownSeen   stamp
	actualSince stamp
	lastSeen    stamp // last sign of life of a connection that has ended
	// graceUntil: 0 unless the user has no connection and is in grace. The
	// grace heap's entry holds the deadline itself, with the monotonic
	// clock; this names the current one (Advance).
	graceUntil stamp
	forgetAt   time.Time // when to forget the user; meaningful while forgetIdx >= 0
	// real is the state the devices make, the grace applied: what viewers
	// would be told but for the status. The small fields last, together:
	// the entry fits a smaller size class, and a node holds one per user.
	real      State
	actual    State // real, dnd applied: the truth an API key reads
	forgetIdx int32 // index in Tracker.forgets; -1 unless offline and due to be forgotten
	expireIdx int32 // index in Tracker.expires; -1 unless the status has an expiry
}

// Tracker applies the presence rules. It is not safe for concurrent use.
type Tracker struct {
	cfg     Config
	conns   map[string]*connEntry
	users   map[string]*userEntry
	expiry  deadlines   // connection deadlines, lazily refreshed
	graces  deadlines   // grace ends
	expires statusQueue // users with a status that expires, by expiry
	forgets forgetQueue // offline users, by when to forget them
	present int         // users whose published state is not offline
	// floor is the highest version a forgotten user had. Every user's
	// versions start above it, so a user forgotten and seen again publishes
	// versions newer than any a viewer may still hold.
	floor uint64
}

// NewTracker returns an empty Tracker.
func NewTracker(cfg Config) *Tracker {
	return &Tracker{
		cfg:   cfg,
		conns: make(map[string]*connEntry),
		users: make(map[string]*userEntry),
	}
}

// Connect adds a live connection. A user without one becomes online; a user
// in grace has the grace cancelled, with a change only if the state differs.
func (t *Tracker) Connect(now time.Time, c Conn) (Outcome, error) {
	if _, ok := t.conns[c.ID]; ok {
		return Outcome{}, ErrDuplicateConn
	}
	ce := &connEntry{Conn: c, active: !c.Idle, lastSeen: stampOf(now), deadline: now.Add(t.cfg.TTL)}
	t.conns[c.ID] = ce
	t.expiry.push(deadline{at: ce.deadline, key: c.ID})
	u := t.user(c.UserID)
	if u.forgetIdx >= 0 {
		heap.Remove(&t.forgets, int(u.forgetIdx)) // back before being forgotten
	}
	var out Outcome
	if u.graceUntil != 0 {
		u.graceUntil = 0
		out.GraceCancelled = 1
	}
	u.conns = append(u.conns, ce)
	t.publishIfChanged(now, c.UserID, u, &out)
	return out, nil
}

// Heartbeat records a sign of life. It is O(1): the deadline heap is
// corrected lazily when the stale entry reaches its top.
func (t *Tracker) Heartbeat(now time.Time, connID string) error {
	ce, ok := t.conns[connID]
	if !ok {
		return ErrUnknownConn
	}
	ce.touch(now, t.cfg.TTL)
	return nil
}

// SetStatus marks a connection's device active or idle, which counts as a
// sign of life too.
func (t *Tracker) SetStatus(now time.Time, connID string, active bool) (Outcome, error) {
	ce, ok := t.conns[connID]
	if !ok {
		return Outcome{}, ErrUnknownConn
	}
	ce.touch(now, t.cfg.TTL)
	ce.active = active
	var out Outcome
	t.publishIfChanged(now, ce.UserID, t.users[ce.UserID], &out)
	return out, nil
}

// Disconnect ends a connection. If it was the user's last, the user enters
// the grace window and nothing is published yet.
func (t *Tracker) Disconnect(now time.Time, connID string, cause Cause) (Outcome, error) {
	ce, ok := t.conns[connID]
	if !ok {
		return Outcome{}, ErrUnknownConn
	}
	var out Outcome
	t.removeLocked(now, ce, cause, &out)
	return out, nil
}

// DisconnectNode ends every connection held by node, as when it died.
func (t *Tracker) DisconnectNode(now time.Time, node string) Outcome {
	var out Outcome
	var users userList
	for _, ce := range t.conns {
		if ce.Node == node {
			t.detachLocked(now, ce, Lost, &out)
			users.add(ce.UserID)
		}
	}
	for _, u := range users.order {
		t.settleLocked(now, u, &out)
	}
	return out
}

// Advance expires connections whose deadline has passed, ends graces that
// are over and forgets users offline for ForgetAfter. Each expired, ended or
// forgotten entry costs O(log n); nothing scans.
func (t *Tracker) Advance(now time.Time) Outcome {
	var out Outcome
	var expired userList // users whose connections expired, settled once
	for t.expiry.Len() > 0 && !t.expiry.peek().at.After(now) {
		d := t.expiry.pop()
		ce, ok := t.conns[d.key]
		if !ok {
			continue // ended already
		}
		if ce.deadline.After(now) {
			t.expiry.push(deadline{at: ce.deadline, key: d.key}) // heard from since
			continue
		}
		t.detachLocked(now, ce, Expired, &out)
		expired.add(ce.UserID)
	}
	for _, u := range expired.order {
		t.settleLocked(now, u, &out)
	}
	// Grace ends and status expiries in the order they fell due (a grace
	// end first on a tie), as the Redis store's sweep takes them: a user
	// whose grace and status both ended since the last sweep is published
	// as the clock went.
	for {
		graceDue := t.graces.Len() > 0 && !t.graces.peek().at.After(now)
		statusDue := t.expires.Len() > 0 && !t.expires[0].status.ExpiresAt.After(now)
		if !graceDue && !statusDue {
			break
		}
		if graceDue && (!statusDue || !t.graces.peek().at.After(t.expires[0].status.ExpiresAt)) {
			d := t.graces.pop()
			u, ok := t.users[d.key]
			if !ok || u.graceUntil != stampOf(d.at) || len(u.conns) > 0 {
				continue // cancelled, or re-entered grace since
			}
			u.graceUntil = 0
			n := len(out.Changes)
			t.publishIfChanged(now, d.key, u, &out)
			if len(out.Changes) > n {
				out.GraceLag = append(out.GraceLag, max(0, now.Sub(d.at)))
			}
			continue
		}
		u := t.expires[0]
		t.setStatusLocked(now, u, Status{}, &out) // takes u out of the queue
		out.StatusesExpired++
	}
	// Only users offline with no connection are queued (a connect removes
	// its user's entry), so whatever is due goes.
	for t.forgets.Len() > 0 && !t.forgets[0].forgetAt.After(now) {
		u := heap.Pop(&t.forgets).(*userEntry)
		if u.expireIdx >= 0 {
			heap.Remove(&t.expires, int(u.expireIdx))
		}
		delete(t.users, u.id)
		t.floor = max(t.floor, u.version)
		out.Forgotten++
	}
	return out
}

// NextPublish is the earliest grace end or status expiry, the deadlines
// that publish a change when due; zero when none is pending. (Connection
// expiries are lazily refreshed by heartbeats: waking for each would cost
// a wake per connection and ttl.)
func (t *Tracker) NextPublish() time.Time {
	var next time.Time
	if t.graces.Len() > 0 {
		next = t.graces.peek().at
	}
	if t.expires.Len() > 0 {
		if e := t.expires[0].status.ExpiresAt; next.IsZero() || e.Before(next) {
			next = e
		}
	}
	return next
}

// NextDeadline is the earliest time at which Advance may have work; zero
// when nothing is pending.
func (t *Tracker) NextDeadline() time.Time {
	var next time.Time
	if t.expiry.Len() > 0 {
		next = t.expiry.peek().at
	}
	if t.graces.Len() > 0 {
		if g := t.graces.peek().at; next.IsZero() || g.Before(next) {
			next = g
		}
	}
	if t.forgets.Len() > 0 {
		if f := t.forgets[0].forgetAt; next.IsZero() || f.Before(next) {
			next = f
		}
	}
	if t.expires.Len() > 0 {
		if e := t.expires[0].status.ExpiresAt; next.IsZero() || e.Before(next) {
			next = e
		}
	}
	return next
}

// Presence reports a user's presence; a user never seen (or forgotten) is
// offline with version 0 and a zero LastSeen.
func (t *Tracker) Presence(userID string) Presence {
	p := Presence{UserID: userID}
	u, ok := t.users[userID]
	if !ok {
		return p
	}
	p.State = u.look.State
	p.Version = u.version
	p.ConnectionCount = len(u.conns)
	p.LastSeen = u.lastSeen.time()
	p.Since = u.since.time()
	p.ShownLastSeen = u.shownSeen.time()
	p.Status = u.stat()
	p.Actual, p.ActualSince = u.actual, u.actualSince.time()
	for _, ce := range u.conns {
		if s := ce.lastSeen.time(); s.After(p.LastSeen) {
			p.LastSeen = s
		}
		p.Devices = appendUnique(p.Devices, ce.Device)
	}
	sort.Strings(p.Devices)
	return p
}

// State reports only a user's published state and version: what a snapshot
// needs, without the devices and last-seen work of Presence.
func (t *Tracker) State(userID string) (State, uint64) {
	u, ok := t.users[userID]
	if !ok {
		return Offline, 0
	}
	return u.look.State, u.version
}

// Entry is Presence without the connections and devices: what viewers are
// told in a snapshot, with the status it shows.
func (t *Tracker) Entry(userID string) Presence {
	p := Presence{UserID: userID}
	u, ok := t.users[userID]
	if !ok {
		return p
	}
	p.State, p.Version = u.look.State, u.version
	p.Since, p.ShownLastSeen = u.since.time(), u.shownSeen.time()
	p.Status = u.stat()
	p.Actual, p.ActualSince = u.actual, u.actualSince.time()
	p.LastSeen = u.lastSeen.time()
	return p
}

// Has reports whether connID is a live connection.
func (t *Tracker) Has(connID string) bool {
	_, ok := t.conns[connID]
	return ok
}

// Counts reports live connections and users who are not offline.
func (t *Tracker) Counts() (conns, present int) {
	return len(t.conns), t.present
}

// stat is u's status, the zero one when none is set.
func (u *userEntry) stat() Status {
	if u.status == nil {
		return Status{}
	}
	return *u.status
}

func (t *Tracker) user(id string) *userEntry {
	u, ok := t.users[id]
	if !ok {
		u = &userEntry{id: id, version: t.floor, forgetIdx: -1, expireIdx: -1}
		t.users[id] = u
	}
	return u
}

func (t *Tracker) removeLocked(now time.Time, ce *connEntry, cause Cause, out *Outcome) {
	t.detachLocked(now, ce, cause, out)
	t.settleLocked(now, ce.UserID, out)
}

// detachLocked ends a connection without deciding what its user's state
// becomes: several connections ended by one event (a node lost, deadlines
// due together) are all detached, then their users settled once, so no
// state in between (away, when the active device went first) is published.
func (t *Tracker) detachLocked(now time.Time, ce *connEntry, cause Cause, out *Outcome) {
	delete(t.conns, ce.ID)
	u := t.users[ce.UserID]
	if i := slices.Index(u.conns, ce); i >= 0 {
		u.conns = slices.Delete(u.conns, i, i+1) // clears the freed slot: ce can go
	}
	if cause == Expired {
		out.Expired = append(out.Expired, ce.Conn)
		out.ExpiryLag = append(out.ExpiryLag, max(0, now.Sub(ce.deadline)))
	}
	seen := ce.lastSeen
	if s := stampOf(now); cause == Closed && s > seen {
		seen = s // the close frame is itself a sign of life
	}
	u.lastSeen = max(u.lastSeen, seen)
}

// settleLocked decides the state of a user whose connections changed: the
// grace if none is left, else whatever the rest derive.
func (t *Tracker) settleLocked(now time.Time, userID string, out *Outcome) {
	u := t.users[userID]
	if len(u.conns) == 0 {
		if u.graceUntil != 0 {
			return // in grace already
		}
		until := now.Add(t.cfg.Grace)
		u.graceUntil = stampOf(until)
		t.graces.push(deadline{at: until, key: userID})
		out.GraceStarted++
		return
	}
	t.publishIfChanged(now, userID, u, out)
}

// publishIfChanged publishes what viewers see of the user if the derived
// state makes it differ from what they hold. During grace the real state
// stands.
func (t *Tracker) publishIfChanged(now time.Time, userID string, u *userEntry, out *Outcome) {
	if u.graceUntil != 0 {
		return
	}
	s := derive(u.conns)
	if s != u.real {
		if u.real == Offline {
			t.present++
		} else if s == Offline {
			t.present--
		}
		u.real = s
		if s == Offline && t.cfg.ForgetAfter > 0 {
			u.forgetAt = now.Add(t.cfg.ForgetAfter)
			if u.forgetIdx >= 0 {
				heap.Fix(&t.forgets, int(u.forgetIdx))
			} else {
				heap.Push(&t.forgets, u)
			}
		}
	}
	t.showLocked(now, u, false, out)
}

// SetUserStatus replaces the user's status whole (DESIGN.md Part 1b). A
// status equal to the one held changes nothing; any other takes a new
// version, reported in Outcome.Statuses for the user's own connections,
// and, if what viewers see differs, one change at that version.
func (t *Tracker) SetUserStatus(now time.Time, userID string, st Status) (Outcome, error) {
	if err := st.Validate(now); err != nil {
		return Outcome{}, err
	}
	var out Outcome
	u := t.user(userID)
	t.setStatusLocked(now, u, st, &out)
	return out, nil
}

func (t *Tracker) setStatusLocked(now time.Time, u *userEntry, st Status, out *Outcome) {
	if !st.ExpiresAt.IsZero() {
		st.ExpiresAt = time.UnixMilli(st.ExpiresAt.UnixMilli()) // the wire's precision
	}
	if st.Equal(u.stat()) {
		return
	}
	u.status = nil
	if !st.IsZero() {
		kept := st // a copy: taking st's address would move it to the heap on every call
		u.status = &kept
	}
	u.version++
	// One entry per user, moved in place: a client replacing its status
	// over and over must not grow the queue.
	switch {
	case !st.ExpiresAt.IsZero() && u.expireIdx >= 0:
		heap.Fix(&t.expires, int(u.expireIdx))
	case !st.ExpiresAt.IsZero():
		heap.Push(&t.expires, u)
	case u.expireIdx >= 0:
		heap.Remove(&t.expires, int(u.expireIdx))
	}
	out.Statuses = append(out.Statuses, StatusChange{UserID: u.id, Status: st, Version: u.version})
	t.showLocked(now, u, true, out)
}

// showLocked publishes what viewers see of u (look) if it differs from
// what they hold; bumped: the caller took the new version already.
func (t *Tracker) showLocked(now time.Time, u *userEntry, bumped bool, out *Outcome) {
	actual := u.real
	st := u.stat()
	if actual != Offline && st.Mode == ModeDND {
		actual = DND
	}
	if actual != u.actual {
		u.actual, u.actualSince = actual, stampOf(now)
	}
	l := Look{State: actual}
	if st.Mode == ModeInvisible {
		l.State = Offline
	} else {
		l.Text, l.Emoji = st.Text, st.Emoji
		// An expiry means something next to a text, an emoji or dnd; alone
		// on an online or offline user it would not.
		if l.Text != "" || l.Emoji != "" || l.State == DND {
			l.ExpiresAt = ms(st.ExpiresAt)
		}
	}
	if l.State != u.look.State {
		u.since = stampOf(now)
		if l.State == Offline {
			// Hidden by invisibility: last seen now. Really offline: the
			// last sign of life.
			u.shownSeen = u.lastSeen
			if u.real != Offline {
				u.shownSeen = stampOf(now)
			}
		}
	}
	if l.State == Offline {
		l.LastSeen = ms(u.shownSeen.time())
	}
	if l == u.look {
		return
	}
	prev := u.look.State
	u.look = l
	if !bumped {
		u.version++
	}
	c := Change{UserID: u.id, State: l.State, Previous: prev, Version: u.version, At: now, Since: u.since.time(),
		Text: l.Text, Emoji: l.Emoji}
	if l.ExpiresAt != 0 {
		c.ExpiresAt = time.UnixMilli(l.ExpiresAt)
	}
	if l.State == Offline {
		c.LastSeen = u.shownSeen.time()
	}
	out.Changes = append(out.Changes, c)
}

// derive is rule 4: online if any device is active, away if all are idle.
func derive(conns []*connEntry) State {
	if len(conns) == 0 {
		return Offline
	}
	for _, c := range conns {
		if c.active {
			return Online
		}
	}
	return Away
}

func (ce *connEntry) touch(now time.Time, ttl time.Duration) {
	ce.lastSeen = max(ce.lastSeen, stampOf(now))
	if d := now.Add(ttl); d.After(ce.deadline) {
		ce.deadline = d
	}
}

// userList collects user ids once each, in the order first added. A dead
// node's or a late Advance's thousands of connections must not each scan
// the list (that was quadratic: 20,000 expiring at once cost 21 µs each), so
// past a few it keeps a set beside it.
type userList struct {
	order []string
	seen  map[string]struct{}
}

func (l *userList) add(user string) {
	if l.seen == nil {
		if slices.Contains(l.order, user) {
			return
		}
		l.order = append(l.order, user)
		if len(l.order) > 16 {
			l.seen = make(map[string]struct{}, 2*len(l.order))
			for _, u := range l.order {
				l.seen[u] = struct{}{}
			}
		}
		return
	}
	if _, ok := l.seen[user]; !ok {
		l.seen[user] = struct{}{}
		l.order = append(l.order, user)
	}
}

func appendUnique(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}

type deadline struct {
	at  time.Time
	key string
}

// deadlines is a min-heap of deadlines by time, with its own push and pop:
// container/heap's take and return an interface, which boxes each 40-byte
// deadline, two allocations for every idle connection's refresh (its entry
// popped and pushed again once per ttl), most of an idle node's garbage.
// The order is container/heap's, tie for tie.
type deadlines []deadline

func (d deadlines) Len() int { return len(d) }

func (d *deadlines) push(x deadline) {
	h := append(*d, x)
	*d = h
	for i := len(h) - 1; i > 0; {
		parent := (i - 1) / 2
		if !h[i].at.Before(h[parent].at) {
			break
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
}

func (d *deadlines) pop() deadline {
	h := *d
	last := len(h) - 1
	top := h[0]
	h[0] = h[last]
	h[last] = deadline{} // the spare capacity must not keep the id
	h = h[:last]
	*d = h
	for i := 0; ; {
		child := 2*i + 1
		if child >= len(h) {
			break
		}
		if right := child + 1; right < len(h) && h[right].at.Before(h[child].at) {
			child = right
		}
		if !h[child].at.Before(h[i].at) {
			break
		}
		h[i], h[child] = h[child], h[i]
		i = child
	}
	return top
}

func (d deadlines) peek() deadline { return d[0] }

// forgetQueue is a min-heap of offline users by forgetAt for container/heap.
// Each user knows its index, so a comeback removes its entry at once: an
// entry waits ForgetAfter (days), and lazy removal, as the other heaps do,
// would keep one per offline published in that time.
type forgetQueue []*userEntry

func (q forgetQueue) Len() int           { return len(q) }
func (q forgetQueue) Less(i, j int) bool { return q[i].forgetAt.Before(q[j].forgetAt) }
func (q forgetQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].forgetIdx, q[j].forgetIdx = int32(i), int32(j)
}
func (q *forgetQueue) Push(x any) {
	u := x.(*userEntry)
	u.forgetIdx = int32(len(*q))
	*q = append(*q, u)
}
func (q *forgetQueue) Pop() any {
	old := *q
	u := old[len(old)-1]
	old[len(old)-1] = nil // the spare capacity must not keep the user alive
	*q = old[:len(old)-1]
	u.forgetIdx = -1
	return u
}

// statusQueue is a min-heap of users by status expiry for container/heap;
// each user knows its index, so a replaced status moves its one entry.
type statusQueue []*userEntry

func (q statusQueue) Len() int { return len(q) }
func (q statusQueue) Less(i, j int) bool {
	return q[i].status.ExpiresAt.Before(q[j].status.ExpiresAt)
}
func (q statusQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].expireIdx, q[j].expireIdx = int32(i), int32(j)
}
func (q *statusQueue) Push(x any) {
	u := x.(*userEntry)
	u.expireIdx = int32(len(*q))
	*q = append(*q, u)
}
func (q *statusQueue) Pop() any {
	old := *q
	u := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	u.expireIdx = -1
	return u
}
