package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

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
		calls[i] = call{keys: userKeys(u), args: []any{s.ttlMS()}}
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
	if len(r) < 4 {
		return p
	}
	if st, ok := r[3].([]any); ok && len(st) >= 8 {
		p.Status = presence.Status{Mode: presence.Mode(toInt(st[0])), Text: toString(st[1]), Emoji: toString(st[2]),
			ExpiresAt: msTime(toInt(st[3]))}
		p.Since = msTime(toInt(st[4]))
		p.ShownLastSeen = msTime(toInt(st[5]))
		p.Actual = presence.State(toInt(st[6]))
		p.ActualSince = msTime(toInt(st[7]))
	}
	for _, e := range r[4:] {
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

// userMVKey holds the user's membership version, in the user's slot.
func userMVKey(user string) string { return prefix(shardOf(user)) + "mv:" + user }

// teamMVKey holds, per member, the version of the last change applied to
// the team's member set, in the team's slot.
func teamMVKey(team string) string { return "gd:{t:" + team + "}:mv" }

// AddMember implements store.Teams.
func (s *Store) AddMember(ctx context.Context, team, user string) error {
	return s.membership(ctx, team, user, true)
}

// RemoveMember implements store.Teams.
func (s *Store) RemoveMember(ctx context.Context, team, user string) error {
	return s.membership(ctx, team, user, false)
}

// membership writes a membership on both sides: the user's team set, which
// the presence scripts read, and the team's member set. On a cluster they
// live in two slots and cannot change in one atomic step, so the user's
// side is the one order: its script applies the change and numbers it, and
// the team's side applies a change only if it is newer than the last one it
// applied for that member. However calls from many nodes interleave, both
// sides end with the state of the last call in the user's order. The user's
// side is written first, so a change published meanwhile already names the
// team.
func (s *Store) membership(ctx context.Context, team, user string, join bool) error {
	what := "remove member"
	if join {
		what = "add member"
	}
	p := prefix(shardOf(user))
	r, err := run(ctx, s.rdb, s.sc.memberUser, []string{userTeamsKey(user), userMVKey(user), p + "u:" + user, p + "sv:" + user}, team, boolArg(join))
	var userChanged, teamChanged int64
	if err == nil {
		reply, _ := r.([]any)
		if len(reply) != 2 {
			return fmt.Errorf("redisstore: %s: unexpected reply %v", what, r)
		}
		userChanged = toInt(reply[0])
		var t any
		t, err = run(ctx, s.rdb, s.sc.memberTeam, []string{teamKey(team), teamMVKey(team), teamInfoKey(team), teamOccKey(team)}, user, boolArg(join), toString(reply[1]), boolArg(s.occupancyOn))
		teamChanged = toInt(t)
	}
	if err != nil {
		s.noteLostReply(err)
		return s.failed(store.OpMembership, fmt.Errorf("redisstore: %s: %w", what, errors.Join(ErrUnavailable, err)))
	}
	// Published when either side changed, so a retry after a half-done
	// attempt still tells the viewers. A removal is published even when
	// neither did: after Redis lost its data, the nodes' index of who is in
	// which team may still hold the membership, and only this event makes
	// them drop it (else the member keeps hearing the team until a resync).
	if join && userChanged == 0 && teamChanged == 0 {
		return nil
	}
	return s.publishMembership(ctx, team, user)
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

// TeamsOfMany implements store.TeamsBatcher: one SMEMBERS per user, all in
// one pipeline (on a cluster, go-redis sends it as one pipeline per node
// that holds any of the users' slots).
func (s *Store) TeamsOfMany(ctx context.Context, userIDs []string) ([][]string, error) {
	out := make([][]string, len(userIDs))
	if len(userIDs) == 0 {
		return out, nil
	}
	cmds := make([]*redis.StringSliceCmd, len(userIDs))
	pipe := s.rdb.Pipeline()
	for i, u := range userIDs {
		cmds[i] = pipe.SMembers(ctx, userTeamsKey(u))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, s.failed(store.OpQuery, fmt.Errorf("redisstore: teams of many: %w", errors.Join(ErrUnavailable, err)))
	}
	for i, c := range cmds {
		if teams := c.Val(); len(teams) > 0 {
			sort.Strings(teams)
			out[i] = teams
		}
	}
	return out, nil
}

// MemberCount implements store.MemberCounter: SCARD, O(1).
func (s *Store) MemberCount(ctx context.Context, team string) (int, error) {
	n, err := s.rdb.SCard(ctx, teamKey(team)).Result()
	if err != nil {
		return 0, s.failed(store.OpQuery, fmt.Errorf("redisstore: member count: %w", errors.Join(ErrUnavailable, err)))
	}
	return int(n), nil
}

// MembersOfMany implements store.MembersBatcher: one pipeline of SMEMBERS.
func (s *Store) MembersOfMany(ctx context.Context, teams []string) ([][]string, error) {
	out := make([][]string, len(teams))
	if len(teams) == 0 {
		return out, nil
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringSliceCmd, len(teams))
	for i, t := range teams {
		cmds[i] = pipe.SMembers(ctx, teamKey(t))
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, s.failed(store.OpQuery, fmt.Errorf("redisstore: members: %w", errors.Join(ErrUnavailable, err)))
	}
	for i, c := range cmds {
		if m := c.Val(); len(m) > 0 {
			sort.Strings(m)
			out[i] = m
		}
	}
	return out, nil
}

// Members implements store.Teams: one SMEMBERS.
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
	Team   string   `json:"team"`
	User   string   `json:"user"`
	Joined bool     `json:"joined"`
	Teams  []string `json:"teams"` // the user's teams, when Many is not set
	// Many: the user is in more than maxListedTeams teams, not listed;
	// receivers ask Redis about the teams they need (memberView).
	Many    bool   `json:"many,omitempty"`
	State   int    `json:"s"`
	Version uint64 `json:"v"`
	// MV is the user's membership version when Teams was read: of two
	// events about one membership, the one with the higher MV is the newer.
	MV uint64 `json:"mv,omitempty"`
	// What viewers see of the user beside the state (v2), so that new
	// teammates get the status text too; ms.
	Text      string `json:"tx,omitempty"`
	Emoji     string `json:"em,omitempty"`
	ExpiresAt int64  `json:"ex,omitempty"`
	Since     int64  `json:"ss,omitempty"`
	LastSeen  int64  `json:"ls,omitempty"`
}

// shownPresence is what viewers see of the user a membership message is
// about, as a Presence whose Look is the message's.
func (m membershipMsg) shownPresence() *presence.Presence {
	return &presence.Presence{UserID: m.User, State: presence.State(m.State), Version: m.Version,
		Since: msTime(m.Since), ShownLastSeen: msTime(m.LastSeen),
		Status: presence.Status{Text: m.Text, Emoji: m.Emoji, ExpiresAt: msTime(m.ExpiresAt)}}
}

// maxListedTeams bounds the teams a membership message lists: a user may be
// in thousands, and reading and publishing them all to every node made each
// change cost O(the user's teams). Most users are in few, and their message
// still carries them, read with the change.
const maxListedTeams = 100

// memberView is a membership event's view of its user's teams: the list the
// message carried, or else Redis, read when asked (after the change, and
// possibly after later ones: a receiver then decides on a newer state,
// whose own events follow).
type memberView struct {
	s     *Store
	user  string
	teams []string // nil with many
	many  bool
}

func (v memberView) In(ctx context.Context, teams []string) ([]bool, error) {
	if !v.many {
		return store.TeamList(v.teams).In(ctx, teams)
	}
	out := make([]bool, len(teams))
	if len(teams) == 0 {
		return out, nil
	}
	args := make([]any, len(teams))
	for i, t := range teams {
		args[i] = t
	}
	in, err := v.s.rdb.SMIsMember(ctx, userTeamsKey(v.user), args...).Result()
	if err != nil || len(in) != len(teams) {
		return nil, v.s.failed(store.OpQuery, fmt.Errorf("redisstore: teams of: %w", errors.Join(ErrUnavailable, err)))
	}
	copy(out, in)
	return out, nil
}

func (v memberView) List(ctx context.Context) ([]string, error) {
	if !v.many {
		return v.teams, nil
	}
	return v.s.TeamsOf(ctx, v.user)
}

// membershipChannel is one sharded channel, so membership events reach every
// node in the order they were published.
const membershipChannel = "gd:{members}:ev"

// maxMembershipPublishes bounds publishMembership's rounds; only a user
// whose teams keep changing for that long reaches it.
const maxMembershipPublishes = 16

// publishMembership publishes the membership as the user's side holds it,
// read in one step with the user's other teams (when few), not as the call
// asked: two calls racing on one membership may publish in the opposite
// order of their writes. After publishing, the membership (and the teams
// listed) is read again and, if it changed meanwhile, published again.
// Every call that changes the teams publishes after its write, so the event
// published last, whoever sends it, tells the final state.
func (s *Store) publishMembership(ctx context.Context, team, user string) error {
	return s.publishMembershipOnce(ctx, team, user, false)
}

// publishMembershipOnce is publishMembership; a join whose member's state
// cannot be read whole (a data loss not written back yet) is handed to
// deferMembership unless wait, when it waits here.
func (s *Store) publishMembershipOnce(ctx context.Context, team, user string, wait bool) error {
	if wait {
		if s.deferWaiting != nil {
			s.deferWaiting(team, user)
		}
		// The membership is read once the state reads whole, not before:
		// a removal during the hold-off (seconds) published its own event,
		// and a join read before it, published after it, would show the
		// user to the team they left until the next event.
		if _, err := s.shownOnceWhole(ctx, user); err != nil {
			return err
		}
	}
	m, err := s.readMembership(ctx, team, user)
	for round := 0; err == nil && round < maxMembershipPublishes; round++ {
		var ps []presence.Presence
		switch {
		case m.in && wait:
			ps, err = s.shownOnceWhole(ctx, user)
		case m.in:
			if ps, err = s.WholePresence(ctx, []string{user}); errors.Is(err, ErrRecovering) {
				s.deferMembership(team, user)
				return nil
			}
		default:
			// A removal's state is not shown to anyone: no wait for it.
			ps, err = s.Presence(ctx, []string{user})
		}
		if err != nil {
			return err
		}
		l := ps[0].Look()
		b, _ := json.Marshal(membershipMsg{Team: team, User: user, Joined: m.in,
			Teams: m.teams, Many: m.many, State: int(ps[0].State), Version: ps[0].Version, MV: m.mv,
			Text: l.Text, Emoji: l.Emoji, ExpiresAt: l.ExpiresAt, Since: unixMS(ps[0].Since), LastSeen: l.LastSeen})
		if err := s.rdb.SPublish(ctx, membershipChannel, b).Err(); err != nil {
			return s.failed(store.OpMembership, fmt.Errorf("redisstore: publish membership: %w", errors.Join(ErrUnavailable, err)))
		}
		var now membershipRead
		if now, err = s.readMembership(ctx, team, user); err == nil && now.same(m) {
			return nil
		}
		m = now
	}
	if err == nil {
		s.log.Warn("membership kept changing while published", "team", team)
	}
	return err
}

// deferMembership publishes a join's event from a goroutine of its own once
// the member's state reads whole again: the membership is written already,
// and the caller (an API request, a restore of many memberships after a
// loss) is not held for the hold-off. The event reads the membership as it
// is then, with its version (MV), so a later change published meanwhile is
// not undone by it.
func (s *Store) deferMembership(team, user string) {
	s.deferMu.Lock()
	defer s.deferMu.Unlock()
	if s.closed.Load() {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.HoldOff+s.cfg.NodeTTL+membershipPublishTimeout)
		defer cancel()
		if err := s.publishMembershipOnce(ctx, team, user, true); err != nil {
			s.log.Warn("membership event after a data loss not published; the resync that ends the recovery applies it", "team", team, "err", err)
		}
	}()
}

