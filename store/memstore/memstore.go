// Package memstore is the embedded, single-node store: presence.Tracker
// behind a mutex, plus team membership in maps.
package memstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
)

// Config configures a Store. The zero value works: a 25 s TTL, no grace,
// nothing forgotten, the wall clock and no observer.
type Config struct {
	TTL   time.Duration
	Grace time.Duration // 0: offline is published as soon as the last connection ends
	// ForgetAfter: a user offline this long is forgotten (answered as never
	// seen; team membership is kept). 0: never; else at least Grace.
	ForgetAfter time.Duration
	Now         func() time.Time // injected clock; time.Now when nil
	Observer    store.Observer
	// OnChange, when set, receives every published change too, in order,
	// before the handler (webhooks: webhook.MemQueue.Add). It must not block.
	OnChange func(store.PresenceEvent)
	// ChannelCountsTTL: channel counts not set again for this long are no
	// longer counted. store.ChannelCountsTTL when 0.
	ChannelCountsTTL time.Duration
}

// Store is the in-memory store.
type Store struct {
	now      func() time.Time
	obs      store.Observer
	onChange func(store.PresenceEvent)

	// memberMu serialises membership changes, each held until its event is
	// handled: the event's view of the user's teams (memberView) then reads
	// userOf as it was right after the change, without mu (a handler must
	// not wait for mu: a transition holds it while it waits for emitMu).
	memberMu sync.Mutex
	mu       sync.Mutex
	tracker  *presence.Tracker
	teams    map[string]map[string]struct{} // team → members
	// userOf holds each user's teams sorted: a slice of one team is 16
	// bytes where a map of one took ~200, for every user with a team.
	userOf map[string][]string
	sorted map[string][]string          // team → members sorted, cached until the team changes
	infos  map[string]map[string][]byte // team → member → user_info
	// present holds each team's members counted present by its webhooks'
	// member events, kept only for webhooks (onChange): one process orders
	// every change, so the memory store tells exactly which change occupies
	// or vacates a team. A member comes in with a change leaving offline
	// while in the team, and goes out with a change to offline or a
	// removal; a present user added to a team is not counted (the member
	// events follow presence, not membership), as on Redis.
	present map[string]map[string]struct{}

	countsTTL time.Duration
	counts    map[string]int // this node's channel counts, > 0 only
	countsAt  time.Time      // when counts were set

	// emitMu orders events: it is taken before mu is released, so events
	// reach the handler in the order their transitions happened, without
	// holding mu while the handler runs.
	emitMu  sync.Mutex
	handler store.Handler

	onBroadcast atomic.Pointer[func([]byte)] // nil: messages are dropped

	reported    time.Time     // the deadline NextDeadline last reported; guarded by mu
	rescheduled chan struct{} // Rescheduled; one pending signal at most
}

var (
	_ store.Store          = (*Store)(nil)
	_ store.Pinger         = (*Store)(nil)
	_ store.Observable     = (*Store)(nil)
	_ store.StateReader    = (*Store)(nil)
	_ store.Counter        = (*Store)(nil)
	_ store.Scheduler      = (*Store)(nil)
	_ store.StatusStore    = (*Store)(nil)
	_ store.TeamsBatcher   = (*Store)(nil)
	_ store.MembersBatcher = (*Store)(nil)

	_ store.Broadcaster    = (*Store)(nil)
	_ store.ChannelCounter = (*Store)(nil)
	_ store.MemberInfos    = (*Store)(nil)
)

