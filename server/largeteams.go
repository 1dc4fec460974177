package server

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/store"
)

// Large teams (DESIGN.md Part 1b): in a team of more than --large-team
// members, a viewer is sent neither the members in the snapshot nor their
// changes, unless it watches them. A change then costs O(its watchers), and
// a connect O(the viewer's small teams), whatever the size of the team.
//
// Whether a team is large is decided on each node when the team gets its
// first local member (one MemberCount), and holds while it has local
// members: the snapshots given and the changes routed agree for as long as
// any viewer here holds one.

// countsEvery is the least time between two team_counts frames to one
// connection; countsTick how often the counts loop looks for changes.
const (
	countsEvery = 2 * time.Second
	countsTick  = 250 * time.Millisecond
)

// watches is who watches whom, per connection, bounded by
// protocol.MaxWatched per connection and dropped when it closes.
type watches struct {
	mu      sync.Mutex
	bySubj  map[string]map[*client]struct{}
	byConn  map[*client]map[string]struct{}
	lastVer map[string]uint64 // newest version routed to a subject's watchers: older copies are dropped
}

func newWatches() *watches {
	return &watches{
		bySubj:  make(map[string]map[*client]struct{}),
		byConn:  make(map[*client]map[string]struct{}),
		lastVer: make(map[string]uint64),
	}
}

// add makes c watch ids; it refuses (changing nothing) when c would watch
// more than MaxWatched users. It returns the ids newly watched.
func (w *watches) add(c *client, ids []string) ([]string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	mine := w.byConn[c]
	var fresh []string
	seen := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		if _, dup := seen[id]; dup {
			continue
		}
		seen[id] = struct{}{}
		if _, ok := mine[id]; !ok {
			fresh = append(fresh, id)
		}
	}
	if len(mine)+len(fresh) > protocol.MaxWatched {
		return nil, false
	}
	if mine == nil && len(fresh) > 0 {
		mine = make(map[string]struct{}, len(fresh))
		w.byConn[c] = mine
	}
	for _, id := range fresh {
		mine[id] = struct{}{}
		set := w.bySubj[id]
		if set == nil {
			set = make(map[*client]struct{})
			w.bySubj[id] = set
		}
		set[c] = struct{}{}
	}
	return fresh, true
}

// remove stops c watching ids.
func (w *watches) remove(c *client, ids []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	mine := w.byConn[c]
	for _, id := range ids {
		if _, ok := mine[id]; !ok {
			continue
		}
		delete(mine, id)
		w.dropLocked(c, id)
	}
	if len(mine) == 0 {
		delete(w.byConn, c)
	}
}

// drop forgets every watch of c (closed).
func (w *watches) drop(c *client) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id := range w.byConn[c] {
		w.dropLocked(c, id)
	}
	delete(w.byConn, c)
}

func (w *watches) dropLocked(c *client, subject string) {
	set := w.bySubj[subject]
	delete(set, c)
	if len(set) == 0 {
		delete(w.bySubj, subject)
		delete(w.lastVer, subject)
	}
}

// count is how many users c watches.
func (w *watches) count(c *client) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.byConn[c])
}

// take returns the watchers of subject if a change at version is news to
// them (not a copy already routed through another team channel), and
// records it as routed.
func (w *watches) take(subject string, version uint64) []*client {
	w.mu.Lock()
	defer w.mu.Unlock()
	set := w.bySubj[subject]
	if len(set) == 0 || version <= w.lastVer[subject] {
		return nil
	}
	w.lastVer[subject] = version
	out := make([]*client, 0, len(set))
	for c := range set {
		out = append(out, c)
	}
	return out
}

// watchersOf returns the watchers of subject.
func (w *watches) watchersOf(subject string) []*client {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]*client, 0, len(w.bySubj[subject]))
	for c := range w.bySubj[subject] {
		out = append(out, c)
	}
	return out
}

// watched reports whether anyone here watches subject.
func (w *watches) watched(subject string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.bySubj[subject]) > 0
}

// tally counts a large team's members and those not offline, from one read
// of the team when it gets its first local member here, then from the
// changes and membership events the node receives for it anyway (it
// watches the team's channel for its local members' sake).
type tally struct {
	ready   bool
	members map[string]tallyEntry
	online  int
	left    map[string]struct{} // while loading: left since the read began
}

type tallyEntry struct {
	version uint64
	on      bool // not offline: online, away or dnd
}

// set records subject's state at version, unless an older one.
func (t *tally) set(subject string, version uint64, on bool) {
	cur, ok := t.members[subject]
	if ok && cur.version >= version {
		return
	}
	if ok && cur.on {
		t.online--
	}
	if on {
		t.online++
	}
	t.members[subject] = tallyEntry{version: version, on: on}
}

