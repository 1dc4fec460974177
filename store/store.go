// Package store defines where presence and team membership live: the Store
// interface that the server consumes, and the events a store emits.
//
// Implementations: store/memstore (embedded, one node) and, for many nodes,
// a Redis store. store/storetest is the conformance suite every
// implementation passes. Each transition is one atomic operation of the
// store, so that with many nodes every change is published exactly once.
package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/presence"
)

// Errors returned by stores; wrap them with %w.
var (
	ErrUnknownConn   = presence.ErrUnknownConn
	ErrDuplicateConn = presence.ErrDuplicateConn
	ErrUnavailable   = errors.New("store: unavailable")
	// ErrRecovering: the store lost its data and is being written back;
	// reads would miss users. It is also an ErrUnavailable.
	ErrRecovering = fmt.Errorf("%w: recovering from a data loss", ErrUnavailable)
)

// LossGuard is implemented by stores that can lose their data while the
// nodes live (Redis): Intact returns ErrRecovering while reads could miss
// users not written back yet. A snapshot or an answer built meanwhile
// would show them offline.
type LossGuard interface {
	// Intact answers from what the store last saw (no round trip).
	Intact() error
	// WholeStates is StateReader.States, checked in the same read, after
	// it, and over every part of the store that the caller's reads just
	// before (teams, members) came from: with no users too, since a loss
	// before those reads makes them answer none.
	WholeStates(ctx context.Context, userIDs []string) ([]presence.Presence, error)
	// WholePresence is Tracker.Presence, checked after it over the parts
	// of the store it read (and those WholeStates checks with no users):
	// the answer to a presence query.
	WholePresence(ctx context.Context, userIDs []string) ([]presence.Presence, error)
}

// Tracker holds live connections and derives users' presence from them.
type Tracker interface {
	// Connect registers a live connection.
	Connect(ctx context.Context, c presence.Conn) error
	// Heartbeat records a sign of life; ErrUnknownConn when the store no
	// longer knows the connection, so the caller can register it again.
	// It must not wait (on the network, or on a full queue): the server
	// calls it on its network poller.
	Heartbeat(ctx context.Context, connID string) error
	// SetStatus marks the connection's device active or idle.
	SetStatus(ctx context.Context, connID string, active bool) error
	// Disconnect ends a connection; the user may enter the grace window.
	Disconnect(ctx context.Context, connID string, cause presence.Cause) error
	// Sweep expires silent connections and ends graces that are over. The
	// server calls it a few times a second; it costs O(log n) per entry due.
	Sweep(ctx context.Context) error
	// Presence reports the presence of each user, in order.
	Presence(ctx context.Context, userIDs []string) ([]presence.Presence, error)
}

// Teams holds team membership: who may see whom.
type Teams interface {
	// AddMember adds user to team; adding a member again changes nothing.
	AddMember(ctx context.Context, team, user string) error
	// RemoveMember removes user from team. Removing a non-member changes
	// nothing but is announced as a leave all the same: after a shared store
	// lost its data, nodes may still hold the membership it lost, and the
	// event makes them drop it.
	RemoveMember(ctx context.Context, team, user string) error
	// TeamsOf lists the teams of user, sorted.
	TeamsOf(ctx context.Context, user string) ([]string, error)
	// Members lists the members of team, sorted. Callers must not modify
	// the slice (a store may hand out a cached one).
	Members(ctx context.Context, team string) ([]string, error)
}

// TeamsBatcher is implemented by stores that read many users' teams in one
// round trip: a query frame names up to 500 users, and TeamsOf for each
// would cost a round trip per user. The stores of this repository implement
// it; the server falls back to TeamsOf without it.
type TeamsBatcher interface {
	// TeamsOfMany lists the teams of each user, sorted, in the order of
	// userIDs (nil for a user in no team).
	TeamsOfMany(ctx context.Context, userIDs []string) ([][]string, error)
}

// MembersBatcher is implemented by stores that read many teams' members in
// one round trip: a connect's snapshot needs every team of the user, and
// Members for each would cost a round trip per team. The stores of this
// repository implement it; the server falls back to Members without it.
type MembersBatcher interface {
	// MembersOfMany lists the members of each team, sorted, in the order of
	// teams (nil for a team without members). Callers must not modify the
	// slices.
	MembersOfMany(ctx context.Context, teams []string) ([][]string, error)
}

// ConnectReader is implemented by stores that register a connection and
// read what its welcome and snapshot need together, in fewer round trips
// than Connect, Presence and MembersOfMany one after the other (Redis: one
// pipeline instead of three). The server falls back to those without it.
type ConnectReader interface {
	// ConnectRead is Connect, then the reads of ConnectReads. registered
	// reports whether the connection was registered: an error with
	// registered true is a failed read, and the connection is to be ended
	// like any other.
	ConnectRead(ctx context.Context, c presence.Conn, teams []string) (r ConnectReads, registered bool, err error)
}

