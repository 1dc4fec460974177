package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
)

// WholePresence implements store.LossGuard: Presence, refused with
// ErrRecovering if a shard it read (or, on a cluster, any master) is in the
// hold-off after a data loss or was emptied and not swept since. The check
// follows the reads on each master's connection, so a loss before a read is
// seen by it (the sweep that finds the shard emptied marks it in the same
// step as it records the sweep), and a loss after it is refused too.
func (s *Store) WholePresence(ctx context.Context, userIDs []string) ([]presence.Presence, error) {
	out, err := s.Presence(ctx, userIDs)
	if err != nil {
		return nil, err
	}
	var read [numShards]bool
	for _, u := range userIDs {
		read[shardOf(u)] = true
	}
	s.addWitnesses(ctx, &read)
	pipe := s.rdb.Pipeline()
	checks := lossChecks(ctx, pipe, &read)
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, s.failed(store.OpQuery, fmt.Errorf("redisstore: presence: %w", errors.Join(ErrUnavailable, err)))
	}
	if !allIntact(checks) {
		return nil, ErrRecovering
	}
	return out, nil
}

// lossChecks queues in pipe a read of the loss keys of each shard marked
// in shards; allIntact judges them once the pipeline ran.
func lossChecks(ctx context.Context, pipe redis.Pipeliner, shards *[numShards]bool) []*redis.SliceCmd {
	var checks []*redis.SliceCmd
	for sh, r := range shards {
		if r {
			checks = append(checks, pipe.MGet(ctx, lossKeys(sh)...))
		}
	}
	return checks
}

// allIntact says whether every shard lossChecks read is intact.
func allIntact(checks []*redis.SliceCmd) bool {
	for _, c := range checks {
		if !intactShard(c.Val()) {
			return false
		}
	}
	return true
}

// lossKeys are shard sh's sweep record and loss mark, read with or after a
// whole read's data (intactShard judges them).
func lossKeys(sh int) []string { return []string{prefix(sh) + "ls", prefix(sh) + "em"} }

// intactShard says whether the values of lossKeys show a shard swept since
// it was last emptied and out of its hold-off.
func intactShard(vals []any) bool { return len(vals) == 2 && vals[0] != nil && vals[1] == nil }

// parseShown reads a user's sv copy, "w:v:since:expires:lastseen\ntext\nemoji"
// (show in prelude.lua), or "s:v" as written before the look existed, into
// p: what viewers see, as a snapshot needs it.
func parseShown(sv string, p *presence.Presence) bool {
	head, rest, _ := strings.Cut(sv, "\n")
	var f [5]string // not strings.Split: a snapshot parses one per team-mate
	n := 0
	for more := true; more && n < len(f); n++ {
		f[n], head, more = strings.Cut(head, ":")
	}
	if n < 2 {
		return false
	}
	p.State = presence.State(toInt(f[0]))
	p.Version, _ = strconv.ParseUint(f[1], 10, 64)
	if n == 5 {
		p.Since = msTime(toInt(f[2]))
		p.Status.ExpiresAt = msTime(toInt(f[3]))
		p.ShownLastSeen = msTime(toInt(f[4]))
		text, emoji, _ := strings.Cut(rest, "\n")
		p.Status.Text, p.Status.Emoji = unpinned(text), unpinned(emoji)
	}
	return true
}

// unpinned is s, or when s is empty an empty string that points nowhere: a
// node's views keep a snapshot's looks for as long as the team has members
// there, and an empty substring of a reply still points into it, keeping
// the whole reply (~48 bytes a team-mate, most statuses being empty) in a
// span of its own among a connect's garbage.
func unpinned(s string) string {
	if s == "" {
		return ""
	}
	return s
}

// States reads only the state and version of each user: what a snapshot
// needs. The scripts keep a copy of each user's state and version in a
// string key (sv:<user>), so a snapshot costs one MGET per shard it touches
// (at most numShards, pipelined) instead of one HMGET per user: 99 commands
// per connect were most of Redis's work in a reconnect storm. Users the copy
// lacks (data written before it existed, users forgotten, or never-seen users
// who joined their teams before member_user.lua gave them one) are read from
// their own hashes, in a second round trip.
func (s *Store) States(ctx context.Context, userIDs []string) ([]presence.Presence, error) {
	return s.states(ctx, userIDs, false)
}