func (t *tally) remove(subject string) {
	if cur, ok := t.members[subject]; ok {
		if cur.on {
			t.online--
		}
		delete(t.members, subject)
	}
	if !t.ready {
		t.left[subject] = struct{}{}
	}
}

// counts holds the tallies of this node's large teams and what each
// connection was last told; guarded by mu, taken after hub.mu.
type counts struct {
	mu      sync.Mutex
	tallies map[string]*tally
	sent    map[*client]*connCounts
}

// connCounts is what one connection was last sent, and when.
type connCounts struct {
	at    time.Time         // when it was last told; zero: never
	since time.Time         // when it began to be owed counts
	sent  map[string][2]int // team → member count, online count
}

func newCounts() *counts {
	return &counts{tallies: make(map[string]*tally), sent: make(map[*client]*connCounts)}
}

// isLargeLocked reports whether team is large here; h.mu held.
func (h *hub) isLargeLocked(team string) bool { return h.large[team] }

// classify reads the member count of teams, for the indexing to come: it
// returns the large ones.
func (h *hub) classify(ctx context.Context, teams []string) (map[string]bool, error) {
	out := make(map[string]bool)
	limit := h.srv.cfg.LargeTeam
	// 0 only in a Server not made by New (New sets the default).
	if limit <= 0 || len(teams) == 0 {
		return out, nil
	}
	// A team indexed here already keeps the mode it was given: only the
	// others cost a count (a round trip each on Redis).
	var unknown []string
	h.mu.RLock()
	for _, t := range teams {
		if h.byTeam[t] != nil {
			out[t] = h.large[t]
		} else {
			unknown = append(unknown, t)
		}
	}
	h.mu.RUnlock()
	for _, t := range unknown {
		var n int
		err := h.srv.timed(store.OpQuery, func() error {
			var err error
			if mc, ok := h.srv.store.(store.MemberCounter); ok {
				n, err = mc.MemberCount(ctx, t)
				return err
			}
			ms, err := h.srv.store.Members(ctx, t)
			n = len(ms)
			return err
		})
		if err != nil {
			return nil, err
		}
		if n > limit {
			out[t] = true
		}
	}
	return out, nil
}

// markLargeLocked is called when team gets its first local member: a large
// team gets a tally, loaded on the worker. h.mu held.
func (h *hub) markLargeLocked(team string) {
	h.large[team] = true
	h.counts.mu.Lock()
	t := &tally{members: make(map[string]tallyEntry), left: make(map[string]struct{})}
	h.counts.tallies[team] = t
	h.counts.mu.Unlock()
	h.work.enqueue(func(ctx context.Context) { h.loadTally(ctx, team, t) })
}

// forgetLargeLocked is called when team's last local member left. h.mu held.
func (h *hub) forgetLargeLocked(team string) {
	if !h.large[team] {
		return
	}
	delete(h.large, team)
	h.counts.mu.Lock()
	delete(h.counts.tallies, team)
	h.counts.mu.Unlock()
}

// loadTally reads a large team once: its members and their states. What
// the node received meanwhile is newer, and kept.
func (h *hub) loadTally(ctx context.Context, team string, t *tally) {
	members, err := h.srv.teamMembers(ctx, []string{team})
	var ps []presence.Presence
	if err == nil {
		ps, err = h.srv.readWholeStates(ctx, members[team])
	}
	if err != nil {
		h.srv.log.Warn("large team counts", "team", team, "err", err)
		// The resync (or the team's next first member) reads it again;
		// until then its viewers get no team_counts.
		return
	}
	h.counts.mu.Lock()
	defer h.counts.mu.Unlock()
	for _, p := range ps {
		if _, gone := t.left[p.UserID]; gone {
			continue
		}
		t.set(p.UserID, p.Version, p.State != presence.Offline)
	}
	t.ready, t.left = true, nil
}

// reloadTally replaces a large team's tally by the truth a resync read,
// keeping the newer states the node received since.
func (h *hub) reloadTally(team string, truth []presence.Presence) {
	h.counts.mu.Lock()
	defer h.counts.mu.Unlock()
	old := h.counts.tallies[team]
	if old == nil {
		return
	}
	t := &tally{members: make(map[string]tallyEntry, len(truth)), ready: true}
	for _, p := range truth {
		t.set(p.UserID, p.Version, p.State != presence.Offline)
		if cur, ok := old.members[p.UserID]; ok {
			t.set(p.UserID, cur.version, cur.on)
		}
	}
	h.counts.tallies[team] = t
}