// ConnectReads is what ConnectRead reads once the connection is registered.
// The caller's teams may be older than the read (a node's index, which a
// membership event has not reached yet): Teams says which hold as of it.
// Callers must not modify the slices.
type ConnectReads struct {
	Own presence.Presence // the user's own presence
	// Members of each team asked (aligned with them, sorted): nil for a
	// team without members or one the user is not in as of the read.
	Members [][]string
	Teams   []string // the user's teams as of the read, sorted
}

// Store is everything the server needs from a store.
type Store interface {
	Tracker
	Teams
	// Subscribe sets the one handler that receives every event, from this
	// node and (for a shared store) from others. Call it before use.
	Subscribe(h Handler)
}

// StatusStore is implemented by stores that hold users' status settings
// (DESIGN.md Part 1b, "Status"); both stores do.
type StatusStore interface {
	// SetUserStatus replaces user's status whole; a status equal to the one
	// held changes nothing. A status that breaks the rules is refused with
	// an error wrapping presence.ErrBadStatus, and changes nothing.
	SetUserStatus(ctx context.Context, user string, st presence.Status) error
}

// StatusHandler is implemented by handlers that deliver status changes to
// the user's own connections (my_status). A store calls it, under the same
// rules as Handler, for every status change, from every node.
type StatusHandler interface {
	OnStatus(ev presence.StatusChange)
}

// Closer is implemented by stores that hold resources.
type Closer interface {
	Close() error
}

// Pinger is implemented by stores that can be unreachable; /readyz uses it.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Handler receives a store's events. Its methods must not block and must not
// call a store method that changes state (Connect, Disconnect, AddMember…):
// a store may call them while it orders its events. Queries are allowed.
type Handler interface {
	OnPresence(ev PresenceEvent)
	OnMembership(ev MembershipEvent)
}

// PresenceEvent is a published change, with the subject's teams at the time
// of the change: exactly the teams whose members may hear it.
type PresenceEvent struct {
	Change presence.Change
	Teams  []string // sorted
	// Via is set when the event arrived on one team's channel: the store
	// delivers it once per team, and the handler routes it to the members of
	// Via for whom Via is the first team they share with the subject.
	Via string
	// Occupied and Vacated (sorted), set by the memory store for its
	// webhooks when it has them (memstore.Config.OnChange): the teams this
	// change took from no present member to one, and from one to none.
	// Other stores leave them nil (Redis works them out as it delivers).
	Occupied, Vacated []string
}

// MembershipEvent says a user joined or left a team.
type MembershipEvent struct {
	Team   string
	UserID string
	Joined bool
	// UserTeams tells the user's teams after the change. A user may be in
	// thousands of teams, and a receiver mostly needs only whether the user
	// is in the few teams of its viewers: the stores answer that without
	// listing them. Valid only while OnMembership runs; nil = no team.
	UserTeams TeamsView
	State     presence.State
	Version   uint64 // the user's current presence version
	// Presence is the user's whole presence read with the change, when the
	// store has it (its text and emoji reach the new teammates); nil else.
	Presence *presence.Presence
}

// TeamsView answers, for a membership event's handler, what it needs to
// know of the user's teams after the change. A store's view may read the
// store (Redis: one round trip per call), and is valid only while the
// handler runs.
type TeamsView interface {
	// In reports, for each of teams, whether the user is a member.
	In(ctx context.Context, teams []string) ([]bool, error)
	// List lists all of the user's teams, in no set order: O(their
	// number), for a handler that needs them all (the user is connected to
	// its node).
	List(ctx context.Context) ([]string, error)
}

// TeamList is a TeamsView of teams held: the user's teams, all of them.
type TeamList []string

// In implements TeamsView.
func (l TeamList) In(_ context.Context, teams []string) ([]bool, error) {
	out := make([]bool, len(teams))
	if len(l)*len(teams) <= 1024 {
		for i, t := range teams {
			out[i] = slices.Contains(l, t)
		}
		return out, nil
	}
	set := make(map[string]struct{}, len(l))
	for _, t := range l {
		set[t] = struct{}{}
	}
	for i, t := range teams {
		_, out[i] = set[t]
	}
	return out, nil
}

// List implements TeamsView.
func (l TeamList) List(context.Context) ([]string, error) { return l, nil }

// Watcher is implemented by shared stores whose events about a team reach a
// node only once it asks for them. The server watches the teams of the users
// connected to it, and unwatches a team when its last local member leaves.
type Watcher interface {
	// Watch returns once events about teams will be delivered.
	Watch(ctx context.Context, teams []string) error
	Unwatch(teams []string)
}

