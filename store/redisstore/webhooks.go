package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/webhook"
)

// The webhook queue: every transition script appends the webhook event of
// each change it publishes to its shard's stream (prelude.lua), in the same
// atomic script, so an event exists exactly when its change does. Every node
// reads all shards' streams in one consumer group; an entry stays pending
// for the node that read it until that node acknowledges and deletes it
// after a 2xx (or gives up), renewing its hold meanwhile (wh_keep.lua). The
// entries of a node that stopped renewing (killed, paused, cut off) are
// claimed by another after whClaimIdle. See docs/webhooks.md.
//
// Each webhook format has its own consumer group on the same streams, so
// that an event is emitted once (by the script) whatever the formats, and
// each format delivers and retries it on its own: a group's pending list
// and claims are its own. An entry is deleted only by the last group done
// with it (wh_done.lua), atomically, so neither loses it to the other.

// Consumer groups, one per webhook format.
const (
	WebhookGroup       = "greendot-webhooks"        // Standard Webhooks
	PusherWebhookGroup = "greendot-pusher-webhooks" // Pusher's format
)

func whKey(sh int) string { return prefix(sh) + "wh" }

// whShardMax is the bound of each shard's stream for a queue of total.
func whShardMax(total int) int {
	if total <= 0 {
		return 0
	}
	return max(1, (total+numShards-1)/numShards)
}

// whQueue is the Redis webhook.Source. Its methods are called by one
// goroutine (the Sender's dispatcher), but Prepare (occupancy.go), which
// the Sender's workers call and which touches none of their state.
type whQueue struct {
	s         *Store
	group     string
	others    []string // the other formats' groups on the same streams
	claimIdle time.Duration
	keep      *redis.Script
	done      *redis.Script

	nextClaim   time.Time
	cursors     [numShards]string // XAUTOCLAIM's, per shard
	nextCleanup time.Time
}

var _ webhook.Source = (*whQueue)(nil)

// Webhooks is the store's webhook queue as the Standard Webhooks format's
// group reads it, nil unless Config.WebhookQueue turned webhooks on and
// Config.WebhookGroups has that group.
func (s *Store) Webhooks() webhook.Source { return s.WebhookSource(WebhookGroup) }

// WebhookSource is the store's webhook queue as group reads it; nil unless
// group is one of Config.WebhookGroups.
func (s *Store) WebhookSource(group string) webhook.Source {
	q := s.wh[group]
	if q == nil {
		return nil
	}
	return q
}

func newWHQueue(s *Store, group string, groups []string) *whQueue {
	q := &whQueue{s: s, group: group, claimIdle: s.cfg.WebhookClaimIdle,
		keep: redis.NewScript(mustRead("wh_keep")), done: redis.NewScript(mustRead("wh_done"))}
	for _, g := range groups {
		if g != group {
			q.others = append(q.others, g)
		}
	}
	for sh := range q.cursors {
		q.cursors[sh] = "0-0"
	}
	return q
}

// makeGroups creates the consumer group on every shard's stream (and the
// stream), from the start of the stream: events added before (by a node
// started earlier) are delivered too.
func (q *whQueue) makeGroups(ctx context.Context, shards []int) error {
	pipe := q.s.rdb.Pipeline()
	cmds := make([]*redis.StatusCmd, len(shards))
	for i, sh := range shards {
		cmds[i] = pipe.XGroupCreateMkStream(ctx, whKey(sh), q.group, "0")
	}
	_, _ = pipe.Exec(ctx)
	for _, c := range cmds {
		if err := c.Err(); err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
			return err
		}
	}
	return nil
}

