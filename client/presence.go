package client

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/greendot/greendot/protocol"
)

// State is what the client holds about one user.
type State struct {
	UserID string
	// State is protocol.StateOnline, StateAway or StateOffline.
	State string
	// Version is the server's version of this state. An offline the client
	// inferred from a snapshot (the user was online and the new snapshot no
	// longer lists them) carries the version held before.
	Version uint64
	// At is when the server recorded the transition, from the presence
	// frame that carried it; zero when the state came from a snapshot,
	// which carries no time (unless the client already held the same state,
	// whose time it keeps).
	At time.Time
	// Since is when this client first knew the user in State: At when the
	// server sent the transition, else the receipt of the snapshot that
	// first showed it. The user has been in State at least since then (the
	// transition may be older); never zero in a State the client holds.
	// With a v2 server, which sends since, it is the server's: when the
	// user entered State.
	Since time.Time
	// The user's status text and emoji shown (v2), and when they end; empty
	// and zero when unset, and always while the user is invisible.
	Text      string
	Emoji     string
	ExpiresAt time.Time
	// LastSeen is, for offline changes of a v2 server, when the user was
	// last seen; zero otherwise.
	LastSeen time.Time
}

// String reads "bob away v7 since 2025-11-30T10:04:05.123Z".
func (s State) String() string {
	out := fmt.Sprintf("%s %s v%d", s.UserID, s.State, s.Version)
	if !s.Since.IsZero() {
		out += " since " + s.Since.Format(timeFormat)
	}
	return out
}

const timeFormat = "2006-01-02T15:04:05.000Z07:00"

// Change is one state the client applied, as handed to Options.OnChange and
// Client.Changes.
type Change struct {
	UserID  string
	State   string    // protocol.StateOnline, StateAway or StateOffline
	Version uint64    // as in State
	At      time.Time // as in State: zero when the change came from a snapshot
	Since   time.Time // as in State: never zero
	// The status shown, as in State (v2).
	Text      string
	Emoji     string
	ExpiresAt time.Time
	LastSeen  time.Time
	// Previous is the state held before ("" if none). A change of text or
	// emoji alone has Previous equal to State.
	Previous string
	// Received is when the frame carrying the change was read off the
	// socket, before any decoding or queueing: Received.Sub(At) is the
	// delivery lag (clocks permitting).
	Received time.Time
	// FromSnapshot marks a change found by comparing a (re)connect snapshot
	// with what the client held, rather than one sent as a presence frame.
	FromSnapshot bool
}

func (s State) change(previous string, received time.Time, fromSnapshot bool) Change {
	return Change{UserID: s.UserID, State: s.State, Version: s.Version, At: s.At, Since: s.Since,
		Text: s.Text, Emoji: s.Emoji, ExpiresAt: s.ExpiresAt, LastSeen: s.LastSeen,
		Previous: previous, Received: received, FromSnapshot: fromSnapshot}
}

// presenceMap is the client's view of its visible users. It is a plain value
// with no locking, goroutines or clock of its own: the Client guards it and
// passes the receipt time in, and tests drive it by calling it.
//
// Entries are the latest version applied per user. An offline change is kept
// as a tombstone so that an older online can never resurrect the user; a
// snapshot replaces everything, tombstones included, because a restarted
// server may start counting versions again from 1.
type presenceMap struct {
	users   map[string]entry
	watched map[string]struct{} // kept across snapshots (watch.go)
}

// entry is a State as the map holds it: without the user id (the key), with
// times as integers and the status text behind a pointer, so that a process
// holding many clients of large teams (the load generator) holds 64 bytes
// per user rather than State's 168. The times the server sends in
// milliseconds stay in milliseconds, exact whatever the server sends; since
// may be the local receipt, kept to the nanosecond.
type entry struct {
	version                 uint64
	at, expiresAt, lastSeen int64 // Unix ms; 0 for the zero time
	since                   int64 // Unix ns; 0 for the zero time
	state                   string
	text                    *statusText // nil when neither is set
}

