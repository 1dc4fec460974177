package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/greendot/greendot/store"
)

var (
	_ store.Broadcaster    = (*Store)(nil)
	_ store.ChannelCounter = (*Store)(nil)
	_ store.MemberInfos    = (*Store)(nil)
)

// pxChannel carries app messages (Pusher channel events) to every node. It
// is a sharded channel on one fixed slot, not a classic one: on a cluster a
// classic PUBLISH is copied over the cluster bus to every master and
// replica, so its cost grows with the cluster, while a sharded one stays on
// the slot's shard, which every node subscribes to. One slot also gives one
// ordered stream, and matches the store's other channels (pubsub.go).
const pxChannel = "gd:{px}:ev"

// pxNodesKey scores each node that set channel counts with the expiry of
// its last refresh (ms, by the clock of the slot's master).
const pxNodesKey = "gd:{px}:nodes"

// A node's channel counts and the expiry they were written with (px_drop.lua),
// in a slot of the node's own, so that nodes' counts spread over a cluster.
func pxCountsKey(node string) string { return "gd:{pxn:" + node + "}:ch" }
func pxStampKey(node string) string  { return "gd:{pxn:" + node + "}:at" }

// teamInfoKey holds the members' Pusher user_info, in the team's slot, so
// that a removal drops it in the same script (member_team.lua).
func teamInfoKey(team string) string { return "gd:{t:" + team + "}:ui" }

// Broadcast implements store.Broadcaster: one SPUBLISH. Not retried: a
// timeout leaves it unknown whether it was sent, and a message is delivered
// at most once. Calls that do not overlap arrive in their order; calls made
// at once may take different connections and arrive in either.
func (s *Store) Broadcast(ctx context.Context, payload []byte) error {
	if err := s.rdb.SPublish(ctx, pxChannel, payload).Err(); err != nil {
		return s.failed("broadcast", fmt.Errorf("redisstore: broadcast: %w", errors.Join(ErrUnavailable, err)))
	}
	return nil
}

// OnBroadcast implements store.Broadcaster. The handler runs on the reader
// of the pxChannel subscription, made in New; go-redis subscribes again by
// itself after a lost connection (what was sent meanwhile is lost).
func (s *Store) OnBroadcast(h func(payload []byte)) {
	if h == nil {
		s.onBroadcast.Store(nil)
		return
	}
	s.onBroadcast.Store(&h)
}

func (s *Store) deliverBroadcast(payload string) {
	if h := s.onBroadcast.Load(); h != nil {
		(*h)([]byte(payload))
	}
}

// SetChannelCounts implements store.ChannelCounter: the node is marked live
// until ChannelCountsTTL from now (px_set.lua), then its counts are replaced
// in one MULTI, stamped with that expiry. Should the second step fail, the
// node counts with its previous counts until its next refresh.
func (s *Store) SetChannelCounts(ctx context.Context, counts map[string]int) error {
	ttl := s.cfg.ChannelCountsTTL
	exp, err := run(ctx, s.rdb, s.sc.pxSet, []string{pxNodesKey}, s.cfg.Node, ttl.Milliseconds())
	if err != nil {
		return s.failed("channel_counts", fmt.Errorf("redisstore: set channel counts: %w", errors.Join(ErrUnavailable, err)))
	}
	s.countsSet.Store(true)
	fields := make([]any, 0, 2*len(counts))
	for ch, n := range counts {
		if n > 0 {
			fields = append(fields, ch, n)
		}
	}
	// Found dead, the counts are deleted by whoever reads them; the keys
	// expire too, after twice the ttl, in case nobody does.
	keep := 2 * ttl
	ch := pxCountsKey(s.cfg.Node)
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, ch)
		if len(fields) > 0 {
			p.HSet(ctx, ch, fields...)
			p.PExpire(ctx, ch, keep)
		}
		p.Set(ctx, pxStampKey(s.cfg.Node), toString(exp), keep)
		return nil
	})
	if err != nil {
		return s.failed("channel_counts", fmt.Errorf("redisstore: set channel counts: %w", errors.Join(ErrUnavailable, err)))
	}
	return nil
}