// New returns an empty Store.
func New(cfg Config) (*Store, error) {
	if cfg.TTL == 0 {
		cfg.TTL = 25 * time.Second
	}
	if cfg.TTL < 0 || cfg.Grace < 0 {
		return nil, errors.New("memstore: ttl and grace must not be negative")
	}
	if cfg.ForgetAfter < 0 || (cfg.ForgetAfter > 0 && cfg.ForgetAfter < cfg.Grace) {
		return nil, errors.New("memstore: forget-after must be 0 (never) or at least the grace")
	}
	if cfg.ChannelCountsTTL == 0 {
		cfg.ChannelCountsTTL = store.ChannelCountsTTL
	}
	if cfg.ChannelCountsTTL < 0 {
		return nil, errors.New("memstore: channel-counts ttl must not be negative")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Store{
		now:         cfg.Now,
		obs:         cfg.Observer,
		onChange:    cfg.OnChange,
		tracker:     presence.NewTracker(presence.Config{TTL: cfg.TTL, Grace: cfg.Grace, ForgetAfter: cfg.ForgetAfter}),
		teams:       make(map[string]map[string]struct{}),
		userOf:      make(map[string][]string),
		sorted:      make(map[string][]string),
		infos:       make(map[string]map[string][]byte),
		present:     make(map[string]map[string]struct{}),
		rescheduled: make(chan struct{}, 1),

		countsTTL: cfg.ChannelCountsTTL,
	}, nil
}

// Subscribe implements store.Store.
func (s *Store) Subscribe(h store.Handler) {
	s.emitMu.Lock()
	s.handler = h
	s.emitMu.Unlock()
}

// SetObserver implements store.Observable. Call it before use.
func (s *Store) SetObserver(o store.Observer) { s.obs = o }

// Ping implements store.Pinger: memory is always there.
func (s *Store) Ping(context.Context) error { return nil }

// Connect implements store.Tracker.
func (s *Store) Connect(_ context.Context, c presence.Conn) error {
	return s.transition(store.OpConnect, func(now time.Time) (presence.Outcome, error) {
		return s.tracker.Connect(now, c)
	})
}

// Heartbeat implements store.Tracker.
func (s *Store) Heartbeat(_ context.Context, connID string) error {
	s.mu.Lock()
	err := s.tracker.Heartbeat(s.now(), connID)
	s.mu.Unlock()
	return err
}

// SetStatus implements store.Tracker.
func (s *Store) SetStatus(_ context.Context, connID string, active bool) error {
	return s.transition(store.OpStatus, func(now time.Time) (presence.Outcome, error) {
		return s.tracker.SetStatus(now, connID, active)
	})
}

// SetUserStatus implements store.StatusStore.
func (s *Store) SetUserStatus(_ context.Context, user string, st presence.Status) error {
	user = strings.Clone(user) // may be a piece of a request's URI, and start the user's entry
	return s.transition(store.OpUserStatus, func(now time.Time) (presence.Outcome, error) {
		return s.tracker.SetUserStatus(now, user, st)
	})
}

// Disconnect implements store.Tracker.
func (s *Store) Disconnect(_ context.Context, connID string, cause presence.Cause) error {
	return s.transition(store.OpDisconnect, func(now time.Time) (presence.Outcome, error) {
		return s.tracker.Disconnect(now, connID, cause)
	})
}

// Sweep implements store.Tracker.
func (s *Store) Sweep(context.Context) error {
	return s.transition(store.OpSweep, func(now time.Time) (presence.Outcome, error) {
		return s.tracker.Advance(now), nil
	})
}

// Presence implements store.Tracker.
func (s *Store) Presence(_ context.Context, userIDs []string) ([]presence.Presence, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]presence.Presence, len(userIDs))
	for i, id := range userIDs {
		out[i] = s.tracker.Presence(id)
	}
	return out, nil
}

// States implements the server's optional snapshot read: state and version
// only, for many users under one lock.
func (s *Store) States(_ context.Context, userIDs []string) ([]presence.Presence, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]presence.Presence, len(userIDs))
	for i, id := range userIDs {
		out[i] = s.tracker.Entry(id)
	}
	return out, nil
}

// Counts reports live connections and users who are not offline.
func (s *Store) Counts() (conns, present int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tracker.Counts()
}

// AddMember implements store.Teams.
func (s *Store) AddMember(_ context.Context, team, user string) error {
	return s.membership(team, user, true)
}

// RemoveMember implements store.Teams.
func (s *Store) RemoveMember(_ context.Context, team, user string) error {
	return s.membership(team, user, false)
}

// TeamsOf implements store.Teams.
func (s *Store) TeamsOf(_ context.Context, user string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.userOf[user]), nil
}

// TeamsOfMany implements store.TeamsBatcher, under one lock.
func (s *Store) TeamsOfMany(_ context.Context, userIDs []string) ([][]string, error) {
	out := make([][]string, len(userIDs))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, u := range userIDs {
		out[i] = slices.Clone(s.userOf[u])
	}
	return out, nil
}

// Members implements store.Teams.
// Every connect reads its teams' members for the snapshot: the sorted list
// is kept until the team changes. Callers must not modify it.
func (s *Store) Members(_ context.Context, team string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.membersLocked(team), nil
}

