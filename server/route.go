package server

import (
	"context"
	"errors"
	"iter"
	"slices"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/store"
)

// OnPresence queues a change for every local connection of every user who
// shares one of the subject's teams, once each. With a shared store the
// change arrives once per team channel; views lets the first copy through
// to the members of all the teams it names, and drops the others.
func (h *hub) OnPresence(ev store.PresenceEvent) {
	// The flusher is woken once the change is queued for every viewer, not
	// at the first: a round must not start with a fan-out half routed.
	defer h.flush.kick()
	ch := wireChange(ev.Change)
	routed := h.views == nil
	n := 0
	var seen map[*localUser]struct{}
	watched := h.watch.watched(ch.UserID)
	if len(ev.Teams) > 1 || watched {
		seen = make(map[*localUser]struct{})
	}
	if h.views != nil {
		h.routing.RLock()
		defer h.routing.RUnlock()
	}
	h.mu.RLock()
	h.tallyChangeLocked(ev)
	// Large teams' members reach only their watchers (routeWatchersLocked).
	teams := ev.Teams
	if len(h.large) > 0 {
		teams = make([]string, 0, len(ev.Teams))
		for _, t := range ev.Teams {
			if !h.large[t] {
				teams = append(teams, t)
			}
		}
	}
	var deliver []reach
	if h.views != nil {
		all := teams
		teams = make([]string, 0, len(all))
		for _, t := range all {
			if len(h.byTeam[t]) > 0 {
				teams = append(teams, t)
			}
		}
		deliver = make([]reach, len(teams))
		h.views.route(teams, ev.Change, deliver)
	}
	for i, t := range teams {
		if deliver != nil && !deliver[i].any() {
			continue
		}
		routed = true
		if h.srv.px != nil {
			h.srv.px.teamChange(t, ev.Change)
		}
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
				if deliver != nil && !deliver[i].to(c) {
					continue // holds it already
				}
				if c.queue(ch, false, false) {
					lu.flight.note(ch)
				}
				n++
			}
		}
	}
	if watched {
		w := h.routeWatchersLocked(ev, ch, seen)
		routed = routed || w > 0
		n += w
	}
	h.mu.RUnlock()
	if routed {
		h.srv.metrics.changes.WithLabelValues(ch.State).Inc()
		h.srv.metrics.fanout.Observe(float64(n))
	}
}