// WholeStates implements store.LossGuard: States, refused with
// ErrRecovering if a shard read is in the hold-off after a data loss (EM)
// or was emptied and not swept since (no LS): its users of nodes not
// written back yet would read as offline. Checked in the same pipeline as
// the read, and on every master, even with no users to read (see
// addWitnesses).
func (s *Store) WholeStates(ctx context.Context, userIDs []string) ([]presence.Presence, error) {
	return s.states(ctx, userIDs, true)
}

// addWitnesses marks in read a shard, with no user to read, on each
// master that none of the shards read is on. The caller read the users'
// list before (its teams, their members), from other slots: a master that
// lost its data before that read answered no members, whose states are
// then not asked for at all, and the check of the shards read passes
// (chaos, cluster: a snapshot between the FLUSHALLs of two masters left
// out a live user). A check on that master, after the read, sees the loss.
// On one Redis any shard is that master; one is added only if none is
// read. The masters come from go-redis's slot map, without a round trip; a
// master that holds no shard (more masters than shards) goes unchecked.
func (s *Store) addWitnesses(ctx context.Context, read *[numShards]bool) {
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		if !slices.Contains(read[:], true) {
			read[0] = true
		}
		return
	}
	var masters [numShards]string
	for sh := range masters {
		c, err := cc.MasterForKey(ctx, prefix(sh))
		if err != nil {
			// No slot map: check every shard.
			for sh := range read {
				read[sh] = true
			}
			return
		}
		masters[sh] = c.Options().Addr
	}
	covered := make(map[string]bool)
	for sh, r := range read {
		if r {
			covered[masters[sh]] = true
		}
	}
	for sh, m := range masters {
		if !covered[m] {
			covered[m] = true
			read[sh] = true
		}
	}
}

// lossArgs are lossKeys as MGET arguments, made once: every whole read
// sends them.
var lossArgs = func() (a [numShards][2]any) {
	for sh := range a {
		k := lossKeys(sh)
		a[sh] = [2]any{k[0], k[1]}
	}
	return a
}()