// membershipPublishTimeout bounds a deferred event's own reads and publish.
const membershipPublishTimeout = 5 * time.Second

// shownOnceWhole reads what viewers see of user for a membership event,
// waiting out a data loss's hold-off: a state read while the user's keys
// are lost and not written back yet is "offline at version 0", and a join
// pushes it to viewers seeing the user again, who may hold them at a later
// version (chaos, cluster: a join during a FLUSHALL sent u17=offline v0 to
// a viewer holding a recent u17). The membership is written already; only
// its event waits, at most until ctx ends and no longer than a hold-off
// and a node ttl (the sweeps that end a hold-off run every 100 ms).
func (s *Store) shownOnceWhole(ctx context.Context, user string) ([]presence.Presence, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.HoldOff+s.cfg.NodeTTL)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		// Presence's reading (the model's), not a snapshot's copy of the
		// state: a status set while offline moves the version, not the copy.
		ps, err := s.WholePresence(ctx, []string{user})
		if !errors.Is(err, ErrRecovering) {
			return ps, err
		}
		select {
		case <-ctx.Done():
			return nil, s.failed(store.OpMembership, fmt.Errorf("redisstore: publish membership: %w", errors.Join(ErrRecovering, ctx.Err())))
		case <-s.stop:
			return nil, fmt.Errorf("redisstore: publish membership: %w", errors.Join(ErrRecovering, ErrUnavailable))
		case <-t.C:
		}
	}
}