// OnMembership applies rule 7: a join makes the two sides visible to each
// other at once; after a removal nothing more passes between users who no
// longer share a team.
func (h *hub) OnMembership(ev store.MembershipEvent) {
	if h.srv.px != nil {
		h.srv.px.teamMembership(ev)
	}
	ctx, cancel := context.WithTimeout(context.Background(), membershipReadTimeout)
	defer cancel()
	var leftViews map[string]uint64 // the subject left: what its members held
	st := subjectTeams{in: make(map[string]bool)}
	h.mu.Lock()
	// Which of the viewers' other teams the subject is in, read from the
	// event's view without the lock (on Redis a round trip when the subject
	// is in many teams): the viewers' teams are few, the subject's may be
	// thousands. The index may move meanwhile: asked until nothing is
	// missing.
	for {
		ask := h.unknownLocked(ev, &st)
		if len(ask) == 0 {
			break
		}
		h.mu.Unlock()
		err := st.read(ctx, ev.UserTeams, ask)
		h.mu.Lock()
		if err != nil {
			// Taken for no other team: a viewer is hidden rather than left
			// to hear a user it may no longer share a team with.
			h.srv.log.Warn("membership: the user's teams", "err", err)
			st.failed = true
			break
		}
	}
	large := h.large[ev.Team]
	if large {
		h.tallyMembershipLocked(ev)
	}
	watching := make(map[*client]struct{})
	for _, c := range h.watch.watchersOf(ev.UserID) {
		watching[c] = struct{}{}
	}
	subject := h.users[ev.UserID]
	// sharesOther: lu shares with the subject a team other than ev.Team
	// through which it sees them: a small one, or any when it watches them.
	// With a shared store, a small team counts once its members were given
	// the subject (its view holds them): the event may list a team joined
	// since, whose own event will take this team for the one that showed
	// the subject (finding 8 of docs/reliability-findings.md).
	sharesOther := func(lu *localUser, watches bool) (via string, ok bool) {
		for _, t := range lu.teams {
			if t == ev.Team || !st.in[t] {
				continue
			}
			if f := lu.flight; f != nil && f.joining[t] > 0 {
				continue // lu's own catch-up of t has not run: not shown yet
			}
			if h.large[t] {
				if watches {
					return "", true
				}
				continue
			}
			if h.views == nil {
				return t, true
			}
			if _, given := h.views.get(t, ev.UserID); given {
				return t, true
			}
		}
		return "", false
	}
	left := false      // the subject was indexed under the team it left
	again := false     // the subject was given the team's members already
	var only []*client // of an early team, the connections not given them (nil: all)
	if subject != nil && subject.teams != nil {
		subject.gen++
		member := subject.teams.has(ev.Team)
		var early bool
		only, early = subject.early[ev.Team]
		delete(subject.early, ev.Team)
		switch {
		case ev.Joined && member && !early && (subject.flight == nil || subject.flight.joining[ev.Team] == 0):
			// A join of a team the subject was in already here (memberships
			// written back after a FLUSHALL: each is a join to Redis): their
			// snapshot or an earlier catch-up showed its members, so a
			// catch-up would send them again (chaos seed 4120: resent).
			// Not while a catch-up of the team is in flight: it may find
			// the subject out and give nothing (flight.holds stops what it
			// would send twice).
			again = true
		case ev.Joined && !member:
			// Indexed only once watched (on the worker): a change routed
			// through a team not yet subscribed could be missed.
			h.work.enqueue(func(ctx context.Context) { h.joinWatched(ctx, subject, ev.Team, false) })
		case !ev.Joined && member:
			if h.views != nil {
				leftViews = h.views.versions(ev.Team)
			}
			h.leaveLocked(subject, ev.Team)
			h.unwatchLater([]string{ev.Team})
			left = true
		}
	} else if subject != nil {
		subject.gen++ // a load is under way; it will read again
	}
	catchUp := subject != nil && !large && !again
	if catchUp {
		subject.catchUpLocked(ev.Team, ev.Joined, left)
	}
	// The state the event carries was read when the membership changed; a
	// change naming the team may have overtaken the event since, and been
	// routed to the team's members already.
	shown := presence.Presence{UserID: ev.UserID, State: ev.State, Version: ev.Version}
	if ev.Presence != nil {
		shown = *ev.Presence // the whole entry, status text included, when the store gave it
	}
	given := false            // the members hold shown or newer: nothing to push
	var to *reach             // when set, the members to push to (others hold shown)
	var hiddenAt uint64       // after a removal: the version the members may hold
	var placed *odds          // with to: the odds the view holds meanwhile
	var kept map[*client]held // of to, those skipped, and what they hold
	if h.views != nil && h.byTeam[ev.Team] != nil && !large {
		cur, ok := h.views.get(ev.Team, ev.UserID)
		switch {
		case !ev.Joined:
			hiddenAt = cur.version
			h.views.forget(ev.Team, ev.UserID)
		case ok && cur.version >= ev.Version && cur.odd == nil:
			given = true
		case ok && cur.version >= ev.Version:
			// Pushed below to the members whose hold differs: not to one
			// whose snapshot, read after the join was written, holds it
			// (chaos seed 245067116: the same version twice). The view
			// is unsure meanwhile, and after it (views.pushed) knows who
			// holds what again.
			r, o := h.views.unsureReach(ev.Team, ev.UserID)
			to, placed = &r, o
			shown = cur.presence(ev.UserID)
		default:
			h.views.read(ev.Team, shown, nil, false)
		}
	}
	type notedPush struct {
		lu *localUser
		ch protocol.Change
	}
	var noted []notedPush // noted once each of lu's connections had its turn
	// skip notes a connection of to not pushed: it holds what team via
	// showed it, as that team's view says, or something not known.
	skip := func(c *client, via string) {
		if to == nil || !to.to(c) {
			return
		}
		hd, ok := held{}, false
		if via != "" {
			hd, ok = h.views.heldBy(via, ev.UserID, c)
		}
		if !ok {
			hd = held{unknown: true}
		}
		if kept == nil {
			kept = make(map[*client]held)
		}
		kept[c] = hd
	}
	for lu, c := range h.viewersLocked(ev, large) {
		if lu.id == ev.UserID {
			continue
		}
		if via, ok := sharesOther(lu, false); ok {
			skip(c, via)
			continue // could see the subject already, and still can
		}
		if _, w := watching[c]; w {
			if _, ok := sharesOther(lu, true); ok {
				skip(c, "")
				continue // watches the subject, and still shares a team
			}
		}
		if ev.Joined {
			if lu.flight.holds(ev.UserID, shown.Version) {
				skip(c, "")
				continue // reached lu since its own catch-up began: no news
			}
			pushed := false
			if stale, was := c.unhide(ev.UserID); !given && (stale || (shown.State != presence.Offline && (to == nil || to.to(c)))) {
				ch, ok := c.pushCatchUp(shown, was, h.srv.cfg.Now())
				if ok && lu.flight != nil {
					noted = append(noted, notedPush{lu, ch})
				}
				pushed = ok
			}
			if !pushed {
				skip(c, "") // an offline not pushed: it may hold another state
			}
		} else {
			if c.hide(ev.UserID, hiddenAt) {
				lu.flight.forget(ev.UserID) // what was queued of them went unsent
			}
		}
	}
	for _, n := range noted {
		n.lu.flight.note(n.ch)
	}
	if to != nil {
		h.views.pushed(ev.Team, ev.UserID, placed, kept)
	}
	h.mu.Unlock()
	if catchUp {
		// The subject's own connections need the other side: store queries,
		// so done off the event path.
		h.work.enqueue(func(ctx context.Context) {
			out := h.reconcileSubject(ctx, ev, subject, leftViews, only)
			h.mu.Lock()
			subject.caughtUpLocked(ev.Team, ev.Joined, left)
			if ev.Joined {
				delete(subject.early, ev.Team) // given them now
				if out && subject.teams.has(ev.Team) {
					// A later join gives them, to the connections here now:
					// one made since reads them in its snapshot.
					for _, c := range subject.conns {
						subject.markEarly(ev.Team, c)
					}
				}
			}
			h.mu.Unlock()
		})
	}
}