func (s *Store) states(ctx context.Context, userIDs []string, whole bool) ([]presence.Presence, error) {
	out := make([]presence.Presence, len(userIDs))
	if len(userIDs) == 0 && !whole {
		return out, nil
	}
	// A connect reads ~99 team-mates here, so the first round trip is built
	// with a handful of allocations, not several per user (a map of
	// per-shard slices, a key string each, each boxed into an MGET
	// argument): the users are grouped by shard with a counting sort, their
	// keys are substrings of one string, and the arguments point at them
	// (go-redis writes a *string as the string).
	var read [numShards]bool
	var count [numShards]int
	keyLen := 0
	for i, u := range userIDs {
		out[i].UserID = u
		sh := shardOf(u)
		read[sh] = true
		count[sh]++
		keyLen += len(prefix(sh)) + len("sv:") + len(u)
	}
	if whole {
		s.addWitnesses(ctx, &read)
	}
	var next [numShards]int // where each shard's users start in order, then its fill cursor
	nargs := 0
	for sh, n := 0, 0; sh < numShards; sh++ {
		next[sh] = n
		n += count[sh]
		if read[sh] {
			nargs += 1 + count[sh]
			if whole {
				nargs += len(lossArgs[sh])
			}
		}
	}
	order := make([]int, len(userIDs)) // indexes into userIDs, shard by shard
	for i, u := range userIDs {
		sh := shardOf(u)
		order[next[sh]] = i
		next[sh]++
	}
	// Shard by shard, as order is: each key's prefix without hashing again.
	var b strings.Builder
	b.Grow(keyLen)
	for sh := range numShards {
		for _, i := range order[next[sh]-count[sh] : next[sh]] {
			b.WriteString(prefix(sh))
			b.WriteString("sv:")
			b.WriteString(userIDs[i])
		}
	}
	all := b.String()
	keys := make([]string, len(order))
	for sh, k, off := 0, 0, 0; sh < numShards; sh++ {
		for ; k < next[sh]; k++ {
			n := len(prefix(sh)) + len("sv:") + len(userIDs[order[k]])
			keys[k] = all[off : off+n]
			off += n
		}
	}
	pipe := s.rdb.Pipeline()
	type shardRead struct {
		from, to int // the shard's users in order
		cmd      *redis.StringSliceCmd
	}
	var reads [numShards]shardRead
	args := make([]any, 0, nargs)
	for sh := range numShards {
		if !read[sh] {
			continue
		}
		from := next[sh] - count[sh]
		first := len(args)
		args = append(args, "mget")
		// The shard's loss markers go in the same MGET, which Redis runs as
		// one step: a loss (FLUSHALL) falls before it or after it, never
		// between the check and the read. One MGET per shard, not two.
		if whole {
			args = append(args, lossArgs[sh][:]...)
		}
		for k := from; k < next[sh]; k++ {
			if k == from && !whole {
				// The first key routes the command on a cluster: a string,
				// whatever go-redis makes of a pointer there.
				args = append(args, keys[k])
				continue
			}
			args = append(args, &keys[k])
		}
		cmd := redis.NewStringSliceCmd(ctx, args[first:len(args):len(args)]...)
		_ = pipe.Process(ctx, cmd)
		reads[sh] = shardRead{from, next[sh], cmd}
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, s.failed(store.OpQuery, fmt.Errorf("redisstore: states: %w", errors.Join(ErrUnavailable, err)))
	}
	var missing []int
	for sh, r := range reads {
		if !read[sh] {
			continue
		}
		vals := r.cmd.Val() // a missing key reads as ""; no copy or mark is ever empty
		if whole {
			if len(vals) != len(lossArgs[sh])+r.to-r.from || vals[0] == "" || vals[1] != "" {
				return nil, ErrRecovering
			}
			vals = vals[len(lossArgs[sh]):]
		} else if len(vals) != r.to-r.from {
			return nil, s.failed(store.OpQuery, fmt.Errorf("redisstore: states: %d values for %d keys: %w", len(vals), r.to-r.from, ErrUnavailable))
		}
		for k, v := range vals {
			if i := order[r.from+k]; v == "" || !parseShown(v, &out[i]) {
				missing = append(missing, i)
			}
		}
	}
	if len(missing) == 0 {
		return out, nil
	}
	pipe = s.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(missing))
	for k, i := range missing {
		u := userIDs[i]
		cmds[k] = pipe.HMGet(ctx, prefix(shardOf(u))+"u:"+u, "s", "v", "lk", "ss")
	}
	// This round trip reads after the first one's check: its shards are
	// checked again, after the read (a loss in between reads as offline).
	var checks []*redis.SliceCmd
	if whole {
		var again [numShards]bool
		for _, i := range missing {
			again[shardOf(userIDs[i])] = true
		}
		checks = lossChecks(ctx, pipe, &again)
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, s.failed(store.OpQuery, fmt.Errorf("redisstore: states: %w", errors.Join(ErrUnavailable, err)))
	}
	if !allIntact(checks) {
		return nil, ErrRecovering
	}
	for k, c := range cmds {
		vals := c.Val()
		if len(vals) < 4 {
			continue
		}
		i := missing[k]
		out[i].State = presence.State(toInt(vals[0]))
		if v, ok := vals[1].(string); ok {
			out[i].Version, _ = strconv.ParseUint(v, 10, 64)
		}
		if lk, ok := vals[2].(string); ok {
			// The look "w\ntext\nemoji\nexpires\nlastseen" as the copy holds it.
			f := strings.SplitN(lk, "\n", 5)
			if len(f) == 5 {
				since, _ := vals[3].(string)
				parseShown(f[0]+":"+strconv.FormatUint(out[i].Version, 10)+":"+since+":"+f[3]+":"+f[4]+"\n"+f[1]+"\n"+f[2], &out[i])
			}
		}
	}
	return out, nil
}
