package redisstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/greendot/greendot/presence"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// scripts are the atomic transitions, each prefixed with the shared prelude
// but heartbeat and beat (the most frequent, which need none of it), and the two halves
// of a membership change. Each names in KEYS every key known before the
// call (shardKeys, userKeys); sweep, reconcile and forget also reach the
// keys of users they find in the shard (prelude.lua).
type scripts struct {
	connect, heartbeat, status, disconnect, sweep, beat, presence, reconcile *redis.Script
	memberUser, memberTeam, memberRead                                       *redis.Script
	floor                                                                    *redis.Script
	userStatus                                                               *redis.Script // set_status

	forget *redis.Script // not a transition: drops users offline for forget-after

	pxSet, pxLive, pxDrop *redis.Script // channel counts (pusher.go)
	pxInfo                *redis.Script // a member's user_info (pusher.go)
	occupancy             *redis.Script // Pusher webhooks' occupancy (occupancy.go)
}

// loadScripts builds the scripts; with whMax > 0 webhooks are on and every
// published change is also added to its shard's webhook stream, bounded to
// whMax entries (prelude.lua). Off, the scripts skip it: the text differs,
// so a node's scripts are those of its own setting.
func loadScripts(whMax int) scripts {
	prelude := fmt.Sprintf("local WH_ON, WH_MAX = %t, %d\n", whMax > 0, whMax) + mustRead("prelude")
	s := func(name string) *redis.Script { return redis.NewScript(prelude + "\n" + mustRead(name)) }
	return scripts{
		forget:  s("forget"),
		connect: s("connect"), status: s("status"),
		heartbeat:  redis.NewScript(mustRead("heartbeat")),
		disconnect: s("disconnect"), sweep: s("sweep"), beat: redis.NewScript(mustRead("beat")),
		presence: s("presence"), reconcile: s("reconcile"), floor: s("floor"),
		userStatus: s("user_status"),
		memberUser: redis.NewScript(mustRead("member_user")),
		memberTeam: redis.NewScript(mustRead("member_team")),
		memberRead: redis.NewScript(mustRead("member_read")),
		pxSet:      redis.NewScript(mustRead("px_set")),
		pxLive:     redis.NewScript(mustRead("px_live")),
		pxDrop:     redis.NewScript(mustRead("px_drop")),
		pxInfo:     redis.NewScript(mustRead("px_info")),
		occupancy:  redis.NewScript(mustRead("occupancy")),
	}
}

func mustRead(name string) string {
	b, err := luaFiles.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic(err) // embedded at build time
	}
	return string(b)
}

// shardKeyNames are each shard's keys in the order every script but the
// membership ones takes them first (prelude.lua): deadlines, connection →
// user, node liveness, grace ends, users not offline, last sweep, hold-off,
// resync floor, offline users, emptied (a data loss's hold-off), webhook
// stream, status expiries. Read-only.
var shardKeyNames = func() (k [numShards][]string) {
	for sh := range k {
		p := prefix(sh)
		k[sh] = []string{p + "dl", p + "c", p + "nodes", p + "grace", p + "present", p + "ls", p + "ho", p + "fl", p + "off", p + "em", whKey(sh), p + "st"}
	}
	return k
}()

// shardKeys are the KEYS of a script about a shard.
func shardKeys(sh int) []string { return shardKeyNames[sh] }

// userKeys are the KEYS of a script about one user: the shard's, then the
// user's state (u:), connections (uc:), state copy (sv:) and teams (ut:),
// then extra (a node's connection set, nc:).
func userKeys(user string, extra ...string) []string {
	sh := shardOf(user)
	p := prefix(sh)
	keys := make([]string, 0, len(shardKeyNames[sh])+4+len(extra))
	keys = append(keys, shardKeyNames[sh]...)
	keys = append(keys, p+"u:"+user, p+"uc:"+user, p+"sv:"+user, p+"ut:"+user)
	return append(keys, extra...)
}

// ncKey is the set of node's connections in a shard.
func ncKey(sh int, node string) string { return prefix(sh) + "nc:" + node }

// run evaluates a script; if Redis lost it (a restart, SCRIPT FLUSH), by
// EVAL, which caches it again.
func run(ctx context.Context, c redis.UniversalClient, s *redis.Script, keys []string, args ...any) (any, error) {
	cmd := evalSha(ctx, s, keys, args)
	_ = c.Process(ctx, cmd)
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		return s.Eval(ctx, c, keys, args...).Result()
	}
	return cmd.Result()
}