// Take implements webhook.Source: first, about once a second, the entries
// of dead consumers (idle past claimIdle), then new entries of every shard.
func (q *whQueue) Take(ctx context.Context, n int) ([]*webhook.Event, error) {
	per := max(1, n/numShards)
	node := q.s.cfg.Node
	var out []*webhook.Event
	var firstErr error
	now := time.Now()
	if !now.Before(q.nextClaim) {
		q.nextClaim = now.Add(time.Second)
		pipe := q.s.rdb.Pipeline()
		cmds := make([]*redis.XAutoClaimCmd, numShards)
		for sh := range cmds {
			cmds[sh] = pipe.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: whKey(sh), Group: q.group,
				MinIdle: q.claimIdle, Start: q.cursors[sh], Count: int64(per), Consumer: node})
		}
		_, _ = pipe.Exec(ctx)
		for sh, c := range cmds {
			msgs, next, err := c.Result()
			if err != nil {
				firstErr = q.readErr(ctx, sh, err, firstErr)
				continue
			}
			q.cursors[sh] = next
			if len(msgs) > 0 {
				q.s.log.Info("webhooks: claimed the events of a consumer gone silent", "shard", sh, "events", len(msgs))
			}
			out = q.appendEvents(out, sh, msgs)
		}
		if !now.Before(q.nextCleanup) {
			q.nextCleanup = now.Add(time.Minute)
			q.cleanup(ctx)
		}
	}
	if len(out) >= n {
		return out, firstErr
	}
	pipe := q.s.rdb.Pipeline()
	cmds := make([]*redis.XStreamSliceCmd, numShards)
	for sh := range cmds {
		cmds[sh] = pipe.XReadGroup(ctx, &redis.XReadGroupArgs{Group: q.group, Consumer: node,
			Streams: []string{whKey(sh), ">"}, Count: int64(per), Block: -1})
	}
	_, _ = pipe.Exec(ctx)
	for sh, c := range cmds {
		streams, err := c.Result()
		if err != nil {
			if !errors.Is(err, redis.Nil) {
				firstErr = q.readErr(ctx, sh, err, firstErr)
			}
			continue
		}
		for _, st := range streams {
			out = q.appendEvents(out, sh, st.Messages)
		}
	}
	return out, firstErr
}

// readErr handles a failed read of shard sh: a stream or group Redis lost
// (FLUSHALL, a restart without data) is made again.
func (q *whQueue) readErr(ctx context.Context, sh int, err, firstErr error) error {
	if redis.HasErrorPrefix(err, "NOGROUP") {
		if err = q.makeGroups(ctx, []int{sh}); err == nil {
			return firstErr
		}
	}
	if firstErr == nil {
		return fmt.Errorf("shard %d: %w", sh, err)
	}
	return firstErr
}

func (q *whQueue) appendEvents(out []*webhook.Event, sh int, msgs []redis.XMessage) []*webhook.Event {
	for _, m := range msgs {
		ev, err := parseWHEntry(m)
		if err != nil {
			// Not ours to deliver, and it would come back forever.
			q.s.log.Error("webhooks: a malformed queue entry is removed", "shard", sh, "id", m.ID, "err", err)
			_ = q.s.rdb.XAck(context.Background(), whKey(sh), q.group, m.ID).Err()
			_ = q.s.rdb.XDel(context.Background(), whKey(sh), m.ID).Err()
			continue
		}
		ev.Ref = strconv.Itoa(sh) + "/" + m.ID
		out = append(out, ev)
	}
	return out
}

// parseWHEntry reads a stream entry as prelude.lua writes it.
func parseWHEntry(m redis.XMessage) (*webhook.Event, error) {
	str := func(k string) string { s, _ := m.Values[k].(string); return s }
	num := func(k string) (int64, error) { return strconv.ParseInt(str(k), 10, 64) }
	user := str("u")
	if user == "" {
		return nil, errors.New("no user")
	}
	st, err1 := num("s")
	prev, err2 := num("p")
	at, err3 := num("at")
	v, err4 := strconv.ParseUint(str("v"), 10, 64)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, err
	}
	ev := &webhook.Event{UserID: user, State: presence.State(st), Previous: presence.State(prev),
		Version: v, At: time.UnixMilli(at), Text: str("tx"), Emoji: str("em")}
	if seen, err := num("seen"); err == nil && seen > 0 {
		ev.LastSeen = time.UnixMilli(seen)
	}
	if t := str("t"); t != "" {
		ev.Teams = strings.Split(t, "\n")
		slices.Sort(ev.Teams)
	}
	if dr, err := num("dr"); err == nil && dr > 0 {
		ev.Dropped = int(dr)
	}
	return ev, nil
}

// byShard groups events by the shard of their Ref.
func byShard(evs []*webhook.Event) map[int][]*webhook.Event {
	out := map[int][]*webhook.Event{}
	for _, ev := range evs {
		sh, _, ok := splitRef(ev.Ref)
		if ok {
			out[sh] = append(out[sh], ev)
		}
	}
	return out
}

