package presence

import (
	"errors"
	"time"
)

// State is a user's presence as viewers see it.
type State uint8

const (
	Offline State = iota
	Online
	Away
	// DND: online or away with the status mode dnd (v2).
	DND
)

func (s State) String() string {
	switch s {
	case Online:
		return "online"
	case Away:
		return "away"
	case DND:
		return "dnd"
	}
	return "offline"
}

// ParseState is the inverse of String for the real states.
func ParseState(s string) (State, bool) {
	switch s {
	case "dnd":
		return DND, true
	case "online":
		return Online, true
	case "away":
		return Away, true
	case "offline":
		return Offline, true
	}
	return Offline, false
}

// Change is one published transition of one user: every difference in
// what viewers see (Look) is one, with a new version.
type Change struct {
	UserID  string
	State   State
	Version uint64
	At      time.Time
	// Previous is the state viewers were shown before this change (the
	// same State for a change of text or emoji alone). Webhooks report it;
	// frames to viewers do not carry it.
	Previous State
	// The status text and emoji shown, and their expiry (zero: none); none
	// while the user is invisible.
	Text      string
	Emoji     string
	ExpiresAt time.Time
	Since     time.Time // when State began (At, for a change of state)
	LastSeen  time.Time // offline only: when the user was last seen, as viewers are told
}

// Presence is the full presence of one user: the truth. Viewers see
// Visible() of it (an invisible user is offline to them).
type Presence struct {
	UserID          string
	State           State // as viewers see it: dnd for mode dnd, offline while invisible
	Version         uint64
	ConnectionCount int
	Devices         []string  // distinct device kinds, sorted
	LastSeen        time.Time // the last sign of life; zero when never seen
	Since           time.Time // when State began; zero when never seen
	// ShownLastSeen is the last seen viewers were told with the offline
	// they hold: while invisible, the moment the user went invisible.
	ShownLastSeen time.Time
	Status        Status    // the user's status setting (the mode is the truth)
	Actual        State     // the truth: State as if the user were not invisible
	ActualSince   time.Time // when Actual began
}

// Conn describes a new connection.
type Conn struct {
	ID     string
	UserID string
	Device string
	Node   string
	// Idle registers the device as idle: a connection registered again
	// after the store lost it keeps the status it had, with no online
	// published in between.
	Idle bool
}

// Cause says why a connection ended; it decides what last_seen becomes.
type Cause uint8

const (
	// Closed: the socket closed; the close itself was the last sign of life.
	Closed Cause = iota
	// Expired: nothing was heard within the TTL; last seen is the last frame.
	Expired
	// Lost: the node holding it is gone; last seen is the last frame recorded.
	Lost
)

// Errors returned by a Tracker.
var (
	ErrDuplicateConn = errors.New("presence: connection id already in use")
	ErrUnknownConn   = errors.New("presence: unknown connection")
)

// Outcome is what one call did: the changes to publish and facts for metrics.
type Outcome struct {
	Changes        []Change
	Expired        []Conn // connections that timed out (callers close their sockets)
	GraceStarted   int
	GraceCancelled int
	// ExpiryLag is, per expired connection, how late past its deadline it was
	// noticed; callers export it as offline-detection lag.
	ExpiryLag []time.Duration
	// GraceLag is, per offline published at the end of a grace, how late
	// past that end it was decided; callers export it, as the measure of
	// whether an offline comes on time.
	GraceLag []time.Duration
	// Forgotten counts users whose state was dropped (Config.ForgetAfter).
	Forgotten int
	// Statuses are the status changes, for the users' own connections.
	Statuses []StatusChange
	// StatusesExpired counts statuses ended by their expiry.
	StatusesExpired int
}

// Config sets a Tracker's deadlines.
type Config struct {
	TTL   time.Duration // a connection silent this long is dead
	Grace time.Duration // how long a user without connections stays as they were
	// ForgetAfter: a user offline this long (counted from the published
	// offline) is forgotten: queries answer as for a user never seen, and a
	// later version still exceeds every earlier one. 0 (or less): never.
	ForgetAfter time.Duration
}
