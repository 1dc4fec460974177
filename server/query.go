package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/store"
)

// answerQuery answers a query frame with what c may see of its ids.
func (s *Server) answerQuery(ctx context.Context, c *client, q *protocol.Query) {
	for _, id := range q.UserIDs {
		if !protocol.ValidID(id) {
			s.metrics.framesRejected.WithLabelValues(reasonBadRequest).Inc()
			c.writeJSON(protocol.Error{Type: protocol.TypeError, Code: protocol.CodeBadRequest,
				Message: protocol.MsgBadQueryID})
			return
		}
	}
	users, e := s.presenceFor(ctx, c, q.UserIDs)
	if e != nil {
		c.writeJSON(*e)
		return
	}
	id := q.ID
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	c.writeJSON(protocol.QueryResult{Type: protocol.TypeQueryResult, ID: id, Users: users})
}

// presenceFor is what c may see of each of ids: the presence of its
// teammates (and its own), "unknown" for the others; or the error frame
// to answer.
func (s *Server) presenceFor(ctx context.Context, c *client, ids []string) ([]protocol.UserPresence, *protocol.Error) {
	shared, err := s.sharesTeamWith(ctx, c.user, ids)
	if err != nil {
		return nil, &protocol.Error{Type: protocol.TypeError, Code: protocol.CodeUnavailable, Message: "store unavailable"}
	}
	users := make([]protocol.UserPresence, len(ids))
	var visible []string
	var visibleAt []int
	for i, id := range ids {
		users[i] = protocol.UserPresence{UserID: id, State: protocol.StateUnknown}
		if id == c.user || shared[id] {
			visible = append(visible, id)
			visibleAt = append(visibleAt, i)
		}
	}
	if len(visible) > 0 && s.intact() != nil {
		return nil, &protocol.Error{Type: protocol.TypeError, Code: protocol.CodeUnavailable, Message: msgRecovering}
	}
	if len(visible) > 0 {
		ps, err := s.readPresence(ctx, visible)
		if errors.Is(err, store.ErrRecovering) {
			return nil, &protocol.Error{Type: protocol.TypeError, Code: protocol.CodeUnavailable, Message: msgRecovering}
		}
		if err != nil {
			return nil, &protocol.Error{Type: protocol.TypeError, Code: protocol.CodeUnavailable, Message: "store unavailable"}
		}
		for j, p := range ps {
			users[visibleAt[j]] = viewerPresence(p)
		}
	}
	return users, nil
}

// queryCost is the rate tokens a query of n ids costs: one per 10 ids, at
// least one.
func queryCost(n int) int { return max(1, (n+9)/10) }

// chargeIDs takes the tokens a frame naming n ids costs beyond the one its
// frame took (one per 10 ids, DESIGN.md, Limits): a big query or watch
// costs what the store work it causes is worth. Refused, the frame is a
// rate-limited frame like any and continues the run of them (streak, from
// before its first token): else a flood of big frames, each passing its
// first token, would never reach the 1008 close.
func (c *client) chargeIDs(now time.Time, n int, streak int32) bool {
	extra := queryCost(n) - 1
	if extra <= 0 {
		return true
	}
	c.limited = streak
	return c.allow(now, extra)
}

// sharesTeamWith reports which of ids share a team with viewer. The
// viewer's teams come from the hub once; each distinct id's teams from the
// hub's index when the id is connected here (no store call), else from one
// batched store read when the store offers one (store.TeamsBatcher), else one
// TeamsOf per distinct id. The hub's index is what routing uses, so a query
// agrees with the changes the viewer is sent.
func (s *Server) sharesTeamWith(ctx context.Context, viewer string, ids []string) (map[string]bool, error) {
	out := make(map[string]bool, len(ids))
	viewerTeams := s.hub.teamsOf(viewer)
	if len(viewerTeams) == 0 {
		return out, nil // no team: nobody to share one with
	}
	var remote []string
	seen := make(map[string]struct{}, len(ids))
	s.hub.mu.RLock()
	for _, id := range ids {
		if _, dup := seen[id]; dup || id == viewer {
			continue
		}
		seen[id] = struct{}{}
		// teams is nil while a first connection's teams are loading: ask the store.
		if lu := s.hub.users[id]; lu != nil && lu.teams != nil {
			for _, t := range viewerTeams {
				if lu.teams.has(t) {
					out[id] = true
					break
				}
			}
			continue
		}
		remote = append(remote, id)
	}
	s.hub.mu.RUnlock()
	if len(remote) == 0 {
		return out, nil
	}
	if b, ok := s.store.(store.TeamsBatcher); ok {
		var teams [][]string
		err := s.timed(store.OpQuery, func() error {
			var err error
			teams, err = b.TeamsOfMany(ctx, remote)
			return err
		})
		if err != nil {
			return nil, err
		}
		if len(teams) != len(remote) {
			return nil, fmt.Errorf("server: teams of %d users: store answered %d", len(remote), len(teams))
		}
		for i, id := range remote {
			out[id] = sharesAny(viewerTeams, teams[i])
		}
		return out, nil
	}
	for _, id := range remote {
		var teams []string
		err := s.timed(store.OpQuery, func() error {
			var err error
			teams, err = s.store.TeamsOf(ctx, id)
			return err
		})
		if err != nil {
			return nil, err
		}
		out[id] = sharesAny(viewerTeams, teams)
	}
	return out, nil
}