// ChannelCounts implements store.ChannelCounter: the live nodes from
// pxNodesKey (which drops the dead, px_live.lua), then one pipeline that
// reads the live nodes' counts and deletes the dead ones' (go-redis splits
// it per cluster node).
func (s *Store) ChannelCounts(ctx context.Context, prefix string) (map[string]int, error) {
	r, err := run(ctx, s.rdb, s.sc.pxLive, []string{pxNodesKey})
	if err != nil {
		return nil, s.failed("channel_counts", fmt.Errorf("redisstore: channel counts: %w", errors.Join(ErrUnavailable, err)))
	}
	reply, _ := r.([]any)
	if len(reply) != 2 {
		return nil, fmt.Errorf("redisstore: channel counts: unexpected reply %v", r)
	}
	live, dead := asStrings(reply[0]), asStrings(reply[1])
	out := make(map[string]int)
	if len(live)+len(dead) == 0 {
		return out, nil
	}
	pipe := s.rdb.Pipeline()
	reads := make([]*redis.MapStringStringCmd, len(live))
	for i, node := range live {
		reads[i] = pipe.HGetAll(ctx, pxCountsKey(node))
	}
	for i := 0; i+1 < len(dead); i += 2 {
		// Eval, not EvalSha: a pipeline cannot load a script Redis lost,
		// and this one is short.
		s.sc.pxDrop.Eval(ctx, pipe, []string{pxCountsKey(dead[i]), pxStampKey(dead[i])}, dead[i+1])
	}
	_, _ = pipe.Exec(ctx) // a failed drop is retried by the next read that finds it: only the reads count
	for _, c := range reads {
		counts, err := c.Result()
		if err != nil {
			return nil, s.failed("channel_counts", fmt.Errorf("redisstore: channel counts: %w", errors.Join(ErrUnavailable, err)))
		}
		for ch, v := range counts {
			if n, _ := strconv.Atoi(v); n > 0 && strings.HasPrefix(ch, prefix) {
				out[ch] += n
			}
		}
	}
	return out, nil
}

// releaseChannelCounts removes this node's counts at once, on Close: its
// channels need not wait for the ttl.
func (s *Store) releaseChannelCounts(ctx context.Context) {
	if !s.countsSet.Load() {
		return
	}
	_ = s.rdb.ZRem(ctx, pxNodesKey, s.cfg.Node).Err()
	_ = s.rdb.Del(ctx, pxCountsKey(s.cfg.Node), pxStampKey(s.cfg.Node)).Err()
}

// SetMemberInfo implements store.MemberInfos: a field of the team's hash.
func (s *Store) SetMemberInfo(ctx context.Context, team, user string, info []byte) error {
	if _, err := run(ctx, s.rdb, s.sc.pxInfo, []string{teamKey(team), teamInfoKey(team)}, user, string(info)); err != nil {
		return s.failed("member_info", fmt.Errorf("redisstore: set member info: %w", errors.Join(ErrUnavailable, err)))
	}
	return nil
}

// MemberInfos implements store.MemberInfos: one HMGET.
func (s *Store) MemberInfos(ctx context.Context, team string, users []string) ([][]byte, error) {
	out := make([][]byte, len(users))
	if len(users) == 0 {
		return out, nil
	}
	vals, err := s.rdb.HMGet(ctx, teamInfoKey(team), users...).Result()
	if err != nil {
		return nil, s.failed(store.OpQuery, fmt.Errorf("redisstore: member infos: %w", errors.Join(ErrUnavailable, err)))
	}
	for i, v := range vals {
		if str, ok := v.(string); ok && i < len(out) {
			out[i] = []byte(str)
		}
	}
	return out, nil
}