type statusText struct{ text, emoji string }

// look is what a change of which is news: the state and the status shown.
type look struct {
	state, text, emoji string
	expiresAt          int64
}

func (e entry) look() look {
	l := look{state: e.state, expiresAt: e.expiresAt}
	if e.text != nil {
		l.text, l.emoji = e.text.text, e.text.emoji
	}
	return l
}

func pack(s State) entry {
	e := entry{version: s.Version, at: millis(s.At), since: nanos(s.Since), expiresAt: millis(s.ExpiresAt),
		lastSeen: millis(s.LastSeen), state: internState(s.State)}
	if s.Text != "" || s.Emoji != "" {
		e.text = &statusText{s.Text, s.Emoji}
	}
	return e
}

func (e entry) unpack(userID string) State {
	s := State{UserID: userID, State: e.state, Version: e.version, At: msTime(e.at), Since: fromNanos(e.since),
		ExpiresAt: msTime(e.expiresAt), LastSeen: msTime(e.lastSeen)}
	if e.text != nil {
		s.Text, s.Emoji = e.text.text, e.text.emoji
	}
	return s
}

func millis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// internState shares the protocol's constants instead of the decoder's
// fresh copy of each state name.
func internState(s string) string {
	switch s {
	case protocol.StateOnline:
		return protocol.StateOnline
	case protocol.StateAway:
		return protocol.StateAway
	case protocol.StateOffline:
		return protocol.StateOffline
	}
	return s
}

func newPresenceMap() *presenceMap {
	return &presenceMap{users: make(map[string]entry), watched: make(map[string]struct{})}
}

// applySnapshot replaces the map with a snapshot and returns what differs
// from before: users who appeared or changed state, and an offline for each
// user who was online or away and is no longer listed. Those users are
// dropped, not kept offline, so that a restarted server's versions, which
// may start again from 1, are accepted.
func (m *presenceMap) applySnapshot(users []protocol.UserState, received time.Time) []Change {
	next := make(map[string]entry, len(users))
	var changes []Change
	for _, u := range users {
		s := State{UserID: u.UserID, State: u.State, Version: u.Version, Since: received,
			Text: u.Text, Emoji: u.Emoji, ExpiresAt: msTime(u.ExpiresAt)}
		if u.Since != 0 {
			s.Since = time.UnixMilli(u.Since)
		}
		e := pack(s)
		old, ok := m.users[u.UserID]
		switch {
		case ok && old.look() == e.look():
			e.at = old.at
			if s.Since.Equal(received) {
				e.since = old.since
			}
		case ok:
			changes = append(changes, s.change(old.state, received, true))
		case s.State != protocol.StateOffline:
			if changes == nil {
				changes = make([]Change, 0, len(users))
			}
			changes = append(changes, s.change("", received, true))
		}
		next[u.UserID] = e
	}
	for id, old := range m.users {
		if _, ok := next[id]; ok || old.state == protocol.StateOffline {
			continue
		}
		if _, w := m.watched[id]; w {
			next[id] = old // a watched user is not in snapshots: watched again, it is replaced
			continue
		}
		gone := State{UserID: id, State: protocol.StateOffline, Version: old.version, Since: received}
		changes = append(changes, gone.change(old.state, received, true))
	}
	m.users = next
	// Map iteration order is random; hand changes out in a stable order.
	slices.SortFunc(changes, func(a, b Change) int { return strings.Compare(a.UserID, b.UserID) })
	return changes
}

// replace applies a fresh read of users (the answer to a watch sent again
// on a new connection) whatever the versions held, which a restarted
// server may have started again from 1; a user whose look is unchanged
// makes no change.
func (m *presenceMap) replace(changes []protocol.Change, received time.Time) []Change {
	for _, ch := range changes {
		if old, ok := m.users[ch.UserID]; ok {
			nu := pack(State{State: ch.State, Text: ch.Text, Emoji: ch.Emoji, ExpiresAt: msTime(ch.ExpiresAt)})
			if old.look() == nu.look() {
				old.version = ch.Version
				m.users[ch.UserID] = old
				continue
			}
			old.version = 0
			m.users[ch.UserID] = old
		}
	}
	return m.applyChanges(changes, received)
}