// membershipReadTimeout bounds a membership event's reads of its user's
// teams (store.TeamsView).
const membershipReadTimeout = 5 * time.Second

// viewersLocked yields the local connections a membership event of team
// ev.Team is about (the subject's among them): in a large team, only the
// subject's watchers.
func (h *hub) viewersLocked(ev store.MembershipEvent, large bool) iter.Seq2[*localUser, *client] {
	return func(yield func(*localUser, *client) bool) {
		if large {
			for _, c := range h.watch.watchersOf(ev.UserID) {
				if lu := h.users[c.user]; lu != nil {
					if _, in := h.byTeam[ev.Team][lu]; in && !yield(lu, c) {
						return
					}
				}
			}
			return
		}
		for lu := range h.byTeam[ev.Team] {
			for _, c := range lu.conns {
				if !yield(lu, c) {
					return
				}
			}
		}
	}
}

// subjectTeams is what a membership event's handler read of the subject's
// teams after the change.
type subjectTeams struct {
	in     map[string]bool // team asked → the subject is a member
	failed bool            // a read failed: the teams not read count as not theirs
}

// unknownLocked lists the teams OnMembership has yet to ask about: whether
// the subject is in each of the other teams of the viewers. (The subject's
// own catch-up goes by what it was sent, not by its teams: catchup.go.)
func (h *hub) unknownLocked(ev store.MembershipEvent, st *subjectTeams) []string {
	if st.failed {
		return nil
	}
	var ask []string
	asked := make(map[string]struct{})
	for lu := range h.viewersLocked(ev, h.large[ev.Team]) {
		if lu.id == ev.UserID {
			continue
		}
		for _, t := range lu.teams {
			if t == ev.Team {
				continue
			}
			if _, ok := st.in[t]; ok {
				continue
			}
			if _, dup := asked[t]; !dup {
				asked[t] = struct{}{}
				ask = append(ask, t)
			}
		}
	}
	return ask
}

// read reads what unknownLocked asked of v (nil: the subject is in no team).
func (st *subjectTeams) read(ctx context.Context, v store.TeamsView, ask []string) error {
	if v == nil {
		for _, t := range ask {
			st.in[t] = false
		}
		return nil
	}
	in, err := v.In(ctx, ask)
	if err != nil {
		return err
	}
	for i, t := range ask {
		st.in[t] = in[i]
	}
	return nil
}

