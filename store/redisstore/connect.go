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
func (s *Store) ConnectRead(ctx context.Context, c presence.Conn, teams []string) (store.ConnectReads, bool, error) {
	start := time.Now()
	s.mu.Lock()
	held, dup := s.conns[c.ID]
	s.mu.Unlock()
	if dup && held.user != c.UserID {
		return store.ConnectReads{}, false, ErrDuplicateConn
	}
	if c.Node == "" {
		c.Node = s.cfg.Node
	}
	lc := localConn{active: !c.Idle}
	keys, args := s.connectCall(c, lc, false)
	pipe := s.rdb.Pipeline()
	cc := evalSha(ctx, s.sc.connect, keys, args)
	_ = pipe.Process(ctx, cc)
	pc := evalSha(ctx, s.sc.presence, userKeys(c.UserID), []any{s.ttlMS()})
	_ = pipe.Process(ctx, pc)
	mcs := make([]*redis.StringSliceCmd, len(teams))
	for i, t := range teams {
		mcs[i] = pipe.SMembers(ctx, teamKey(t))
	}
	// The user's teams as of the read: the caller's may be its index's,
	// which a removal's event (finding 22) or a join's (finding 27) has not
	// reached yet.
	uc := pipe.SMembers(ctx, userTeamsKey(c.UserID))
	_, _ = pipe.Exec(ctx)
	v, err := cc.Result()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		// Redis lost its scripts (a restart): the connect did not run. The
		// one-call-at-a-time path loads them.
		return s.connectThenRead(ctx, c, teams)
	}
	if err := s.connected(ctx, c, lc, false, v, err, start); err != nil {
		return store.ConnectReads{}, false, err
	}
	var r store.ConnectReads
	switch pv, err := pc.Result(); {
	case err != nil && redis.HasErrorPrefix(err, "NOSCRIPT"):
		ps, err := s.Presence(ctx, []string{c.UserID})
		if err != nil {
			return store.ConnectReads{}, true, err
		}
		r.Own = ps[0]
	case err != nil:
		return store.ConnectReads{}, true, s.failed(store.OpQuery, fmt.Errorf("redisstore: presence: %w", errors.Join(ErrUnavailable, err)))
	default:
		r.Own = parsePresence(c.UserID, pv)
	}
	if r.Teams, err = uc.Result(); err != nil && err != redis.Nil {
		return store.ConnectReads{}, true, s.failed(store.OpQuery, fmt.Errorf("redisstore: teams of: %w", errors.Join(ErrUnavailable, err)))
	}
	sort.Strings(r.Teams)
	r.Members = make([][]string, len(teams))
	for i, mc := range mcs {
		m, err := mc.Result()
		if err != nil && err != redis.Nil {
			return store.ConnectReads{}, true, s.failed(store.OpQuery, fmt.Errorf("redisstore: members: %w", errors.Join(ErrUnavailable, err)))
		}
		if len(m) > 0 && slices.Contains(r.Teams, teams[i]) {
			// Only the teams the user is in as read: the user's side of
			// a membership is written first, so a team there is one the
			// user is in or joining.
			sort.Strings(m)
			r.Members[i] = m
		}
	}
	return r, true, nil
}

// connectThenRead is ConnectRead one call after the other.
func (s *Store) connectThenRead(ctx context.Context, c presence.Conn, teams []string) (store.ConnectReads, bool, error) {
	if err := s.Connect(ctx, c); err != nil {
		return store.ConnectReads{}, false, err
	}
	ps, err := s.Presence(ctx, []string{c.UserID})
	if err != nil {
		return store.ConnectReads{}, true, err
	}
	members, err := s.MembersOfMany(ctx, teams)
	if err != nil {
		return store.ConnectReads{}, true, err
	}
	now, err := s.TeamsOf(ctx, c.UserID)
	if err != nil {
		return store.ConnectReads{}, true, err
	}
	sort.Strings(now)
	for i, t := range teams {
		if !slices.Contains(now, t) {
			members[i] = nil
		}
	}
	return store.ConnectReads{Own: ps[0], Members: members, Teams: now}, true, nil
}
