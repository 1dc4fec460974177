package server

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/store"
)

// localUser is a user with at least one connection on this node.
type localUser struct {
	id    string
	conns []*client
	teams teamSet // nil until loaded
	gen   uint64  // bumped by every membership event, to detect stale loads
	// flight: membership catch-ups queued and not run yet (catchup.go);
	// nil when none. Guarded by the hub's mu.
	flight *catchUps
	// early: teams indexed before their join event came (ensureIndexed),
	// whose members the user was not given yet: that event's catch-up
	// gives them, to the connections listed (nil: every one). nil when
	// none.
	early map[string][]*client
}

// teamSet is a user's teams, sorted. A user is in a few teams: a map of one
// team cost ~270 bytes per user held, a slice of it 16.
type teamSet []string

func (s teamSet) has(team string) bool {
	_, ok := slices.BinarySearch(s, team)
	return ok
}

func (s *teamSet) add(team string) {
	if i, ok := slices.BinarySearch(*s, team); !ok {
		*s = slices.Insert(*s, i, team)
	}
}

func (s *teamSet) remove(team string) {
	if i, ok := slices.BinarySearch(*s, team); ok {
		*s = slices.Delete(*s, i, i+1)
	}
}

// hub indexes this node's connections by user and team and routes store
// events to them (route.go, resync.go). It implements store.Handler. The
// flusher writes what it queues; the worker runs its store queries.
type hub struct {
	srv    *Server
	flush  *flusher
	work   *worker
	views  *views   // what local viewers hold; nil unless the store is shared
	watch  *watches // who watches whom (large teams, largeteams.go)
	counts *counts  // large teams' counts and what viewers were told

	// routing: a resync holds it while it decides a team's differences
	// and queues them, and a join's catch-up while it decides what to send
	// and queues it; live routing (OnPresence) shares it. A change routed
	// after they read the store is queued behind what they queued, never
	// flushed ahead of it (a connection would get the older version
	// second). Taken before mu; only with views (a shared store).
	routing sync.RWMutex
	// beforePush, when set (tests), runs between such a decision for a
	// team and its pushes.
	beforePush func(team string)

	mu     sync.RWMutex
	users  map[string]*localUser
	byTeam map[string]map[*localUser]struct{}
	large  map[string]bool // teams with local members that are large (largeteams.go)
	nconns int
}

var (
	_ store.Handler  = (*hub)(nil)
	_ store.Resyncer = (*hub)(nil)
)

func newHub(s *Server) *hub {
	h := &hub{
		srv:    s,
		flush:  newFlusher(s),
		work:   newWorker(s),
		users:  make(map[string]*localUser),
		byTeam: make(map[string]map[*localUser]struct{}),
		large:  make(map[string]bool),
		watch:  newWatches(),
		counts: newCounts(),
	}
	if _, shared := s.store.(store.Watcher); shared {
		h.views = newViews()
	}
	return h
}

// add registers c and returns its user's teams, loaded from the store the
// first time the user connects here.
func (h *hub) add(ctx context.Context, c *client) ([]string, error) {
	teams, _, err := h.addAt(ctx, c)
	return teams, err
}

// addAt is add, which also returns the user's membership generation the
// teams are as of (see notGiven).
func (h *hub) addAt(ctx context.Context, c *client) ([]string, uint64, error) {
	h.mu.Lock()
	lu, ok := h.users[c.user]
	if !ok {
		lu = &localUser{id: c.user}
		h.users[c.user] = lu
	}
	lu.conns = append(lu.conns, c)
	h.nconns++
	loaded := lu.teams != nil
	h.mu.Unlock()
	if !loaded {
		if err := h.loadTeams(ctx, lu); err != nil {
			return nil, 0, err
		}
	}
	teams, gen := h.teamsAt(c.user)
	return teams, gen, nil
}

// loadTeams reads lu's teams; a membership event during the read makes it
// read again, so the index never keeps a stale list. The teams are watched
// before they are indexed, so no change routed through them is missed.
func (h *hub) loadTeams(ctx context.Context, lu *localUser) error {
	for {
		teams, gen, err := h.readTeams(ctx, lu)
		if err != nil {
			return err
		}
		large, err := h.classify(ctx, teams)
		if err != nil {
			return err
		}
		if err := h.watchTeams(ctx, teams); err != nil {
			return err
		}
		h.mu.Lock()
		if lu.gen != gen || lu.teams != nil {
			stale := lu.gen != gen
			h.mu.Unlock()
			h.unwatchLater(teams)
			if stale {
				continue
			}
			return nil // loaded meanwhile by another connection
		}
		lu.teams = make(teamSet, 0, len(teams))
		for _, t := range teams {
			h.joinLocked(lu, t, large[t])
		}
		h.mu.Unlock()
		return nil
	}
}

