package server

import (
	"context"
	"math/rand/v2"
	"runtime"
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
	teams map[string]struct{}
	gen   uint64 // bumped by every membership event, to detect stale loads
}

// hub indexes this node's connections by user and team and routes store
// events to them. It implements store.Handler.
type hub struct {
	srv *Server

	mu     sync.RWMutex
	users  map[string]*localUser
	byTeam map[string]map[*localUser]struct{}
	nconns int

	dirtyMu sync.Mutex
	dirty   []*client
	wake    chan struct{} // cap 1; never closed

	jobsMu  sync.Mutex
	jobs    []func(ctx context.Context)
	jobWake chan struct{} // cap 1; never closed
}

var (
	_ store.Handler  = (*hub)(nil)
	_ store.Resyncer = (*hub)(nil)
)

func newHub(s *Server) *hub {
	return &hub{
		srv:     s,
		users:   make(map[string]*localUser),
		byTeam:  make(map[string]map[*localUser]struct{}),
		wake:    make(chan struct{}, 1),
		jobWake: make(chan struct{}, 1),
	}
}

// add registers c and returns its user's teams, loaded from the store the
// first time the user connects here.
func (h *hub) add(ctx context.Context, c *client) ([]string, error) {
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
			return nil, err
		}
	}
	return h.teamsOf(c.user), nil
}

// loadTeams reads lu's teams; a membership event during the read makes it
// read again, so the index never keeps a stale list. The teams are watched
// before they are indexed, so no change routed through them is missed.
func (h *hub) loadTeams(ctx context.Context, lu *localUser) error {
	for {
		h.mu.RLock()
		gen := lu.gen
		h.mu.RUnlock()
		teams, err := h.srv.store.TeamsOf(ctx, lu.id)
		if err != nil {
			return err
		}
		if err := h.watch(ctx, teams); err != nil {
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
		lu.teams = make(map[string]struct{}, len(teams))
		for _, t := range teams {
			h.joinLocked(lu, t)
		}
		h.mu.Unlock()
		return nil
	}
}

// joinLocked indexes lu under team; it reports whether team is new here.
func (h *hub) joinLocked(lu *localUser, team string) bool {
	lu.teams[team] = struct{}{}
	set := h.byTeam[team]
	created := set == nil
	if created {
		set = make(map[*localUser]struct{})
		h.byTeam[team] = set
	}
	set[lu] = struct{}{}
	return created
}

// leaveLocked unindexes lu from team; it reports whether team is gone here.
func (h *hub) leaveLocked(lu *localUser, team string) bool {
	delete(lu.teams, team)
	if set := h.byTeam[team]; set != nil {
		delete(set, lu)
		if len(set) == 0 {
			delete(h.byTeam, team)
			return true
		}
	}
	return false
}

// watch asks a shared store for the events of teams, once per local user and
// team; unwatchLater (on the worker) gives them back. The store counts, and
// subscribes a team's channel while its count is positive.
func (h *hub) watch(ctx context.Context, teams []string) error {
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
	h.enqueue(func(context.Context) { w.Unwatch(teams) })
}

// joinWatched indexes a local user under a team they joined, once the team
// is watched, if they are still connected here and still a member.
func (h *hub) joinWatched(ctx context.Context, lu *localUser, team string) {
	if err := h.watch(ctx, []string{team}); err != nil {
		h.srv.log.Warn("watch team", "err", err)
		return
	}
	teams, err := h.srv.store.TeamsOf(ctx, lu.id)
	if err != nil {
		h.unwatchLater([]string{team})
		return
	}
	h.mu.Lock()
	_, member := lu.teams[team]
	ok := h.users[lu.id] == lu && lu.teams != nil && !member && slices.Contains(teams, team)
	if ok {
		h.joinLocked(lu, team)
	}
	h.mu.Unlock()
	if !ok {
		h.unwatchLater([]string{team})
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
	for i, x := range lu.conns {
		if x == c {
			lu.conns = append(lu.conns[:i], lu.conns[i+1:]...)
			h.nconns--
			break
		}
	}
	if len(lu.conns) > 0 {
		return
	}
	var teams []string
	for t := range lu.teams {
		h.leaveLocked(lu, t)
		teams = append(teams, t)
	}
	delete(h.users, c.user)
	h.unwatchLater(teams)
}

func (h *hub) count() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.nconns
}

// silent returns the connections that sent nothing since cutoff (unix nanos).
func (h *hub) silent(cutoff int64) []*client {
	h.mu.RLock()
	defer h.mu.RUnlock()
	var out []*client
	for _, lu := range h.users {
		for _, c := range lu.conns {
			if c.lastFrame.Load() < cutoff {
				out = append(out, c)
			}
		}
	}
	return out
}

// teamsOf returns a local user's teams (nil when not connected here).
func (h *hub) teamsOf(user string) []string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	lu, ok := h.users[user]
	if !ok {
		return nil
	}
	out := make([]string, 0, len(lu.teams))
	for t := range lu.teams {
		out = append(out, t)
	}
	return out
}