// membershipRead is a user's membership of one team, read in one step with
// the user's teams when they are at most maxListedTeams (else many), and
// the user's membership version.
type membershipRead struct {
	in    bool
	teams []string // sorted; nil with many
	many  bool
	mv    uint64
}

func (m membershipRead) same(o membershipRead) bool {
	return m.in == o.in && m.many == o.many && slices.Equal(m.teams, o.teams)
}

// readMembership reads user's membership of team in one step
// (member_read.lua): O(1) for a user in more than maxListedTeams teams.
func (s *Store) readMembership(ctx context.Context, team, user string) (membershipRead, error) {
	r, err := run(ctx, s.rdb, s.sc.memberRead, []string{userTeamsKey(user), userMVKey(user)}, team, maxListedTeams)
	reply, _ := r.([]any)
	if err == nil && len(reply) != 3 {
		err = fmt.Errorf("unexpected reply %v", r)
	}
	if err != nil {
		return membershipRead{}, s.failed(store.OpMembership, fmt.Errorf("redisstore: read membership: %w", errors.Join(ErrUnavailable, err)))
	}
	m := membershipRead{in: toInt(reply[0]) == 1}
	m.mv, _ = strconv.ParseUint(toString(reply[1]), 10, 64)
	if list, ok := reply[2].([]any); !ok {
		m.many = true
	} else if len(list) > 0 {
		m.teams = make([]string, len(list))
		for i, t := range list {
			m.teams[i] = toString(t)
		}
		sort.Strings(m.teams)
	}
	return m, nil
}