// seenThrough maps each member (but self) who shares one of others with
// self to one such team: if shown is set, one that shown says showed them
// if any did (see reconcileSubject). Read whichever way costs less: the
// members of others, or, for a user in more teams than the team has members
// (a user in 20,000 teams), the teams of each member, in one batched read.
func (h *hub) seenThrough(ctx context.Context, members []string, others map[string]struct{}, self string, shown func(team, member string) bool) (map[string]string, error) {
	s := h.srv
	out := make(map[string]string)
	settled := make(map[string]bool) // out's team showed them: no need to ask again
	pick := func(m, t string) {
		if m == self || settled[m] {
			return
		}
		if shown == nil || shown(t, m) {
			out[m], settled[m] = t, true
		} else if _, ok := out[m]; !ok {
			out[m] = t
		}
	}
	if b, ok := s.store.(store.TeamsBatcher); ok && len(others) > len(members) {
		var teams [][]string
		err := s.timed(store.OpQuery, func() error {
			var err error
			teams, err = b.TeamsOfMany(ctx, members)
			return err
		})
		if err != nil {
			return nil, err
		}
		for i, m := range members {
			for _, t := range teams[i] {
				if _, shared := others[t]; shared {
					if pick(m, t); settled[m] {
						break
					}
				}
			}
		}
		return out, nil
	}
	otherTeams := make([]string, 0, len(others))
	for t := range others {
		otherTeams = append(otherTeams, t)
	}
	byTeam, err := s.teamMembers(ctx, otherTeams)
	if err != nil {
		return nil, err
	}
	for t, ms := range byTeam {
		for _, m := range ms {
			pick(m, t)
		}
	}
	return out, nil
}

