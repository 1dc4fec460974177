package redisstore

import (
	"context"
	"errors"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"


	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
)

// Presence implements store.Tracker: one read-only script per user, all in
// one pipeline.
func (s *Store) Presence(ctx context.Context, userIDs []string) ([]presence.Presence, error) {
	out := make([]presence.Presence, len(userIDs))
	if len(userIDs) == 0 {
		return out, nil
	}
	calls := make([]call, len(userIDs))
	for i, u := range userIDs {
		sh := shardOf(u)
		calls[i] = call{key: dlKey(sh), args: []any{prefix(sh), s.ttlMS(), u}}
	}
	replies, errs := s.evalMany(ctx, s.sc.presence, calls)
	for i, err := range errs {
		if err != nil {
			return nil, s.failed(store.OpQuery, fmt.Errorf("redisstore: presence: %w", errors.Join(ErrUnavailable, err)))
		}
		out[i] = parsePresence(userIDs[i], replies[i])
	}
	return out, nil
}

func parsePresence(user string, v any) presence.Presence {
	p := presence.Presence{UserID: user}
	r, _ := v.([]any)
	if len(r) < 3 {
		return p
	}
	p.State = presence.State(toInt(r[0]))
	p.Version, _ = strconv.ParseUint(toString(r[1]), 10, 64)
	if seen := toInt(r[2]); seen > 0 {
		p.LastSeen = time.UnixMilli(seen)
	}
	for _, e := range r[3:] {
		p.ConnectionCount++
		device, _, _ := strings.Cut(toString(e), "\n")
		if !contains(p.Devices, device) {
			p.Devices = append(p.Devices, device)
		}
	}
	sort.Strings(p.Devices)
	return p
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func userTeamsKey(user string) string { return prefix(shardOf(user)) + "ut:" + user }

// AddMember implements store.Teams. The user's team set is written first,
// so a change published meanwhile already names the team.
func (s *Store) AddMember(ctx context.Context, team, user string) error {
	added, err := s.rdb.SAdd(ctx, userTeamsKey(user), team).Result()
	if err == nil {
		err = s.rdb.SAdd(ctx, teamKey(team), user).Err()
	}
	if err != nil {
		return s.failed(store.OpMembership, fmt.Errorf("redisstore: add member: %w", errors.Join(ErrUnavailable, err)))
	}
	if added == 0 {
		return nil
	}
	return s.publishMembership(ctx, team, user, true)
}

// RemoveMember implements store.Teams.
func (s *Store) RemoveMember(ctx context.Context, team, user string) error {
	removed, err := s.rdb.SRem(ctx, userTeamsKey(user), team).Result()
	if err == nil {
		err = s.rdb.SRem(ctx, teamKey(team), user).Err()
	}
	if err != nil {
		return s.failed(store.OpMembership, fmt.Errorf("redisstore: remove member: %w", errors.Join(ErrUnavailable, err)))
	}
	if removed == 0 {
		return nil
	}
	return s.publishMembership(ctx, team, user, false)
}

// TeamsOf implements store.Teams.
func (s *Store) TeamsOf(ctx context.Context, user string) ([]string, error) {
	teams, err := s.rdb.SMembers(ctx, userTeamsKey(user)).Result()
	if err != nil {
		return nil, s.failed(store.OpQuery, fmt.Errorf("redisstore: teams of: %w", errors.Join(ErrUnavailable, err)))
	}
	sort.Strings(teams)
	if len(teams) == 0 {
		return nil, nil
	}
	return teams, nil
}

// Members implements store.Teams.
func (s *Store) Members(ctx context.Context, team string) ([]string, error) {
	members, err := s.rdb.SMembers(ctx, teamKey(team)).Result()
	if err != nil {
		return nil, s.failed(store.OpQuery, fmt.Errorf("redisstore: members: %w", errors.Join(ErrUnavailable, err)))
	}
	sort.Strings(members)
	if len(members) == 0 {
		return nil, nil
	}
	return members, nil
}

// membershipMsg is a membership event on the wire between nodes.
type membershipMsg struct {
	Team    string   `json:"team"`
	User    string   `json:"user"`
	Joined  bool     `json:"joined"`
	Teams   []string `json:"teams"`
	State   int      `json:"s"`
	Version uint64   `json:"v"`
}

// membershipChannel is one sharded channel, so membership events reach every
// node in the order they were published.
const membershipChannel = "gd:{members}:ev"

func (s *Store) publishMembership(ctx context.Context, team, user string, joined bool) error {
	teams, err := s.TeamsOf(ctx, user)
	if err != nil {
		return err
	}
	ps, err := s.Presence(ctx, []string{user})
	if err != nil {
		return err
	}
	b, _ := json.Marshal(membershipMsg{Team: team, User: user, Joined: joined, Teams: teams,
		State: int(ps[0].State), Version: ps[0].Version})
	if err := s.rdb.SPublish(ctx, membershipChannel, b).Err(); err != nil {
		return s.failed(store.OpMembership, fmt.Errorf("redisstore: publish membership: %w", errors.Join(ErrUnavailable, err)))
	}
	return nil
}

// changeMsg is a presence change on a team channel.
type changeMsg struct {
	User    string   `json:"u"`
	State   int      `json:"s"`
	Version uint64   `json:"v"`
	At      int64    `json:"at"`
	Teams   []string `json:"teams"`
}

// publishChanges sends each change on the channel of each of its teams.
func (s *Store) publishChanges(ctx context.Context, out outcome) {
	pipe := s.rdb.Pipeline()
	n := 0
	for i, c := range out.Changes {
		teams := out.teams[i]
		sort.Strings(teams)
		b, _ := json.Marshal(changeMsg{User: c.UserID, State: int(c.State), Version: c.Version,
			At: c.At.UnixMilli(), Teams: teams})
		for _, t := range teams {
			pipe.SPublish(ctx, teamChannel(t), b)
			n++
		}
	}
	if n == 0 {
		return
	}
	if _, err := pipe.Exec(ctx); err != nil {
		// The transition stands in Redis; viewers resync when it returns.
		s.m.errors.WithLabelValues("publish").Inc()
		s.log.Warn("publish changes", "err", err)
	}
	s.m.published.Add(float64(n))
}