// MembersOfMany implements store.MembersBatcher: one lock for all.
func (s *Store) MembersOfMany(_ context.Context, teams []string) ([][]string, error) {
	out := make([][]string, len(teams))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, t := range teams {
		out[i] = s.membersLocked(t)
	}
	return out, nil
}

func (s *Store) membersLocked(team string) []string {
	if m, ok := s.sorted[team]; ok {
		return m
	}
	m := sortedKeys(s.teams[team])
	if len(m) > 0 { // a name without members is not kept: any caller may ask for any
		s.sorted[strings.Clone(team)] = m
	}
	return m
}

// MemberCount implements store.MemberCounter.
func (s *Store) MemberCount(_ context.Context, team string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.teams[team]), nil
}

// Broadcast implements store.Broadcaster: one node, so the handler is
// called at once, in the caller's goroutine.
func (s *Store) Broadcast(_ context.Context, payload []byte) error {
	if h := s.onBroadcast.Load(); h != nil {
		(*h)(payload)
	}
	return nil
}

// OnBroadcast implements store.Broadcaster.
func (s *Store) OnBroadcast(h func(payload []byte)) {
	if h == nil {
		s.onBroadcast.Store(nil)
		return
	}
	s.onBroadcast.Store(&h)
}

// SetChannelCounts implements store.ChannelCounter. The one node's counts
// expire like a shared store's, so that both behave alike.
func (s *Store) SetChannelCounts(_ context.Context, counts map[string]int) error {
	kept := make(map[string]int, len(counts))
	for ch, n := range counts {
		if n > 0 {
			kept[ch] = n
		}
	}
	s.mu.Lock()
	s.counts, s.countsAt = kept, s.now()
	s.mu.Unlock()
	return nil
}

// ChannelCounts implements store.ChannelCounter.
func (s *Store) ChannelCounts(_ context.Context, prefix string) (map[string]int, error) {
	out := make(map[string]int)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.now().Sub(s.countsAt) >= s.countsTTL {
		s.counts = nil // no longer counted, and dropped when found so
		return out, nil
	}
	for ch, n := range s.counts {
		if strings.HasPrefix(ch, prefix) {
			out[ch] = n
		}
	}
	return out, nil
}

// SetMemberInfo implements store.MemberInfos.
func (s *Store) SetMemberInfo(_ context.Context, team, user string, info []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, member := s.teams[team][user]; len(info) == 0 || !member {
		delete(s.infos[team], user)
		if len(s.infos[team]) == 0 {
			delete(s.infos, team)
		}
		return nil
	}
	if s.infos[team] == nil {
		s.infos[team] = make(map[string][]byte)
	}
	s.infos[team][user] = bytes.Clone(info) // the caller may reuse its buffer
	return nil
}

// MemberInfos implements store.MemberInfos.
func (s *Store) MemberInfos(_ context.Context, team string, users []string) ([][]byte, error) {
	out := make([][]byte, len(users))
	s.mu.Lock()
	defer s.mu.Unlock()
	infos := s.infos[team]
	for i, u := range users {
		out[i] = bytes.Clone(infos[u])
	}
	return out, nil
}

func (s *Store) membership(team, user string, join bool) error {
	s.memberMu.Lock()
	defer s.memberMu.Unlock()
	s.mu.Lock()
	members := s.teams[team]
	_, isMember := members[user]
	// A removal of a non-member is announced all the same (store.Teams).
	if join && isMember {
		s.mu.Unlock()
		return nil
	}
	delete(s.sorted, team)
	// Copies: the caller's may be pieces of a request's URI (a path value),
	// which the store and the event's receivers would otherwise keep whole
	// (a map assignment replaces the key it finds, a leave's too).
	team, user = strings.Clone(team), strings.Clone(user)
	if join {
		if members == nil {
			members = make(map[string]struct{})
			s.teams[team] = members
		}
		members[user] = struct{}{}
		mine := s.userOf[user]
		if i, in := slices.BinarySearch(mine, team); !in {
			s.userOf[user] = slices.Insert(mine, i, team)
		}
	} else {
		delete(members, user)
		if len(members) == 0 {
			delete(s.teams, team)
		}
		delete(s.infos[team], user)
		if len(s.infos[team]) == 0 {
			delete(s.infos, team)
		}
		mine := s.userOf[user]
		if i, in := slices.BinarySearch(mine, team); in {
			mine = slices.Delete(mine, i, i+1)
			if len(mine) == 0 {
				delete(s.userOf, user)
			} else {
				s.userOf[user] = mine
			}
		}
	}
	p := s.tracker.Presence(user)
	if !join {
		s.uncount(team, user) // quietly: a membership change sends no webhook
	}
	ev := store.MembershipEvent{
		Team: team, UserID: user, Joined: join,
		UserTeams: memberView{s, user},
		State:     p.State, Version: p.Version, Presence: &p,
	}
	s.emitMu.Lock()
	s.mu.Unlock()
	defer s.emitMu.Unlock()
	if s.handler != nil {
		s.handler.OnMembership(ev)
	}
	return nil
}