// readTeams reads lu's teams from the store, with lu's membership
// generation before the read: if it moved by the time the caller indexes,
// an event overtook the read.
func (h *hub) readTeams(ctx context.Context, lu *localUser) ([]string, uint64, error) {
	h.mu.RLock()
	gen := lu.gen
	h.mu.RUnlock()
	teams, err := h.srv.store.TeamsOf(ctx, lu.id)
	return teams, gen, err
}

// joinLocked indexes lu under team; it reports whether team is new here,
// and then makes it a large team if large.
func (h *hub) joinLocked(lu *localUser, team string, large bool) bool {
	lu.teams.add(team)
	set := h.byTeam[team]
	created := set == nil
	if created {
		set = make(map[*localUser]struct{})
		h.byTeam[team] = set
		if large {
			h.markLargeLocked(team)
		}
	}
	set[lu] = struct{}{}
	return created
}

// leaveLocked unindexes lu from team; it reports whether team is gone here.
func (h *hub) leaveLocked(lu *localUser, team string) bool {
	lu.teams.remove(team)
	delete(lu.early, team)
	if set := h.byTeam[team]; set != nil {
		delete(set, lu)
		if len(set) == 0 {
			delete(h.byTeam, team)
			h.forgetLargeLocked(team)
			if h.views != nil {
				h.views.dropTeam(team)
			}
			return true
		}
	}
	return false
}

// watchTeams asks a shared store for the events of teams, once per local user and
// team; unwatchLater (on the worker) gives them back. The store counts, and
// subscribes a team's channel while its count is positive.
func (h *hub) watchTeams(ctx context.Context, teams []string) error {
	w, ok := h.srv.store.(store.Watcher)
	if !ok || len(teams) == 0 {
		return nil
	}
	return w.Watch(ctx, teams)
}

func (h *hub) unwatchLater(teams []string) {
	w, ok := h.srv.store.(store.Watcher)
	if !ok || len(teams) == 0 {
		return
	}
	h.work.enqueue(func(context.Context) { w.Unwatch(teams) })
}

// joinWatched indexes a local user under a team they joined, once the team
// is watched, if they are still connected here and still a member.
func (h *hub) joinWatched(ctx context.Context, lu *localUser, team string, early bool) {
	large, err := h.classify(ctx, []string{team})
	if err != nil {
		h.srv.log.Warn("watch team", "err", err)
		return
	}
	if err := h.watchTeams(ctx, []string{team}); err != nil {
		h.srv.log.Warn("watch team", "err", err)
		return
	}
	for {
		teams, gen, err := h.readTeams(ctx, lu)
		if err != nil {
			h.unwatchLater([]string{team})
			return
		}
		h.mu.Lock()
		if lu.gen != gen {
			// A membership event of lu came during the read (a leave would
			// find the team not yet indexed and do nothing): read again.
			h.mu.Unlock()
			continue
		}
		member := lu.teams.has(team)
		ok := h.users[lu.id] == lu && lu.teams != nil && !member && slices.Contains(teams, team)
		if ok {
			h.joinLocked(lu, team, large[team])
			if early {
				lu.markEarly(team, nil)
			}
			if h.large[team] {
				h.countConnsLocked(lu)
			}
		}
		h.mu.Unlock()
		if !ok {
			h.unwatchLater([]string{team})
		}
		return
	}
}

// remove unregisters c; the last connection of a user drops the user.
func (h *hub) remove(c *client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	lu, ok := h.users[c.user]
	if !ok {
		return
	}
	h.dropConnLocked(c)
	// A Pusher socket's connection is never noted, nor named (bystanders).
	if h.views != nil && !c.noted.Load() && c.px == nil && lu.teams != nil {
		h.views.gone(lu.teams, c)
	}
	for i, x := range lu.conns {
		if x == c {
			lu.conns = append(lu.conns[:i], lu.conns[i+1:]...)
			h.nconns--
			break
		}
	}
	for team, only := range lu.early {
		if only == nil {
			continue // every connection
		}
		if only = slices.DeleteFunc(only, func(x *client) bool { return x == c }); len(only) == 0 {
			delete(lu.early, team)
		} else {
			lu.early[team] = only
		}
	}
	if len(lu.conns) > 0 {
		return
	}
	teams := slices.Clone(lu.teams)
	for _, t := range teams {
		h.leaveLocked(lu, t)
	}
	delete(h.users, c.user)
	h.unwatchLater(teams)
}

func (h *hub) count() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.nconns
}

// teamsOf returns a local user's teams (nil when not connected here).
func (h *hub) teamsOf(user string) []string {
	teams, _ := h.teamsAt(user)
	return teams
}

// teamsAt is teamsOf and the user's membership generation.
func (h *hub) teamsAt(user string) ([]string, uint64) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	lu, ok := h.users[user]
	if !ok {
		return nil, 0
	}
	return slices.Clone([]string(lu.teams)), lu.gen
}

