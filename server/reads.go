package server

import (
	"context"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
)

// snapshot lists the users sharing a team with user, present or not (the
// versions of offline users let the outbox drop what the snapshot covers),
// and the members of each team: members, when read already (with the
// connect, see register), else read now.
func (s *Server) snapshot(ctx context.Context, user string, teams []string, members map[string][]string) ([]presence.Presence, map[string][]string, error) {
	if members == nil {
		var err error
		if members, err = s.teamMembers(ctx, teams); err != nil {
			return nil, nil, err
		}
	}
	ps, err := s.readWholeStates(ctx, union(members, user))
	return ps, members, err
}

// connectReads is what register read with the connect.
type connectReads struct {
	own     presence.Presence   // the user's own presence, for my_status
	members map[string][]string // the members of the teams asked; nil: not read
	teams   []string            // the user's teams as of the read, sorted; nil: not read
}

// register registers c in the store and reads the user's own presence,
// and, when the store reads them in the same round trip
// (store.ConnectReader), the members of teams for the snapshot and the
// user's teams as of that read.
// registered: c is in the store, and is to be ended like any other
// connection even if err (a failed read) is set.
func (s *Server) register(ctx context.Context, c *client, teams []string) (registered bool, r connectReads, err error) {
	conn := presence.Conn{ID: c.id, UserID: c.user, Device: c.device, Node: s.cfg.NodeID}
	if cr, ok := s.store.(store.ConnectReader); ok {
		var read store.ConnectReads
		err = s.timed(store.OpConnect, func() error {
			var err error
			read, registered, err = cr.ConnectRead(ctx, conn, teams)
			return err
		})
		if err == nil {
			r.own, r.teams = read.Own, read.Teams
			if r.teams == nil {
				r.teams = []string{}
			}
			r.members = make(map[string][]string, len(teams))
			for i, t := range teams {
				r.members[t] = read.Members[i]
			}
		}
		return registered, r, err
	}
	if err = s.timed(store.OpConnect, func() error { return s.store.Connect(ctx, conn) }); err != nil {
		return false, r, err
	}
	var own []presence.Presence
	err = s.timed(store.OpQuery, func() error {
		var err error
		own, err = s.store.Presence(ctx, []string{c.user})
		return err
	})
	if err != nil {
		return true, r, err
	}
	r.own = own[0]
	return true, r, nil
}

// teamStates reads the state of every member of team, whole (see
// readWholeStates).
func (s *Server) teamStates(ctx context.Context, team string) ([]presence.Presence, error) {
	members, err := s.teamMembers(ctx, []string{team})
	if err != nil {
		return nil, err
	}
	return s.readWholeStates(ctx, members[team])
}

// readWholeStates is readStates, refused with store.ErrRecovering while the
// store could miss users after a data loss (store.LossGuard): a snapshot or
// a resync would take them for offline. No users to read is checked too:
// the members read before may be none because they were lost.
func (s *Server) readWholeStates(ctx context.Context, users []string) ([]presence.Presence, error) {
	g, ok := s.store.(store.LossGuard)
	if !ok {
		return s.readStates(ctx, users)
	}
	var ps []presence.Presence
	err := s.timed(store.OpQuery, func() error {
		var err error
		ps, err = g.WholeStates(ctx, users)
		return err
	})
	return ps, err
}

// readPresence reads users' whole presence for a query's answer, refused
// with store.ErrRecovering while the store could miss users after a data
// loss (store.LossGuard): the node's own view of that (intact) lags the
// loss by up to a sweep, and an answer read meanwhile shows live users
// offline.
func (s *Server) readPresence(ctx context.Context, users []string) ([]presence.Presence, error) {
	if g, ok := s.store.(store.LossGuard); ok {
		return g.WholePresence(ctx, users)
	}
	return s.store.Presence(ctx, users)
}

// readStates reads the states and versions of users (all a snapshot needs).
func (s *Server) readStates(ctx context.Context, users []string) ([]presence.Presence, error) {
	if len(users) == 0 {
		return nil, nil
	}
	var ps []presence.Presence
	err := s.timed(store.OpQuery, func() error {
		var err error
		if st, ok := s.store.(store.StateReader); ok {
			ps, err = st.States(ctx, users)
		} else {
			ps, err = s.store.Presence(ctx, users)
		}
		return err
	})
	return ps, err
}

// teamMembers reads the members of each team: in one batched read when the
// store offers one (store.MembersBatcher) and there are several.
func (s *Server) teamMembers(ctx context.Context, teams []string) (map[string][]string, error) {
	out := make(map[string][]string, len(teams))
	if b, ok := s.store.(store.MembersBatcher); ok && len(teams) > 1 {
		var all [][]string
		err := s.timed(store.OpQuery, func() error {
			var err error
			all, err = b.MembersOfMany(ctx, teams)
			return err
		})
		if err != nil {
			return nil, err
		}
		for i, t := range teams {
			out[t] = all[i]
		}
		return out, nil
	}
	for _, t := range teams {
		var members []string
		err := s.timed(store.OpQuery, func() error {
			var err error
			members, err = s.store.Members(ctx, t)
			return err
		})
		if err != nil {
			return nil, err
		}
		out[t] = members
	}
	return out, nil
}

// union lists every member of every team once, without self.
func union(members map[string][]string, self string) []string {
	if len(members) == 1 { // one team: its members are unique already
		for _, ms := range members {
			out := make([]string, 0, len(ms))
			for _, m := range ms {
				if m != self {
					out = append(out, m)
				}
			}
			return out
		}
	}
	seen := make(map[string]struct{})
	var out []string
	for _, ms := range members {
		for _, m := range ms {
			if _, dup := seen[m]; dup || m == self {
				continue
			}
			seen[m] = struct{}{}
			out = append(out, m)
		}
	}
	return out
}

func (s *Server) timed(op string, f func() error) error {
	start := time.Now()
	err := f()
	s.metrics.storeLatency.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err != nil {
		s.metrics.storeErrors.WithLabelValues(op).Inc()
	}
	return err
}