// changeMsg is a presence change on a team channel.
type changeMsg struct {
	User    string   `json:"u"`
	State   int      `json:"s"`
	Version uint64   `json:"v"`
	At      int64    `json:"at"`
	Teams   []string `json:"teams"`
	// What viewers see beside the state (v2), each only when set; ms.
	Text      string `json:"tx,omitempty"`
	Emoji     string `json:"em,omitempty"`
	ExpiresAt int64  `json:"ex,omitempty"`
	Since     int64  `json:"ss,omitempty"`
	LastSeen  int64  `json:"ls,omitempty"`
}

// statusMsg is a status change, for the user's own connections wherever
// they are: sent on the membership channel, which every node subscribes.
type statusMsg struct {
	Kind      string `json:"k"` // "status"
	User      string `json:"user"`
	Mode      int    `json:"m"`
	Text      string `json:"tx,omitempty"`
	Emoji     string `json:"em,omitempty"`
	ExpiresAt int64  `json:"ex,omitempty"`
	Version   uint64 `json:"v"`
}

// pubMsg is one message for one channel.
type pubMsg struct {
	channel string
	payload []byte
}

// maxUnpublished bounds the retry queue; past it the oldest are dropped
// (their viewers are resynced when Redis is healthy again).
const maxUnpublished = 100000

// publishChanges sends each change on the channel of each of its teams.
// The transition is already committed in Redis: a publish that fails is
// queued and retried, so the change is late rather than lost.
func (s *Store) publishChanges(ctx context.Context, out outcome) {
	var msgs []pubMsg
	for i, c := range out.Changes {
		teams := out.teams[i]
		sort.Strings(teams)
		b, _ := json.Marshal(changeMsg{User: c.UserID, State: int(c.State), Version: c.Version,
			At: c.At.UnixMilli(), Teams: teams, Text: c.Text, Emoji: c.Emoji, ExpiresAt: unixMS(c.ExpiresAt),
			Since: unixMS(c.Since), LastSeen: unixMS(c.LastSeen)})
		for _, t := range teams {
			msgs = append(msgs, pubMsg{teamChannel(t), b})
		}
	}
	s.publish(ctx, msgs)
}

// publishStatuses sends each status change to every node, for the user's
// own connections. Published before the changes it caused, so a device
// holds its status when it sees what viewers see of it.
func (s *Store) publishStatuses(ctx context.Context, sts []presence.StatusChange) {
	msgs := make([]pubMsg, 0, len(sts))
	for _, st := range sts {
		b, _ := json.Marshal(statusMsg{Kind: "status", User: st.UserID, Mode: int(st.Status.Mode), Text: st.Status.Text,
			Emoji: st.Status.Emoji, ExpiresAt: unixMS(st.Status.ExpiresAt), Version: st.Version})
		msgs = append(msgs, pubMsg{membershipChannel, b})
	}
	s.publish(ctx, msgs)
}

func unixMS(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func (s *Store) publish(ctx context.Context, msgs []pubMsg) {
	if len(msgs) == 0 {
		return
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(msgs))
	for i, m := range msgs {
		cmds[i] = pipe.SPublish(ctx, m.channel, m.payload)
	}
	_, _ = pipe.Exec(ctx)
	var failed []pubMsg
	for i, c := range cmds {
		if c.Err() != nil {
			failed = append(failed, msgs[i])
		}
	}
	s.m.published.Add(float64(len(msgs) - len(failed)))
	if len(failed) == 0 {
		return
	}
	s.m.errors.WithLabelValues("publish").Add(float64(len(failed)))
	if s.unpublished.addDroppingOldest(maxUnpublished, failed...) > 0 {
		s.healthy.Store(false) // too much lost: resync viewers on recovery
	}
}

// retryPublish sends the queued messages again.
func (s *Store) retryPublish(ctx context.Context) {
	s.publish(ctx, s.unpublished.take())
}