// applyChanges applies the changes of one presence frame in order and returns
// those that were newer than what the map held; the others are dropped.
func (m *presenceMap) applyChanges(changes []protocol.Change, received time.Time) []Change {
	var applied []Change
	for _, ch := range changes {
		old, ok := m.users[ch.UserID]
		if ok && ch.Version <= old.version {
			continue
		}
		s := State{UserID: ch.UserID, State: ch.State, Version: ch.Version, Since: received,
			Text: ch.Text, Emoji: ch.Emoji, ExpiresAt: msTime(ch.ExpiresAt), LastSeen: msTime(ch.LastSeen)}
		if ch.At != 0 {
			s.At = time.UnixMilli(ch.At)
			s.Since = s.At
		}
		if ch.Since != 0 {
			s.Since = time.UnixMilli(ch.Since)
		}
		m.users[ch.UserID] = pack(s)
		applied = append(applied, s.change(old.state, received, false))
	}
	return applied
}

// get returns the state held for a user, offline tombstones included.
func (m *presenceMap) get(userID string) (State, bool) {
	e, ok := m.users[userID]
	if !ok {
		return State{}, false
	}
	return e.unpack(userID), true
}

// all returns every user held who is not offline, sorted by user id.
func (m *presenceMap) all() []State {
	out := make([]State, 0, len(m.users))
	for id, e := range m.users {
		if e.state != protocol.StateOffline {
			out = append(out, e.unpack(id))
		}
	}
	slices.SortFunc(out, func(a, b State) int { return strings.Compare(a.UserID, b.UserID) })
	return out
}

// UserPresence is the full presence of one user, as Query returns it.
type UserPresence struct {
	UserID string
	// State is protocol.StateOnline, StateAway or StateOffline; StateUnknown
	// for a user who shares no team with the viewer, and then nothing else
	// is set.
	State           string
	ConnectionCount int
	Devices         []string
	// LastSeen is the moment the user was last known live (the server's
	// last_seen); zero for a user never seen, or unknown.
	LastSeen time.Time
	Version  uint64
	// v2: the status text shown, when set; since when the state holds
	// (zero for a user never seen).
	Text      string
	Emoji     string
	ExpiresAt time.Time
	Since     time.Time
}

// String reads "bob online v7 on 2 connections [ios web]", "erin offline v4
// last seen 2025-11-30T10:04:05.123Z", "frank offline, never seen" or
// "carol unknown".
func (p UserPresence) String() string {
	switch {
	case p.State == protocol.StateUnknown:
		return p.UserID + " unknown"
	case p.State == protocol.StateOffline && p.LastSeen.IsZero():
		return p.UserID + " offline, never seen"
	case p.State == protocol.StateOffline:
		return fmt.Sprintf("%s offline v%d last seen %s", p.UserID, p.Version, p.LastSeen.Format(timeFormat))
	}
	conns := "connections"
	if p.ConnectionCount == 1 {
		conns = "connection"
	}
	return fmt.Sprintf("%s %s v%d on %d %s %v", p.UserID, p.State, p.Version, p.ConnectionCount, conns, p.Devices)
}

func userPresence(u protocol.UserPresence) UserPresence {
	p := UserPresence{UserID: u.UserID, State: u.State, ConnectionCount: u.ConnectionCount,
		Devices: u.Devices, Version: u.Version}
	if u.LastSeen != nil {
		p.LastSeen = time.UnixMilli(*u.LastSeen)
	}
	p.Text, p.Emoji = u.Text, u.Emoji
	if u.ExpiresAt != nil {
		p.ExpiresAt = time.UnixMilli(*u.ExpiresAt)
	}
	if u.Since != nil {
		p.Since = time.UnixMilli(*u.Since)
	}
	return p
}
