package server

import (
	"context"
	"errors"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/store"
)

// OnResync implements store.Resyncer: the store may have lost events (Redis
// lost data, or a subscription was re-established). Team by team, the
// members' presence is read again and compared with what the local viewers
// hold (views); only the differences are sent, so a recovery shows no
// change where none happened. floor(user) is above every version of user
// published before the call.
func (h *hub) OnResync(floor func(userID string) uint64) {
	if h.views == nil {
		return
	}
	h.work.enqueue(func(context.Context) { h.resync(floor) })
}

func (h *hub) resync(floor func(string) uint64) {
	h.srv.metrics.resyncs.Inc()
	h.mu.RLock()
	teams := make([]string, 0, len(h.byTeam))
	for t := range h.byTeam {
		teams = append(teams, t)
	}
	gens := make(map[*localUser]uint64, len(h.users))
	users := make([]string, 0, len(h.users))
	for _, lu := range h.users {
		gens[lu] = lu.gen
		users = append(users, lu.id)
	}
	h.mu.RUnlock()
	// A team that no local user was in, joined by one meanwhile, is not
	// among those: its join event was missed with the rest.
	teams = append(teams, h.missedTeams(users, teams)...)
	sent := 0
	// Each team's view is compared on its own: a subject seen through two
	// teams differs in both, and a viewer in both would be sent it twice.
	// What this resync queued to each connection, for its length only.
	given := make(map[givenKey]uint64)
	give := func(lu *localUser, c *client, ch protocol.Change, team string) {
		k := givenKey{c, ch.UserID}
		if v, ok := given[k]; ok && v >= ch.Version {
			return
		}
		given[k] = ch.Version
		c.push(ch, true)
		sent++
		// The views of lu's other teams, not resynced yet, may name c as
		// holding something else: their odds no longer know.
		for _, t := range lu.teams {
			if t != team {
				h.views.unsure(t, ch.UserID)
			}
		}
	}
	// After a data loss the store refuses reads until the nodes have
	// written their connections back: the resync waits for that (a node
	// can get Redis back before it learns that the data is gone).
	wait := time.Now().Add(recoveryWait)
	for _, team := range teams {
		truth, err := h.readTeamFresh(team)
		for errors.Is(err, store.ErrRecovering) && time.Now().Before(wait) {
			select {
			case <-h.srv.stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
			truth, err = h.readTeamFresh(team)
		}
		if err != nil {
			h.srv.log.Warn("resync", "team", team, "err", err)
			continue
		}
		h.applyMissedMembership(team, truth, gens)
		if h.srv.px != nil {
			h.srv.px.teamTruth(team, truth)
		}
		at := h.srv.cfg.Now()
		now := at.UnixMilli()
		h.routing.Lock()
		if h.resyncLarge(team, truth, at) {
			h.routing.Unlock()
			continue
		}
		h.mu.RLock()
		members := h.byTeam[team]
		var diff []resyncChange
		var unseen []presence.Presence
		if members != nil {
			unseen = h.views.unseenOffline(team, truth)
			diff = h.views.resync(team, truth, floor)
		}
		if h.beforePush != nil {
			h.beforePush(team)
		}
		// Offline users new to the team's view are news to nobody, except
		// to a connection that saw them before a removal and may hold
		// their old state (the join event can be lost in an outage).
		for _, p := range unseen {
			for lu := range members {
				for _, c := range lu.conns {
					if stale, was := c.unhide(p.UserID); stale && lu.id != p.UserID {
						if ch, ok := catchUp(p, was, at); ok {
							give(lu, c, ch, team)
							c.noteRaised(ch, p.Version)
						}
					}
				}
			}
		}
		for _, ch := range diff {
			wc := wireChange(ch.Change)
			wc.At = now
			for lu := range members {
				if lu.id == ch.UserID {
					continue
				}
				for _, c := range lu.conns {
					if ch.to.to(c) { // not to whom holds it already
						give(lu, c, wc, team)
					}
				}
			}
		}
		h.mu.RUnlock()
		h.routing.Unlock()
	}
	h.srv.metrics.resyncDeliveries.Add(float64(sent))
}

// givenKey is a connection and a subject a resync queued it.
type givenKey struct {
	c       *client
	subject string
}

// applyMissedMembership compares the members of team (truth) with the local
// users indexed under it, and applies the membership events the node missed
// (a partition, a resubscription): a local user no longer a member leaves
// the team here, so that nothing more passes between them and its members;
// a local member not indexed under it joins. A user with a membership event
// since the resync began (gens) is left to that event.
func (h *hub) applyMissedMembership(team string, truth []presence.Presence, gens map[*localUser]uint64) {
	members := make(map[string]presence.Presence, len(truth))
	for _, p := range truth {
		members[p.UserID] = p
	}
	var missed []store.MembershipEvent
	h.mu.RLock()
	for lu := range h.byTeam[team] {
		if _, ok := members[lu.id]; !ok && gens[lu] == lu.gen {
			missed = append(missed, store.MembershipEvent{Team: team, UserID: lu.id, UserTeams: store.TeamList(teamsBut(lu.teams, team))})
		}
	}
	for id, p := range members {
		lu := h.users[id]
		if lu == nil || lu.teams == nil || gens[lu] != lu.gen {
			continue
		}
		if !lu.teams.has(team) {
			missed = append(missed, store.MembershipEvent{Team: team, UserID: id, Joined: true, State: p.State, Version: p.Version,
				UserTeams: store.TeamList(append(teamsBut(lu.teams, team), team))})
		}
	}
	h.mu.RUnlock()
	for _, ev := range missed {
		h.OnMembership(ev)
	}
	// Those were this resync's own events: the user's other teams may
	// have missed theirs too.
	h.mu.RLock()
	for _, ev := range missed {
		if lu := h.users[ev.UserID]; lu != nil {
			gens[lu] = lu.gen
		}
	}
	h.mu.RUnlock()
}

func teamsBut(teams teamSet, team string) []string {
	out := make([]string, 0, len(teams))
	for _, t := range teams {
		if t != team {
			out = append(out, t)
		}
	}
	return out
}

// recoveryWait bounds how long a resync waits for a store recovering from a
// data loss: past the hold-off (5 s by default) with room to spare.
const recoveryWait = 30 * time.Second

// staleRead is how long after it was asked a resync's read of a team may
// be answered and still be used.
const staleRead = time.Second

// readTeamFresh is readTeam, asked again (twice at most) when its answer
// came more than staleRead after the question: a network fault that held
// it held the events published meanwhile too, and a member removed since
// would be pushed the team as it was, with no way to tell (chaos, one
// Redis, seed 788421645: a read asked as a partition began, answered at
// its heal 4.8 s later, showed two users to a viewer removed from their
// team in between; read again, it shows the removal, which the resync
// applies).
func (h *hub) readTeamFresh(team string) ([]presence.Presence, error) {
	for try := 1; ; try++ {
		asked := h.srv.cfg.Now()
		truth, err := h.readTeam(team)
		if err != nil || h.srv.cfg.Now().Sub(asked) <= staleRead || try == 3 {
			return truth, err
		}
	}
}

// missedTeams lists the teams that users (local) are in, per the store,
// and that are not in known.
func (h *hub) missedTeams(users, known []string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	have := make(map[string]struct{}, len(known))
	for _, t := range known {
		have[t] = struct{}{}
	}
	var missed []string
	for _, teams := range h.srv.teamsOfMany(ctx, users) {
		for _, t := range teams {
			if _, ok := have[t]; !ok {
				have[t] = struct{}{}
				missed = append(missed, t)
			}
		}
	}
	return missed
}

// readTeam reads a team's truth, with a deadline per team: a big node must
// not run out of time halfway.
func (h *hub) readTeam(team string) ([]presence.Presence, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return h.srv.teamStates(ctx, team)
}

// teamsOfMany reads the teams of users, batched when the store can; a user
// whose teams could not be read has none in the answer.
func (s *Server) teamsOfMany(ctx context.Context, users []string) [][]string {
	if len(users) == 0 {
		return nil
	}
	if b, ok := s.store.(store.TeamsBatcher); ok {
		teams, err := b.TeamsOfMany(ctx, users)
		if err == nil && len(teams) == len(users) {
			return teams
		}
		s.log.Warn("resync: teams of local users", "err", err)
		return nil
	}
	out := make([][]string, len(users))
	for i, u := range users {
		teams, err := s.store.TeamsOf(ctx, u)
		if err != nil {
			s.log.Warn("resync: teams of local users", "err", err)
			return out
		}
		out[i] = teams
	}
	return out
}