func splitRef(ref string) (int, string, bool) {
	a, id, ok := strings.Cut(ref, "/")
	sh, err := strconv.Atoi(a)
	return sh, id, ok && err == nil && sh >= 0 && sh < numShards
}

// Ready implements webhook.Source: Take is polled.
func (q *whQueue) Ready() <-chan struct{} { return nil }

// Keep implements webhook.Source.
func (q *whQueue) Keep(ctx context.Context, evs []*webhook.Event) ([]*webhook.Event, error) {
	var lost []*webhook.Event
	var firstErr error
	for sh, list := range byShard(evs) {
		args := []any{q.group, q.s.cfg.Node}
		for _, ev := range list {
			_, id, _ := splitRef(ev.Ref)
			args = append(args, id)
		}
		v, err := run(ctx, q.s.rdb, q.keep, []string{whKey(sh)}, args...)
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			continue // not known to be lost: try again next time
		}
		kept := map[string]bool{}
		if r, ok := v.([]any); ok {
			for _, id := range r {
				kept[toString(id)] = true
			}
		}
		for _, ev := range list {
			if _, id, _ := splitRef(ev.Ref); !kept[id] {
				lost = append(lost, ev)
			}
		}
	}
	return lost, firstErr
}

// Done implements webhook.Source: acknowledged and deleted, so the stream
// holds only what is still to deliver (its length is the queue's depth).
// With other groups, deleted only once none of them has it to deliver.
func (q *whQueue) Done(ctx context.Context, evs []*webhook.Event) error {
	if len(q.others) > 0 {
		return q.doneShared(ctx, evs)
	}
	pipe := q.s.rdb.Pipeline()
	for sh, list := range byShard(evs) {
		ids := make([]string, len(list))
		for i, ev := range list {
			_, ids[i], _ = splitRef(ev.Ref)
		}
		pipe.XAck(ctx, whKey(sh), q.group, ids...)
		pipe.XDel(ctx, whKey(sh), ids...)
	}
	_, err := pipe.Exec(ctx)
	return err
}

func (q *whQueue) doneShared(ctx context.Context, evs []*webhook.Event) error {
	var firstErr error
	for sh, list := range byShard(evs) {
		args := []any{q.group, len(q.others)}
		for _, g := range q.others {
			args = append(args, g)
		}
		for _, ev := range list {
			_, id, _ := splitRef(ev.Ref)
			args = append(args, id)
		}
		if _, err := run(ctx, q.s.rdb, q.done, []string{whKey(sh)}, args...); err != nil {
			firstErr = cmp.Or(firstErr, err)
		}
	}
	return firstErr
}

// Stats implements webhook.Source, for the whole cluster.
func (q *whQueue) Stats(ctx context.Context) (int, time.Time, error) {
	pipe := q.s.rdb.Pipeline()
	lens := make([]*redis.IntCmd, numShards)
	firsts := make([]*redis.XMessageSliceCmd, numShards)
	for sh := range lens {
		lens[sh] = pipe.XLen(ctx, whKey(sh))
		firsts[sh] = pipe.XRangeN(ctx, whKey(sh), "-", "+", 1)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, time.Time{}, err
	}
	depth := 0
	var oldest time.Time
	for sh := range lens {
		depth += int(lens[sh].Val())
		for _, m := range firsts[sh].Val() {
			if ev, err := parseWHEntry(m); err == nil && (oldest.IsZero() || ev.At.Before(oldest)) {
				oldest = ev.At
			}
		}
	}
	return depth, oldest, nil
}

// cleanup removes consumers of nodes long gone that hold nothing: each
// process with a new node id adds one to every shard's group.
func (q *whQueue) cleanup(ctx context.Context) {
	for sh := range numShards {
		cs, err := q.s.rdb.XInfoConsumers(ctx, whKey(sh), q.group).Result()
		if err != nil {
			continue
		}
		for _, c := range cs {
			if c.Pending == 0 && c.Idle > time.Hour && c.Name != q.s.cfg.Node {
				_ = q.s.rdb.XGroupDelConsumer(ctx, whKey(sh), q.group, c.Name).Err()
			}
		}
	}
}