// OnPresence queues a change for every local connection of every user who
// shares one of the subject's teams, once each.
func (h *hub) OnPresence(ev store.PresenceEvent) {
	// The flusher is woken once the change is queued for every viewer, not
	// at the first: a round must not start with a fan-out half routed.
	defer h.kick()
	ch := wireChange(ev.Change)
	if ev.Via == "" || (len(ev.Teams) > 0 && ev.Via == ev.Teams[0]) {
		h.srv.metrics.changes.WithLabelValues(ch.State).Inc() // once, not once per team
	}
	n := 0
	h.mu.RLock()
	if ev.Via != "" {
		// One of several copies, one per team: deliver to the members for
		// whom Via is the first team they share with the subject.
		for lu := range h.byTeam[ev.Via] {
			if lu.id == ch.UserID || firstShared(lu.teams, ev.Teams) != ev.Via {
				continue
			}
			for _, c := range lu.conns {
				c.queue(ch, false, false)
				n++
			}
		}
		h.mu.RUnlock()
		h.srv.metrics.fanout.Observe(float64(n))
		return
	}
	var seen map[*localUser]struct{}
	if len(ev.Teams) > 1 {
		seen = make(map[*localUser]struct{})
	}
	for _, t := range ev.Teams {
		for lu := range h.byTeam[t] {
			if lu.id == ch.UserID {
				continue
			}
			if seen != nil {
				if _, dup := seen[lu]; dup {
					continue
				}
				seen[lu] = struct{}{}
			}
			for _, c := range lu.conns {
				c.queue(ch, false, false)
				n++
			}
		}
	}
	h.mu.RUnlock()
	h.srv.metrics.fanout.Observe(float64(n))
}

// OnMembership applies rule 7: a join makes the two sides visible to each
// other at once; after a removal nothing more passes between users who no
// longer share a team.
func (h *hub) OnMembership(ev store.MembershipEvent) {
	others := make(map[string]struct{}, len(ev.UserTeams))
	for _, t := range ev.UserTeams {
		if t != ev.Team {
			others[t] = struct{}{}
		}
	}
	h.mu.Lock()
	subject := h.users[ev.UserID]
	if subject != nil && subject.teams != nil {
		subject.gen++
		_, member := subject.teams[ev.Team]
		switch {
		case ev.Joined && !member:
			// Indexed only once watched (on the worker): routing by Via
			// through a team not yet subscribed would drop changes.
			h.enqueue(func(ctx context.Context) { h.joinWatched(ctx, subject, ev.Team) })
		case !ev.Joined && member:
			h.leaveLocked(subject, ev.Team)
			h.unwatchLater([]string{ev.Team})
		}
	} else if subject != nil {
		subject.gen++ // a load is under way; it will read again
	}
	for lu := range h.byTeam[ev.Team] {
		if lu.id == ev.UserID || sharesSet(lu.teams, others) {
			continue // could see the subject already, and still can
		}
		for _, c := range lu.conns {
			if ev.Joined {
				if ev.State != presence.Offline {
					c.push(protocol.Change{UserID: ev.UserID, State: ev.State.String(), Version: ev.Version, At: h.srv.cfg.Now().UnixMilli()}, true)
				}
			} else {
				c.drop(ev.UserID)
			}
		}
	}
	h.mu.Unlock()
	if subject != nil {
		// The subject's own connections need the other side: store queries,
		// so done off the event path.
		h.enqueue(func(ctx context.Context) { h.reconcileSubject(ctx, ev, others) })
	}
}

// reconcileSubject sends a user who joined a team the present members they
// could not see before, or drops queued changes of members they no longer
// share a team with.
func (h *hub) reconcileSubject(ctx context.Context, ev store.MembershipEvent, others map[string]struct{}) {
	s := h.srv
	members, err := s.store.Members(ctx, ev.Team)
	if err != nil {
		s.log.Warn("membership reconcile", "err", err)
		return
	}
	otherTeams := make([]string, 0, len(others))
	for t := range others {
		otherTeams = append(otherTeams, t)
	}
	stillVisible, err := s.visibleUsers(ctx, otherTeams, ev.UserID)
	if err != nil {
		s.log.Warn("membership reconcile", "err", err)
		return
	}
	already := make(map[string]struct{}, len(stillVisible))
	for _, u := range stillVisible {
		already[u] = struct{}{}
	}
	var fresh []string
	for _, m := range members {
		if _, ok := already[m]; !ok && m != ev.UserID {
			fresh = append(fresh, m)
		}
	}
	if len(fresh) == 0 {
		return
	}
	var ps []presence.Presence
	if ev.Joined {
		if ps, err = s.store.Presence(ctx, fresh); err != nil {
			s.log.Warn("membership reconcile", "err", err)
			return
		}
	}
	now := s.cfg.Now().UnixMilli()
	h.mu.RLock()
	defer h.mu.RUnlock()
	lu := h.users[ev.UserID]
	if lu == nil {
		return
	}
	for _, c := range lu.conns {
		if !ev.Joined {
			for _, m := range fresh {
				c.drop(m)
			}
			continue
		}
		for _, p := range ps {
			if p.State != presence.Offline {
				c.push(protocol.Change{UserID: p.UserID, State: p.State.String(), Version: p.Version, At: now}, true)
			}
		}
	}
}

