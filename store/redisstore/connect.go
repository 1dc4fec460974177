package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
)

var _ store.ConnectReader = (*Store)(nil)

// ConnectRead implements store.ConnectReader: the connect script, the
// user's presence script and one SMEMBERS per team go in one pipeline. The
// presence script runs in the user's slot after the connect script, on the
// same connection, so it reads the connection registered, as Presence
// after Connect would; the members' reads are the snapshot's, taken once
// the server has indexed the user under its teams, as before. What the
// connect script changed is then published, as Connect does.
func (s *Store) ConnectRead(ctx context.Context, c presence.Conn, teams []string) (presence.Presence, [][]string, bool, error) {
	start := time.Now()
	s.mu.Lock()
	held, dup := s.conns[c.ID]
	s.mu.Unlock()
	if dup && held.user != c.UserID {
		return presence.Presence{}, nil, false, ErrDuplicateConn
	}
	if c.Node == "" {
		c.Node = s.cfg.Node
	}
	lc := localConn{active: !c.Idle}
	keys, args := s.connectCall(c, lc, false)
	pipe := s.rdb.Pipeline()
	cc := s.sc.connect.EvalSha(ctx, pipe, keys, args...)
	pc := s.sc.presence.EvalSha(ctx, pipe, userKeys(c.UserID), s.ttlMS())
	mcs := make([]*redis.StringSliceCmd, len(teams))
	for i, t := range teams {
		mcs[i] = pipe.SMembers(ctx, teamKey(t))
	}
	// Which of teams the user is in as of the read: the caller's may be its
	// index's, which a removal's event has not reached yet (finding 22).
	var uc *redis.BoolSliceCmd
	if len(teams) > 0 {
		names := make([]any, len(teams))
		for i, t := range teams {
			names[i] = t
		}
		uc = pipe.SMIsMember(ctx, userTeamsKey(c.UserID), names...)
	}
	_, _ = pipe.Exec(ctx)
	v, err := cc.Result()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		// Redis lost its scripts (a restart): the connect did not run. The
		// one-call-at-a-time path loads them.
		return s.connectThenRead(ctx, c, teams)
	}
	if err := s.connected(ctx, c, lc, false, v, err, start); err != nil {
		return presence.Presence{}, nil, false, err
	}
	var own presence.Presence
	switch pv, err := pc.Result(); {
	case err != nil && redis.HasErrorPrefix(err, "NOSCRIPT"):
		ps, err := s.Presence(ctx, []string{c.UserID})
		if err != nil {
			return presence.Presence{}, nil, true, err
		}
		own = ps[0]
	case err != nil:
		return presence.Presence{}, nil, true, s.failed(store.OpQuery, fmt.Errorf("redisstore: presence: %w", errors.Join(ErrUnavailable, err)))
	default:
		own = parsePresence(c.UserID, pv)
	}
	var in []bool
	if uc != nil {
		if in, err = uc.Result(); err != nil || len(in) != len(teams) {
			return presence.Presence{}, nil, true, s.failed(store.OpQuery, fmt.Errorf("redisstore: teams of: %w", errors.Join(ErrUnavailable, err)))
		}
	}
	members := make([][]string, len(teams))
	for i, mc := range mcs {
		m, err := mc.Result()
		if err != nil && err != redis.Nil {
			return presence.Presence{}, nil, true, s.failed(store.OpQuery, fmt.Errorf("redisstore: members: %w", errors.Join(ErrUnavailable, err)))
		}
		if len(m) > 0 {
			sort.Strings(m)
			members[i] = m
		}
	}
	return own, onlyIn(in, members), true, nil
}

// onlyIn leaves out the members of the teams the user is not in as read
// (in, aligned with members): the user's side of a membership is written
// first (membership), so a team there is one the user is in or joining.
func onlyIn(in []bool, members [][]string) [][]string {
	for i := range members {
		if !in[i] {
			members[i] = nil
		}
	}
	return members
}

// connectThenRead is ConnectRead one call after the other.
func (s *Store) connectThenRead(ctx context.Context, c presence.Conn, teams []string) (presence.Presence, [][]string, bool, error) {
	if err := s.Connect(ctx, c); err != nil {
		return presence.Presence{}, nil, false, err
	}
	ps, err := s.Presence(ctx, []string{c.UserID})
	if err != nil {
		return presence.Presence{}, nil, true, err
	}
	members, err := s.MembersOfMany(ctx, teams)
	if err != nil {
		return presence.Presence{}, nil, true, err
	}
	now, err := s.TeamsOf(ctx, c.UserID)
	if err != nil {
		return presence.Presence{}, nil, true, err
	}
	in := make([]bool, len(teams))
	for i, t := range teams {
		in[i] = slices.Contains(now, t)
	}
	return ps[0], onlyIn(in, members), true, nil
}