// tallyChange counts a change in the subject's large teams here. h.mu held.
func (h *hub) tallyChangeLocked(ev store.PresenceEvent) {
	if len(h.large) == 0 {
		return
	}
	h.counts.mu.Lock()
	defer h.counts.mu.Unlock()
	for _, team := range ev.Teams {
		if t := h.counts.tallies[team]; t != nil {
			t.set(ev.Change.UserID, ev.Change.Version, ev.Change.State != presence.Offline)
		}
	}
}

// tallyMembershipLocked counts a join or a leave of a large team. h.mu held.
func (h *hub) tallyMembershipLocked(ev store.MembershipEvent) {
	h.counts.mu.Lock()
	defer h.counts.mu.Unlock()
	t := h.counts.tallies[ev.Team]
	if t == nil {
		return
	}
	if ev.Joined {
		t.set(ev.UserID, ev.Version, ev.State != presence.Offline)
		delete(t.left, ev.UserID)
	} else {
		t.remove(ev.UserID)
	}
}

// routeWatchers queues a change for the connections that watch its subject
// and share a team with it now (ev.Teams), other than users reached already
// through a small team (seen). h.mu held (read).
func (h *hub) routeWatchersLocked(ev store.PresenceEvent, ch protocol.Change, seen map[*localUser]struct{}) int {
	n := 0
	for _, c := range h.watch.take(ch.UserID, ch.Version) {
		lu := h.users[c.user]
		if lu == nil || lu.id == ch.UserID {
			continue
		}
		if _, dup := seen[lu]; dup {
			continue
		}
		if !sharesList(lu.teams, ev.Teams) {
			continue // visibility: no team shared at the change
		}
		c.queue(ch, false, false)
		n++
	}
	return n
}

func sharesList(set teamSet, teams []string) bool {
	for _, t := range teams {
		if set.has(t) {
			return true
		}
	}
	return false
}

// smallTeams is teams without the large ones (for the snapshot).
func (h *hub) smallTeams(teams []string) []string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]string, 0, len(teams))
	for _, t := range teams {
		if !h.large[t] {
			out = append(out, t)
		}
	}
	return out
}

// afterSnapshot starts c's team_counts if its user has a large team: at
// once if every one is counted, else (countsLoop) once they are, or
// countsEvery after the snapshot with those counted by then. Only such
// connections are looked at by the counts loop; a user who joins a large
// team later is added then (countConnsLocked).
func (h *hub) afterSnapshot(c *client) {
	h.mu.RLock()
	lu := h.users[c.user]
	if lu == nil || !h.hasLargeLocked(lu) {
		h.mu.RUnlock()
		return
	}
	h.counts.mu.Lock()
	cc := h.counts.sent[c]
	if cc == nil {
		cc = &connCounts{since: h.srv.cfg.Now(), sent: make(map[string][2]int)}
		h.counts.sent[c] = cc
	}
	frame := h.countsDueLocked(lu, cc, h.srv.cfg.Now())
	h.counts.mu.Unlock()
	h.mu.RUnlock()
	if frame != nil {
		c.writeJSON(frame)
	}
}

func (h *hub) hasLargeLocked(lu *localUser) bool {
	for _, t := range lu.teams {
		if h.large[t] {
			return true
		}
	}
	return false
}

// countConnsLocked makes the counts loop look at lu's connections that
// have had their snapshot (the others start in afterSnapshot), after lu
// joined a large team. h.mu held.
func (h *hub) countConnsLocked(lu *localUser) {
	h.counts.mu.Lock()
	defer h.counts.mu.Unlock()
	for _, c := range lu.conns {
		if _, ok := h.counts.sent[c]; ok {
			continue
		}
		c.mu.Lock()
		ready := c.ready
		c.mu.Unlock()
		if ready {
			h.counts.sent[c] = &connCounts{since: h.srv.cfg.Now(), sent: make(map[string][2]int)}
		}
	}
}