// firstShared is the first of teams (sorted) that mine contains.
func firstShared(mine map[string]struct{}, teams []string) string {
	for _, t := range teams {
		if _, ok := mine[t]; ok {
			return t
		}
	}
	return ""
}

func sharesSet(a, b map[string]struct{}) bool {
	if len(a) > len(b) {
		a, b = b, a
	}
	for t := range a {
		if _, ok := b[t]; ok {
			return true
		}
	}
	return false
}

func wireChange(c presence.Change) protocol.Change {
	return protocol.Change{UserID: c.UserID, State: c.State.String(), Version: c.Version, At: c.At.UnixMilli()}
}

// OnResync implements store.Resyncer: every local connection is sent the
// current state of the users it may see; offline users at floor, so that an
// offline a viewer missed overrides the online it holds. Clients drop what
// they already hold.
func (h *hub) OnResync(floor uint64) {
	h.enqueue(func(context.Context) {
		h.mu.RLock()
		users := make([]*localUser, 0, len(h.users))
		for _, lu := range h.users {
			users = append(users, lu)
		}
		h.mu.RUnlock()
		now := h.srv.cfg.Now().UnixMilli()
		for _, lu := range users {
			// A deadline per user: a big node must not run out of time halfway.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			ps, err := h.srv.snapshot(ctx, lu.id, h.teamsOf(lu.id))
			cancel()
			if err != nil {
				h.srv.log.Warn("resync", "err", err)
				continue
			}
			h.mu.RLock()
			for _, c := range lu.conns {
				for _, p := range ps {
					v := p.Version
					if p.State == presence.Offline {
						v = max(v, floor)
					}
					c.push(protocol.Change{UserID: p.UserID, State: p.State.String(), Version: v, At: now}, true)
				}
			}
			h.mu.RUnlock()
		}
	})
}

// markDirty puts c on the flusher's list.
// Unless wake is false (the caller kicks the flusher itself once it has
// queued a whole fan-out), it wakes the flusher.
func (h *hub) markDirty(c *client, wake bool) {
	h.dirtyMu.Lock()
	h.dirty = append(h.dirty, c)
	h.dirtyMu.Unlock()
	if wake {
		h.kick()
	}
}

func (h *hub) kick() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// flushLoop writes queued changes. Rounds start at most every FlushDelay,
// which batches a burst into one frame per connection; a large round is
// split over a few goroutines, since each write is a system call.
func (h *hub) flushLoop() {
	defer h.srv.wg.Done()
	var batch []*client
	var last time.Time
	for {
		select {
		case <-h.srv.stop:
			return
		case <-h.wake:
		}
		// A change after a quiet spell goes out at once; under churn,
		// rounds start at most every FlushDelay, so a round batches (and
		// coalesces) whatever arrived while the previous one was written.
		if wait := h.srv.cfg.FlushDelay - time.Since(last); wait > 0 {
			time.Sleep(wait)
		}
		last = time.Now()
		h.dirtyMu.Lock()
		batch, h.dirty = h.dirty, batch[:0]
		h.dirtyMu.Unlock()
		h.flushAll(batch)
		clear(batch)
	}
}

func (h *hub) flushAll(batch []*client) {
	const perWorker = 256
	workers := min(runtime.GOMAXPROCS(0), (len(batch)+perWorker-1)/perWorker)
	if workers <= 1 {
		var enc frameCache
		for _, c := range batch {
			c.flush(&enc)
		}
		return
	}
	var wg sync.WaitGroup
	chunk := (len(batch) + workers - 1) / workers
	for i := 0; i < len(batch); i += chunk {
		part := batch[i:min(i+chunk, len(batch))]
		wg.Add(1)
		go func() { // waited for below: owned by this round
			defer wg.Done()
			var enc frameCache
			for _, c := range part {
				c.flush(&enc)
			}
		}()
	}
	wg.Wait()
}

// enqueue runs job on the worker goroutine.
func (h *hub) enqueue(job func(ctx context.Context)) {
	h.jobsMu.Lock()
	h.jobs = append(h.jobs, job)
	h.jobsMu.Unlock()
	select {
	case h.jobWake <- struct{}{}:
	default:
	}
}

func (h *hub) workLoop() {
	defer h.srv.wg.Done()
	for {
		select {
		case <-h.srv.stop:
			return
		case <-h.jobWake:
		}
		h.jobsMu.Lock()
		jobs := h.jobs
		h.jobs = nil
		h.jobsMu.Unlock()
		for _, job := range jobs {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			job(ctx)
			cancel()
		}
	}
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
		after := time.Duration(rand.Int64N(int64(spread) + 1))
		c.writeJSON(protocol.Reconnect{Type: protocol.TypeReconnect, AfterMS: after.Milliseconds()})
		c.closeWith(protocol.CloseServiceRestart, "service restart")
	}
}