// Resyncer is implemented by handlers that can catch viewers up after a
// shared store may have missed events (Redis lost data, or messages were
// lost with a connection). floor(user) is a version above every version of
// user published before the call, and below every later one: a state sent
// at the floor overrides what a viewer holds, and later changes still
// override it.
type Resyncer interface {
	OnResync(floor func(userID string) uint64)
}

// MemberCounter is implemented by stores that count a team's members
// without listing them: a node decides with it whether a team is large
// (--large-team) when its first local member connects.
// Scheduler is a store that knows when its next publishing deadline (a
// grace end, a status expiry) falls: the server then sweeps when it is due
// instead of at the next tick. Other deadlines wait for the tick.
type Scheduler interface {
	// NextDeadline is the earliest time at which a Sweep publishes
	// something, on the store's clock; zero when nothing is pending.
	NextDeadline() time.Time
	// Rescheduled is signalled when a deadline earlier than the one last
	// reported by NextDeadline is added.
	Rescheduled() <-chan struct{}
}

type MemberCounter interface {
	MemberCount(ctx context.Context, team string) (int, error)
}

// Broadcaster is implemented by stores that carry app messages (Pusher
// channel events) to every node; both stores do.
type Broadcaster interface {
	// Broadcast hands payload to the OnBroadcast handler of every node, this
	// one's included: at most once, in order for one sending node. The
	// memory store calls the handler synchronously, in the caller's
	// goroutine; the Redis store publishes on Redis Pub/Sub and this node's
	// handler runs from the subscription's reader. An error (Redis away)
	// means nothing was sent; only after a timeout it may have been, and
	// sending it again may deliver it twice.
	Broadcast(ctx context.Context, payload []byte) error
	// OnBroadcast sets the handler, before any Broadcast; nil drops
	// messages. The handler must not block for long, and must not modify
	// payload after it returns (it may keep it).
	OnBroadcast(h func(payload []byte))
}

// ChannelCounter is implemented by stores that keep, per node, how many
// subscriptions each app channel has there, so that any node can answer
// "which channels are occupied" for the whole cluster; both stores do.
type ChannelCounter interface {
	// SetChannelCounts replaces this node's counts whole (channels with 0
	// left out). The server calls it when its counts changed (debounced)
	// and at least every ChannelCountsRefresh; a node's counts not
	// refreshed for ChannelCountsTTL are no longer counted (a crashed
	// node's channels are released by that), and are deleted when found so.
	SetChannelCounts(ctx context.Context, counts map[string]int) error
	// ChannelCounts sums the counts of live nodes for the channels whose
	// name starts with prefix ("" = all); only channels > 0.
	ChannelCounts(ctx context.Context, prefix string) (map[string]int, error)
}

// How often a node refreshes its channel counts at least, and how long
// unrefreshed counts still count: three refreshes may be missed before a
// node's channels are released.
const (
	ChannelCountsRefresh = 5 * time.Second
	ChannelCountsTTL     = 15 * time.Second
)

// MemberInfos is implemented by stores that keep a Pusher user_info (opaque
// JSON, at most 1 KiB, checked by the server) per team member; both stores
// do.
type MemberInfos interface {
	// SetMemberInfo stores info for user in team; empty info deletes it. It
	// is kept only while user is a member: removed with the membership
	// (RemoveMember), and not stored for a non-member, checked in the same
	// step, so a removal racing a subscription leaves no info behind.
	SetMemberInfo(ctx context.Context, team, user string, info []byte) error
	// MemberInfos returns the infos of users in team, aligned with users
	// (nil where none).
	MemberInfos(ctx context.Context, team string, users []string) ([][]byte, error)
}

// StateReader is implemented by stores that read states and versions alone,
// cheaper than full presence: a snapshot needs nothing else.
type StateReader interface {
	States(ctx context.Context, userIDs []string) ([]presence.Presence, error)
}

// Counter is implemented by stores that count, for the gauges: this node's
// live connections and the users not offline (all nodes, for a shared store).
type Counter interface {
	Counts() (conns, present int)
}

// MetricsSource is implemented by stores with metrics of their own, which
// the server registers beside its own.
type MetricsSource interface {
	Collectors() []prometheus.Collector
}

// Observable is implemented by stores that report outcomes to an Observer;
// the server sets one before use.
type Observable interface {
	SetObserver(o Observer)
}

// Observer receives what each store operation did, for metrics.
type Observer interface {
	ObserveOutcome(op string, out presence.Outcome, took time.Duration)
}

// Operation names passed to Observer.
const (
	OpConnect    = "connect"
	OpHeartbeat  = "heartbeat"
	OpStatus     = "status"
	OpUserStatus = "user_status" // SetUserStatus
	OpDisconnect = "disconnect"
	OpSweep      = "sweep"
	OpQuery      = "query"
	OpMembership = "membership"
)