// transition applies one tracker call and emits its changes in order.
func (s *Store) transition(op string, apply func(now time.Time) (presence.Outcome, error)) error {
	start := time.Now()
	s.mu.Lock()
	out, err := apply(s.now())
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("memstore: %s: %w", op, err)
	}
	if next := s.tracker.NextPublish(); !next.IsZero() && (s.reported.IsZero() || next.Before(s.reported)) {
		s.reported = next
		select {
		case s.rescheduled <- struct{}{}:
		default:
		}
	}
	var events []store.PresenceEvent
	if len(out.Changes) > 0 {
		events = make([]store.PresenceEvent, len(out.Changes))
		for i, c := range out.Changes {
			events[i] = store.PresenceEvent{Change: c, Teams: slices.Clone(s.userOf[c.UserID])}
			if s.onChange != nil {
				s.occupancy(&events[i])
			}
		}
	}
	s.emitMu.Lock()
	s.mu.Unlock()
	if s.onChange != nil {
		for _, ev := range events {
			s.onChange(ev)
		}
	}
	if s.handler != nil {
		// A status change goes first: a device that learns of a presence
		// change made by its own status already holds the status.
		if sh, ok := s.handler.(store.StatusHandler); ok {
			for _, st := range out.Statuses {
				sh.OnStatus(st)
			}
		}
		for _, ev := range events {
			s.handler.OnPresence(ev)
		}
	}
	s.emitMu.Unlock()
	if s.obs != nil {
		s.obs.ObserveOutcome(op, out, time.Since(start))
	}
	return nil
}

// occupancy counts ev's change in its teams' present members, and names
// the teams it occupies or vacates.
func (s *Store) occupancy(ev *store.PresenceEvent) {
	c := ev.Change
	switch {
	case c.Previous == presence.Offline && c.State != presence.Offline:
		for _, t := range ev.Teams {
			m := s.present[t]
			if m == nil {
				m = make(map[string]struct{})
				s.present[t] = m
				ev.Occupied = append(ev.Occupied, t)
			}
			m[c.UserID] = struct{}{}
		}
	case c.Previous != presence.Offline && c.State == presence.Offline:
		for _, t := range ev.Teams {
			if _, counted := s.present[t][c.UserID]; counted && s.uncount(t, c.UserID) {
				ev.Vacated = append(ev.Vacated, t)
			}
		}
	}
}

// uncount takes user out of team's present members; true if that left
// none.
func (s *Store) uncount(team, user string) bool {
	m, ok := s.present[team]
	if !ok {
		return false
	}
	if _, counted := m[user]; !counted {
		return false
	}
	delete(m, user)
	if len(m) > 0 {
		return false
	}
	delete(s.present, team)
	return true
}

// memberView is a membership event's view of its user's teams: read from
// userOf while the change's memberMu is held (only membership writes
// userOf, under memberMu and mu), so O(log n) per team asked for a user in n
// teams.
type memberView struct {
	s    *Store
	user string
}

func (v memberView) In(_ context.Context, teams []string) ([]bool, error) {
	out := make([]bool, len(teams))
	mine := v.s.userOf[v.user]
	for i, t := range teams {
		_, out[i] = slices.BinarySearch(mine, t)
	}
	return out, nil
}

// List implements store.TeamsView.
func (v memberView) List(context.Context) ([]string, error) {
	return slices.Clone(v.s.userOf[v.user]), nil
}

func sortedKeys(m map[string]struct{}) []string {
	if len(m) == 0 {
		return nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// NextDeadline implements store.Scheduler.
func (s *Store) NextDeadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reported = s.tracker.NextPublish()
	return s.reported
}

// Rescheduled implements store.Scheduler.
func (s *Store) Rescheduled() <-chan struct{} { return s.rescheduled }