// reconcileSubject sends a user who joined a team the present members they
// could not see before, or drops queued changes of members they no longer
// share a team with.
//
// only, for a join, limits the pushes to those connections (nil: all). It
// reports whether a join found the subject out of the team: nothing was
// given.
func (h *hub) reconcileSubject(ctx context.Context, ev store.MembershipEvent, subject *localUser, held map[string]uint64, only []*client) (out bool) {
	s := h.srv
	h.mu.RLock()
	large := h.large[ev.Team]
	// A user who reconnected since (their last connection went) was given a
	// snapshot read after the event: nothing to catch up.
	gone := h.users[ev.UserID] != subject
	var others map[string]struct{}
	var conns []*client
	var leaving map[string]bool
	if !large && !gone {
		others = h.toldLocked(subject, ev.Team)
		conns = slices.Clone(subject.conns)
		if f := subject.flight; f != nil && len(f.leaving) > 0 {
			leaving = make(map[string]bool, len(f.leaving))
			for t := range f.leaving {
				leaving[t] = true
			}
		}
	}
	h.mu.RUnlock()
	if large || gone {
		return // a large team's members are not sent: the subject watches whom it wants
	}
	members, err := s.store.Members(ctx, ev.Team)
	if err != nil {
		s.log.Warn("membership reconcile", "err", err)
		return
	}
	if ev.Joined && !slices.Contains(members, ev.UserID) {
		// Out of the team as read: removed since (a join and its removal
		// reaching a node together, at a heal), or the event stood for
		// another write (an event publishes the user's side as it is
		// then). Nothing is sent; a later join gives the members (the
		// caller marks the team early), a removal hides the team.
		return true
	}
	// A team the joiner is leaving showed its members until the leave (its
	// view may be gone with it); any other, only to the connections its
	// view does not say lack them.
	lackers := func(via, m string) (all bool, some []*client) {
		if leaving[via] {
			return false, nil
		}
		return h.views.lackers(via, m, conns)
	}
	var shown func(via, m string) bool
	if ev.Joined && h.views != nil {
		shown = func(via, m string) bool {
			all, some := lackers(via, m)
			return !all && len(some) == 0
		}
	}
	already, err := h.seenThrough(ctx, members, others, ev.UserID, shown)
	if err != nil {
		s.log.Warn("membership reconcile", "err", err)
		return
	}
	// moved: members the store has in a team that showed the joiner
	// others, which did not show them to some connections of the joiner:
	// sent here, to those (nil: all). Either m's join of via has not been
	// routed here yet, and would take the new team, whose view holds m,
	// for the one that showed them (chaos seed 466426994: lost); or a
	// connection's snapshot lacked m (a data loss, views.lacking). A join
	// routed from here on finds the catch-up in flight, and what it sends
	// the joiner is not sent again.
	var moved map[string][]*client
	if shown != nil {
		for m, via := range already {
			if all, some := lackers(via, m); all || len(some) > 0 {
				delete(already, m)
				if moved == nil {
					moved = make(map[string][]*client)
				}
				moved[m] = some
			}
		}
	}
	var fresh []string
	for _, m := range members {
		if _, ok := already[m]; !ok && m != ev.UserID {
			fresh = append(fresh, m)
		}
	}
	if len(fresh) == 0 && (!ev.Joined || h.views == nil) {
		return
	}
	var ps []presence.Presence
	if ev.Joined && len(fresh) > 0 {
		if ps, err = h.readCatchUp(fresh); err != nil {
			s.log.Warn("membership reconcile", "err", err)
			return
		}
	}
	now := s.cfg.Now()
	if h.views != nil {
		h.routing.Lock()
		defer h.routing.Unlock()
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	lu := h.users[ev.UserID]
	if lu != subject {
		return
	}
	indexed := lu.teams.has(ev.Team)
	if indexed && ev.Joined && h.views != nil {
		crowded := len(h.byTeam[ev.Team]) > 1 || (only != nil && len(lu.conns) > 1)
		// Those left out are seen through another team: the joiner holds
		// what that team's members do, which the team's view must say
		// (sharesOther goes by it).
		for m, via := range already {
			h.views.adopt(ev.Team, via, m, crowded)
		}
		kept := ps[:0:0]
		for _, p := range ps {
			// A newer change routed through the team since the read
			// reached the joiner already (indexed under the team before
			// the read): the state read is stale, and sending it now
			// would take the joiner's view back.
			if cur, ok := h.views.get(ev.Team, p.UserID); ok && cur.version > p.Version {
				// A joiner sent the view's look since holds it, though at
				// an older version when a newer one of the same look (a
				// re-assertion) was routed to nobody.
				if p.Version != 0 || lu.flight.holds(p.UserID, cur.version) || lu.flight.holdsLook(p.UserID, cur.look) {
					continue
				}
				// Read as never seen: the store lost the subject with its
				// data (until their node asserts them again), or forgot
				// them. The view's state was routed while the joiner was out
				// of the team, and a joiner holding the subject from before
				// must be sent it, offline or not (chaos: seed 225511678
				// kept showing them away, seed 474819386 offline).
				p = cur.presence(p.UserID)
			}
			// Each of the joiner's connections is sent p below, unless m's
			// join of another team showed it to some of them already: then
			// who holds what is not known.
			var readers []*client
			if to, ok := moved[p.UserID]; !ok || to == nil {
				readers = lu.conns
				if only != nil {
					readers = only // the others hold the members already
				}
			}
			h.views.readBy(ev.Team, p, readers, crowded)
			kept = append(kept, p)
		}
		ps = kept
	}
	if ev.Joined && lu.flight != nil {
		kept := ps[:0:0]
		for _, p := range ps {
			// Routed to lu since the event, at this version or newer: the
			// read is no news, or stale.
			if !lu.flight.holds(p.UserID, p.Version) {
				kept = append(kept, p)
			}
		}
		ps = kept
	}
	var sent []protocol.Change // noted once every connection had its turn
	defer func() {
		for _, ch := range sent {
			lu.flight.note(ch)
		}
	}()
	if h.beforePush != nil {
		h.beforePush(ev.Team)
	}
	for _, c := range lu.conns {
		if !ev.Joined {
			for _, m := range fresh {
				if c.hide(m, held[m]) {
					lu.flight.forget(m) // what was queued of them went unsent
				}
			}
			continue
		}
		if only != nil && !slices.Contains(only, c) {
			continue // given the members by its snapshot
		}
		for _, p := range ps {
			if to, ok := moved[p.UserID]; ok && (!indexed || (to != nil && !slices.Contains(to, c))) {
				// Not indexed under the team (its watch failed, or the
				// joiner left it since): m's join of via reaches the
				// joiner, who shares no other team with m.
				continue
			}
			if stale, was := c.unhide(p.UserID); stale || p.State != presence.Offline {
				if ch, ok := c.pushCatchUp(p, was, now); ok {
					sent = append(sent, ch)
				}
			}
		}
	}
	return false
}

// readCatchUp reads the states a joiner's catch-up sends, whole: read while
// a data loss is not written back yet, a live member is "offline, version 0",
// which is not sent, and the team's view then takes the joiner for holding
// what its other viewers hold, so no resync corrects it. Like the resync,
// it waits out the recovery, each read with its own deadline: the job's
// would run out with the hold-off.
func (h *hub) readCatchUp(users []string) ([]presence.Presence, error) {
	wait := time.Now().Add(recoveryWait)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), membershipReadTimeout)
		ps, err := h.srv.readPresence(ctx, users)
		cancel()
		if !errors.Is(err, store.ErrRecovering) || !time.Now().Before(wait) {
			return ps, err
		}
		select {
		case <-h.srv.stop:
			return nil, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

func wireChange(c presence.Change) protocol.Change {
	l := c.Look()
	return protocol.Change{UserID: c.UserID, State: c.State.String(), Version: c.Version, At: c.At.UnixMilli(),
		Text: l.Text, Emoji: l.Emoji, ExpiresAt: l.ExpiresAt, Since: msOf(c.Since), LastSeen: l.LastSeen}
}