// noteSnapshot records in views what a new connection c was given, before
// it is sent: a change routed meanwhile is folded into it, or follows it.
func (h *hub) noteSnapshot(c *client, members map[string][]string, ps []presence.Presence) {
	if h.views == nil {
		return
	}
	user := c.user
	byUser := make(map[string]*presence.Presence, len(ps))
	for i := range ps {
		byUser[ps[i].UserID] = &ps[i]
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	lu := h.users[user]
	if lu == nil {
		return
	}
	// Changes queued to c before this note (a join's push, under h.mu as
	// this is) are folded into the snapshot: c holds them, whatever its
	// read says.
	queued := c.queuedHolds()
	for team, ms := range members {
		set := h.byTeam[team]
		if _, in := set[lu]; !in {
			continue // left the team meanwhile
		}
		read := make([]*presence.Presence, 0, len(ms))
		for _, m := range ms {
			if p, ok := byUser[m]; ok {
				read = append(read, p)
			}
		}
		// Others here (other users, or this user's other connections) may
		// hold something else.
		h.views.readSnapshot(team, read, c, func() []*client { return bystanders(set, c) })
		h.views.lacking(team, byUser, queued, c, user)
		h.views.queuedTo(team, queued, byUser, c)
	}
	c.noted.Store(true)
}

// bystanders is the connections of set (a team's local members) other than
// c, at most maxOdds+1 of them: beyond maxOdds, odds name nobody. Pusher
// sockets are left out: never noted, they are sent every change anyway.
// The caller holds h.mu.
func bystanders(set map[*localUser]struct{}, c *client) []*client {
	var out []*client
	for lu := range set {
		for _, o := range lu.conns {
			if o == c || o.px != nil {
				continue
			}
			if out = append(out, o); len(out) > maxOdds {
				return out
			}
		}
	}
	return out
}

// drainAll tells every client to reconnect after a random delay within
// spread, and closes it with 1012.
func (h *hub) drainAll(spread time.Duration) {
	h.mu.RLock()
	var all []*client
	for _, lu := range h.users {
		all = append(all, lu.conns...)
	}
	h.mu.RUnlock()
	for _, c := range all {
		if c.px != nil {
			continue // a Pusher socket's: the Pusher side closes it with 4200 (pxServer.drain)
		}
		after := time.Duration(rand.Int64N(int64(spread) + 1))
		c.mu.Lock()
		// A connection still registering has had no welcome, which must
		// come first: it only gets the close, and its client retries.
		if c.welcomed {
			c.writeJSONLocked(protocol.Reconnect{Type: protocol.TypeReconnect, AfterMS: after.Milliseconds()})
		}
		c.mu.Unlock()
		c.closeWith(protocol.CloseServiceRestart, "service restart")
	}
}

// ensureIndexed indexes a local user under a team they just joined, now
// rather than when the join event comes: a Pusher presence channel needs
// the team's changes from its subscription on.
func (h *hub) ensureIndexed(ctx context.Context, user, team string) {
	h.mu.RLock()
	lu := h.users[user]
	indexed := false
	if lu != nil && lu.teams != nil {
		indexed = lu.teams.has(team)
	}
	h.mu.RUnlock()
	if lu != nil && !indexed {
		h.joinWatched(ctx, lu, team, true)
	}
}

// notGiven marks as early, for c, the teams the index holds for its user
// whose members c's connect read none of: the store had the user out of
// the team, its removal's event not here yet, or had lost the user's side,
// to be written back (finding 22). Should the team's join come instead of
// its removal, its catch-up gives c the members, which the index would
// otherwise take for given. It reports false when a membership event of
// the user came since gen (hub.add's): that join may have passed already.
//
// It reports false too when the read (r.teams) has the user in a team the
// connect did not use (used, hub.add's): the index lacks a join whose event
// has not come, or was lost and waits for a resync. The snapshot would
// leave the team's members out, and a client takes those it holds for
// offline (chaos, one Redis, seed 621771424: a reconnect at the heal of
// its node's cut from Redis).
func (h *hub) notGiven(c *client, gen uint64, used []string, r connectReads) bool {
	for _, t := range r.teams {
		if !slices.Contains(used, t) {
			return false
		}
	}
	members := r.members
	h.mu.Lock()
	defer h.mu.Unlock()
	lu := h.users[c.user]
	if lu == nil || lu.teams == nil || !slices.Contains(lu.conns, c) {
		return true // gone: remove ran, or runs
	}
	for team, ms := range members {
		if !lu.teams.has(team) || len(ms) > 0 {
			continue
		}
		if lu.gen != gen {
			return false
		}
		lu.markEarly(team, c)
	}
	return true
}

// markEarly notes that c (nil: every connection) was not given team's
// members. Guarded by the hub's mu.
func (lu *localUser) markEarly(team string, c *client) {
	if lu.early == nil {
		lu.early = make(map[string][]*client)
	}
	only, ok := lu.early[team]
	switch {
	case c == nil:
		lu.early[team] = nil
	case !ok:
		lu.early[team] = []*client{c}
	case only != nil:
		lu.early[team] = append(only, c)
	}
}
