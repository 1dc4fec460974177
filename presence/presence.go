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
)

func (s State) String() string {
	switch s {
	case Online:
		return "online"
	case Away:
		return "away"
	}
	return "offline"
}

// ParseState is the inverse of String for the three real states.
func ParseState(s string) (State, bool) {
	switch s {
	case "online":
		return Online, true
	case "away":
		return Away, true
	case "offline":
		return Offline, true
	}
	return Offline, false
}

// Change is one published transition of one user.
type Change struct {
	UserID  string
	State   State
	Version uint64
	At      time.Time
	// Previous is the state viewers held before this change; LastSeen, set
	// only when State is Offline, the user's last sign of life. Webhooks
	// report both; frames to viewers carry neither, and neither do the
	// Redis store's Pub/Sub messages (its events leave them zero: its
	// webhooks are queued by the scripts, which know both).
	Previous State
	LastSeen time.Time
}

// Presence is the full presence of one user.
type Presence struct {
	UserID          string
	State           State
	Version         uint64
	ConnectionCount int
	Devices         []string  // distinct device kinds, sorted
	LastSeen        time.Time // zero when never seen
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
	// Forgotten counts users whose state was dropped (Config.ForgetAfter).
	Forgotten int
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