// evalSha is the EVALSHA of script with keys and args, for c.Process or a
// pipeline's. go-redis's own boxes every key into its argument list, an
// allocation each: ~16 per call on a user's keys, ~50 per connect. Here
// the keys after the first go as pointers into keys (go-redis writes a
// *string as the string); the first, which routes the call on a cluster,
// as the string itself. args go as they are: none of the callers passes
// a lone slice or map for go-redis to spread.
func evalSha(ctx context.Context, script *redis.Script, keys []string, args []any) *redis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, "evalsha", script.Hash(), len(keys))
	for i := range keys {
		if i == 0 {
			a = append(a, keys[0])
		} else {
			a = append(a, &keys[i])
		}
	}
	a = append(a, args...)
	cmd := redis.NewCmd(ctx, a...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd
}

// outcome decodes a transition's reply (see reply() in prelude.lua).
type outcome struct {
	presence.Outcome
	teams [][]string // per change
}

func parseOutcome(v any) (outcome, error) {
	var out outcome
	r, ok := v.([]any)
	if !ok || len(r) < 6 {
		return out, fmt.Errorf("redisstore: unexpected script reply %T", v)
	}
	out.GraceCancelled = int(toInt(r[0]))
	out.GraceStarted = int(toInt(r[1]))
	expired, _ := r[2].([]any)
	lags, _ := r[3].([]any)
	for i, id := range expired {
		out.Expired = append(out.Expired, presence.Conn{ID: toString(id)})
		if i < len(lags) {
			out.ExpiryLag = append(out.ExpiryLag, time.Duration(toInt(lags[i]))*time.Millisecond)
		}
	}
	sts, _ := r[4].([]any)
	for i, x := range sts {
		if i == 0 {
			out.StatusesExpired = int(toInt(x))
			continue
		}
		st, ok := x.([]any)
		if !ok || len(st) < 6 {
			return out, fmt.Errorf("redisstore: unexpected status %v", x)
		}
		version, err := strconv.ParseUint(toString(st[5]), 10, 64)
		if err != nil {
			return out, fmt.Errorf("redisstore: bad version %v", st[5])
		}
		out.Statuses = append(out.Statuses, presence.StatusChange{UserID: toString(st[0]), Version: version,
			Status: presence.Status{Mode: presence.Mode(toInt(st[1])), Text: toString(st[2]), Emoji: toString(st[3]),
				ExpiresAt: msTime(toInt(st[4]))}})
	}
	glags, _ := r[5].([]any)
	for _, l := range glags {
		out.GraceLag = append(out.GraceLag, time.Duration(toInt(l))*time.Millisecond)
	}
	for _, c := range r[6:] {
		ch, ok := c.([]any)
		if !ok || len(ch) < 11 {
			return out, fmt.Errorf("redisstore: unexpected change %v", c)
		}
		version, err := strconv.ParseUint(toString(ch[2]), 10, 64)
		if err != nil {
			return out, fmt.Errorf("redisstore: bad version %v", ch[2])
		}
		out.Changes = append(out.Changes, presence.Change{
			UserID:    toString(ch[0]),
			State:     presence.State(toInt(ch[1])),
			Version:   version,
			At:        time.UnixMilli(toInt(ch[3])),
			Text:      toString(ch[5]),
			Emoji:     toString(ch[6]),
			ExpiresAt: msTime(toInt(ch[7])),
			Since:     msTime(toInt(ch[8])),
			LastSeen:  msTime(toInt(ch[9])),
			Previous:  presence.State(toInt(ch[10])),
		})
		var teams []string
		if ts, ok := ch[4].([]any); ok {
			for _, t := range ts {
				teams = append(teams, toString(t))
			}
		}
		out.teams = append(out.teams, teams)
	}
	return out, nil
}

// scriptErr maps a script's error reply to the store's sentinel errors.
func scriptErr(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "UNKNOWN connection"):
		return ErrUnknownConn
	case strings.Contains(msg, "DUPLICATE connection"):
		return ErrDuplicateConn
	}
	return errors.Join(ErrUnavailable, err)
}

// msTime is Unix ms as a time; 0 is the zero time (none).
func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

func toInt(v any) int64 {
	switch v := v.(type) {
	case int64:
		return v
	case string:
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	return 0
}

func toString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case int64:
		return strconv.FormatInt(v, 10)
	}
	return fmt.Sprint(v)
}