// countsDueLocked is the team_counts frame owed to a connection of lu: its
// large teams whose counts changed since it was last told, if it was told
// countsEvery ago or more; nil if nothing is owed. h.mu and counts.mu held.
func (h *hub) countsDueLocked(lu *localUser, cc *connCounts, now time.Time) *protocol.TeamCounts {
	if !cc.at.IsZero() && now.Sub(cc.at) < countsEvery {
		return nil
	}
	// The first frame holds every large team of the viewer: sent with the
	// teams counted so far, a team still loading waited countsEvery after
	// it (TestLargeTeamCounts under load). A team whose count cannot be
	// read (Redis away) holds it back countsEvery at most.
	if cc.at.IsZero() && now.Sub(cc.since) < countsEvery && h.countingLocked(lu) {
		return nil
	}
	var out []protocol.TeamCount
	for _, team := range lu.teams {
		t := h.counts.tallies[team]
		if t == nil || !t.ready {
			continue
		}
		now := [2]int{len(t.members), t.online}
		if prev, ok := cc.sent[team]; ok && prev == now {
			continue
		}
		cc.sent[team] = now
		out = append(out, protocol.TeamCount{TeamID: team, MemberCount: now[0], OnlineCount: now[1]})
	}
	for team := range cc.sent {
		if !lu.teams.has(team) || !h.large[team] {
			delete(cc.sent, team) // left: a re-join counts as new
		}
	}
	if len(out) == 0 {
		return nil
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TeamID < out[j].TeamID })
	cc.at = now
	return &protocol.TeamCounts{Type: protocol.TypeTeamCounts, Teams: out}
}

// countingLocked reports whether a large team of lu is still being
// counted. h.mu and counts.mu held.
func (h *hub) countingLocked(lu *localUser) bool {
	for _, team := range lu.teams {
		if !h.large[team] {
			continue
		}
		if t := h.counts.tallies[team]; t == nil || !t.ready {
			return true
		}
	}
	return false
}

// sendDueCounts sends every connection the team_counts it is owed.
func (h *hub) sendDueCounts() {
	now := h.srv.cfg.Now()
	type due struct {
		c *client
		f *protocol.TeamCounts
	}
	var out []due
	h.mu.RLock()
	h.counts.mu.Lock()
	if len(h.counts.tallies) > 0 {
		for c, cc := range h.counts.sent {
			if lu := h.users[c.user]; lu != nil {
				if f := h.countsDueLocked(lu, cc, now); f != nil {
					out = append(out, due{c, f})
				}
			}
		}
	}
	h.counts.mu.Unlock()
	h.mu.RUnlock()
	for _, d := range out {
		d.c.writeJSON(d.f)
	}
}

// countsLoop sends the team_counts owed, until the server stops.
func (s *Server) countsLoop() {
	defer s.wg.Done()
	t := time.NewTicker(countsTick)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.hub.sendDueCounts()
		}
	}
}

// dropConnLocked forgets c's watches and counts. h.mu held.
func (h *hub) dropConnLocked(c *client) {
	h.watch.drop(c)
	h.counts.mu.Lock()
	delete(h.counts.sent, c)
	h.counts.mu.Unlock()
}

// answerWatch registers a watch frame's ids, then answers with their
// presence: a change after the read reaches c as a presence frame.
func (s *Server) answerWatch(ctx context.Context, c *client, w *protocol.Watch) {
	fresh, ok := s.hub.watch.add(c, w.UserIDs)
	if !ok {
		s.metrics.framesRejected.WithLabelValues(reasonBadRequest).Inc()
		c.writeJSON(protocol.Error{Type: protocol.TypeError, Code: protocol.CodeBadRequest,
			Message: "a connection watches at most 2000 users; unwatch some first"})
		return
	}
	users, e := s.presenceFor(ctx, c, w.UserIDs)
	if e != nil {
		s.hub.watch.remove(c, fresh) // nothing changed
		c.writeJSON(*e)
		return
	}
	id := w.ID
	if len(id) == 0 {
		id = []byte("null")
	}
	c.writeJSON(protocol.WatchResult{Type: protocol.TypeWatchResult, ID: id, Users: users})
}

// resyncLarge is the resync of a large team (false if team is not one):
// its counts are read again, and the watchers of its members are sent the
// states newer than what was routed to them. The caller holds routing, as
// for resync's other teams.
func (h *hub) resyncLarge(team string, truth []presence.Presence, at time.Time) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if !h.large[team] {
		return false
	}
	h.reloadTally(team, truth)
	type given struct {
		ch protocol.Change
		to []*client
	}
	var gives []given
	for _, p := range truth {
		ws := h.watch.take(p.UserID, p.Version)
		if len(ws) == 0 {
			continue
		}
		ch := wireChange(p.ChangeAt(p.Version, time.Time{}))
		ch.At = at.UnixMilli()
		gives = append(gives, given{ch, ws})
	}
	if h.beforePush != nil && len(gives) > 0 {
		h.beforePush(team)
	}
	sent := 0
	for _, g := range gives {
		for _, c := range g.to {
			lu := h.users[c.user]
			if lu == nil || lu.id == g.ch.UserID {
				continue
			}
			if lu.teams.has(team) {
				c.push(g.ch, true)
				sent++
			}
		}
	}
	h.srv.metrics.resyncDeliveries.Add(float64(sent))
	return true
}
