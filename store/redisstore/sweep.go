package redisstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/greendot/greendot/store"
)

// allShards is the bit set of every shard.
const allShards = 1<<numShards - 1

// Sweep implements store.Tracker: one atomic script per shard, pipelined;
// then, at most every forgetPace, the forgetting of users offline for
// ForgetAfter (see forget).
//
// Every node sweeping every shard at each tick made Redis's work grow with
// the nodes (32 scripts per node every 100 ms, the bulk of an idle
// cluster's Redis CPU). The live nodes share the shards out instead (the
// beats rank them, by name, in each shard): a node sweeps its own, and
// another's only when the shard's sweep record (LS, written by every sweep
// of any node) has stood still for staleSweep by this node's clock: its
// owner died, or the nodes' views of who owns what differ for a beat (a
// node coming, not counted by all yet). So no shard goes unswept for long,
// well within the gap that starts a hold-off (two thirds of the node ttl),
// and the sweeps do not grow with the nodes: a fallback sweep of every
// other shard once a second by each node was, at six nodes, 160 of 405
// script calls a second. Reading the records is a pipeline of plain GETs
// every staleCheckEvery, a few µs of Redis a shard rather than a script.
//
// A dead node's shards do not wait to be found stale: its connections
// there would count for their users longer than elsewhere. The
// dead node is in the liveness set of every shard, this node's own among
// them, so this node's first sweep after the lapse finds it; that sweep
// ranks it out (sweep.lua replies with this node's new rank) and sweeps
// every other shard at once, releasing the dead node's connections in the
// same tick as when every node swept every shard. While this node recovers
// (Redis away, a data loss) it sweeps every shard.
//
// An owned shard is swept when its next claim falls due, as its last sweep
// said (a grace end, a status expiry, a node's beat a node ttl old), and at
// least every ownedSweepMax; not at every tick whatever is due, which was
// most of an idle cluster's Redis CPU. What a sweep cannot know comes with
// its own sweep: the grace a disconnect starts (sweepAtGraceEnd) and a
// status expiry set (SetUserStatus), both on the node that wrote them.
func (s *Store) Sweep(ctx context.Context) error {
	start := time.Now()
	every := !s.healthy.Load() || s.lostData.Load() || s.awaitingResync.Load()
	owned, emptied := s.owned.Load(), s.emptied.Load()
	var stale uint64
	if !every {
		stale = s.staleShards(ctx, owned)
	}
	old := start.Add(-s.ownedSweepMax()).UnixNano()
	var shards, rest []int
	for sh := range numShards {
		bit := uint64(1) << sh
		due := s.sweepDue[sh].Load() <= start.UnixNano() || s.lastSwept[sh].Load() <= old
		// A loss's mark on another node's shard clears only with a sweep
		// of it by this node (Intact refuses reads until then).
		if every || owned&bit != 0 && due || stale&bit != 0 || emptied&bit != 0 && due {
			shards = append(shards, sh)
		} else {
			rest = append(rest, sh)
		}
	}
	s.m.sweeps.Inc()
	dead, err := s.sweepShards(ctx, shards, start)
	if dead && len(rest) > 0 {
		_, rerr := s.sweepShards(ctx, rest, start)
		err = cmp.Or(err, rerr)
	}
	if err == nil {
		err = s.forget(ctx)
	}
	if err != nil {
		return s.failed(store.OpSweep, fmt.Errorf("redisstore: sweep: %w", err))
	}
	return nil
}

// share takes shard sh as this node's to sweep, or leaves it, by the
// shard's own view of the live nodes (beat.lua, sweep.lua): shard sh goes
// to the node ranked sh mod live. Views that differ for a moment (a node
// coming) leave a shard to two nodes, or to the others once it is stale.
func (s *Store) share(sh int, live, rank int64) {
	bit := uint64(1) << sh
	if live <= 1 || (rank >= 0 && int64(sh)%live == rank) {
		s.owned.Or(bit)
	} else {
		s.owned.And(^bit)
	}
}

// staleSweep is how long another node's shard's sweep record may stand
// still, as this node sees it, before this node sweeps the shard. Its owner
// writes it every ownedSweepMax (a sixth of the node ttl) and a tick at
// most, and this node sees a change up to a look later (staleCheckEvery
// and a tick): a third leaves room for a late owner. Found at most a look
// after that, a shard is swept within about 0.55 of the node ttl of its
// last sweep, short of the gap that starts a hold-off (two thirds).
func (s *Store) staleSweep() time.Duration { return s.cfg.NodeTTL / 3 }

// staleCheckEvery is how often a node reads the others' sweep records (at
// the first Sweep that long after the last look).
func (s *Store) staleCheckEvery() time.Duration { return s.cfg.NodeTTL / 15 }

// sweepRecord is a shard's sweep record (LS) as this node last knew it, and
// since when, on the node's monotonic clock (since epoch): records are
// Redis's time, which this node's clock need not agree with.
type sweepRecord struct {
	value string
	since time.Duration
}

// sweptShard notes that this node's sweep, begun at seen, wrote record in
// shard sh: the record counts from then (the sweep replies with it, so a
// later sweep by another node is told apart at the next look).
func (s *Store) sweptShard(sh int, record string, seen time.Duration) {
	s.recordsMu.Lock()
	defer s.recordsMu.Unlock()
	s.records[sh] = sweepRecord{value: record, since: seen}
}

// staleShards reads, at most every staleCheckEvery, the sweep records of
// the shards this node does not own, in one pipeline, and returns those
// whose record stood still for staleSweep, or that have none (never swept,
// or emptied), or that this node sees for the first time (it starts, say,
// with a dead node's shards unswept for who knows how long): a sweep of
// those costs one script each, where waiting could let a gap start a
// hold-off. A record it cannot read is judged at the next look.
func (s *Store) staleShards(ctx context.Context, owned uint64) uint64 {
	now := time.Since(s.epoch)
	last := s.staleChecked.Load()
	if last != 0 && int64(now)-last < int64(s.staleCheckEvery()) || !s.staleChecked.CompareAndSwap(last, int64(now)) {
		return 0
	}
	var shards []int
	for sh := range numShards {
		if owned&(1<<sh) == 0 {
			shards = append(shards, sh)
		}
	}
	if len(shards) == 0 {
		return 0
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(shards))
	for i, sh := range shards {
		cmds[i] = pipe.Get(ctx, shardKeys(sh)[5])
	}
	_, _ = pipe.Exec(ctx)
	seen := time.Since(s.epoch)
	s.recordsMu.Lock()
	defer s.recordsMu.Unlock()
	var stale uint64
	failed := false
	for i, sh := range shards {
		v, err := cmds[i].Result()
		r := &s.records[sh]
		switch {
		case errors.Is(err, redis.Nil):
			stale |= 1 << sh
			*r = sweepRecord{}
		case err != nil:
			failed = true
			continue
		case r.value == "":
			stale |= 1 << sh
			*r = sweepRecord{value: v, since: seen}
		case v != r.value:
			*r = sweepRecord{value: v, since: seen}
		}
		if seen-r.since > s.staleSweep() {
			stale |= 1 << sh
		}
	}
	if failed {
		// Silent otherwise: the sweeps that follow fail too, and count,
		// only while Redis is down, not when just the looks fail.
		s.m.errors.WithLabelValues(opLook).Inc()
	}
	return stale
}

// opLook labels errors_total for a failed look at the sweep records.
const opLook = "look"

// ownedSweepMax is how long an owned shard goes unswept at most with
// nothing due: what its last sweep could not see (a claim written since by
// a node that died before its own sweep, a data loss whose beat reply was
// lost) waits no longer.
func (s *Store) ownedSweepMax() time.Duration { return min(s.cfg.NodeTTL/6, time.Second) }

// sweepCall is the sweep script's call for shard sh.
func (s *Store) sweepCall(sh int) call {
	// Recovering from a loss lasts until the hold-off after this node wrote
	// its connections back: a sweep of an emptied shard that comes only
	// after that finds no sweep record and this node in NODES, as in a
	// fresh Redis, and must still mark it emptied for the others' sake.
	recovering := boolArg(!s.healthy.Load() || s.lostData.Load() || s.awaitingResync.Load())
	return call{keys: shardKeys(sh), args: []any{s.ttlMS(), s.graceMS(), s.cfg.NodeTTL.Milliseconds(),
		s.cfg.HoldOff.Milliseconds(), 500, (s.cfg.NodeTTL * 2 / 3).Milliseconds(),
		s.cfg.Node, recovering}}
}

// sweepAtGraceEnd sweeps shard sh once more when the grace that a
// disconnect (its script's reply v) started is over, so that its offline is
// published on time rather than at the shard's next regular sweep (up to
// ownedSweepMax on). With no grace the grace ends at once, and so does this
// wait. A disconnect that started none (the user has another connection)
// has nothing to publish then. Any node may sweep any shard: the script's
// claims make a second sweep harmless.
func (s *Store) sweepAtGraceEnd(sh int, v any) {
	if r, ok := v.([]any); !ok || len(r) < 2 || toInt(r[1]) == 0 {
		return
	}
	s.sweepAfter(sh, max(s.cfg.Grace, 0))
}

// sweepAfter sweeps shard sh once, d from now (a few ms past it: the
// deadline runs on Redis's clock).
func (s *Store) sweepAfter(sh int, d time.Duration) {
	time.AfterFunc(max(d, 0)+5*time.Millisecond, func() {
		if s.closed.Load() {
			return
		}
		s.graceSweeps.Add(1)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := s.sweepShards(ctx, []int{sh}, time.Now()); err != nil {
			_ = s.failed(store.OpSweep, fmt.Errorf("redisstore: sweep at a deadline: %w", err))
		}
	})
}

// sweepShards sweeps shards and publishes what they claimed, even when
// some fail; dead: a sweep found a dead node (and took this node's new
// share of its shard).
func (s *Store) sweepShards(ctx context.Context, shards []int, start time.Time) (dead bool, err error) {
	seen := time.Since(s.epoch)
	calls := make([]call, len(shards))
	for i, sh := range shards {
		calls[i] = s.sweepCall(sh)
	}
	replies, errs := s.evalMany(ctx, s.sc.sweep, calls)
	newlyEmptied := false
	crashed := false
	defer func() {
		if crashed {
			s.tellNodeDead(ctx)
		}
	}()
	for i, v := range replies {
		sh := shards[i]
		if errs[i] != nil {
			s.noteLostReply(errs[i])
			err = cmp.Or(err, errs[i])
			continue
		}
		r, _ := v.([]any)
		if len(r) != 8 {
			err = cmp.Or(err, fmt.Errorf("sweep reply %v", v))
			continue
		}
		s.lastSwept[sh].Store(start.UnixNano())
		s.sweptShard(sh, toString(r[7]), seen)
		if d := toInt(r[5]); d >= 0 {
			s.sweepDue[sh].Store(start.Add(time.Duration(d) * time.Millisecond).UnixNano())
		} else {
			s.sweepDue[sh].Store(math.MaxInt64) // nothing waits: ownedSweepMax
		}
		if toInt(r[2]) > 0 {
			dead = true
			s.share(sh, toInt(r[3]), toInt(r[4]))
		}
		for _, c := range asStrings(r[6]) {
			crashed = s.crashes.first(c, start) || crashed
		}
		bit := uint64(1) << sh
		if toInt(r[0]) == 1 {
			if s.emptied.Or(bit)&bit == 0 {
				newlyEmptied = true
			}
		} else {
			s.emptied.And(^bit)
		}
		if aerr := s.apply(ctx, store.OpSweep, r[1], start); aerr != nil {
			err = cmp.Or(err, aerr)
		}
	}
	// A shard marked emptied that this node's beats have not found so:
	// the beat whose reply said so was lost (a timeout after the script
	// ran), or this process started after the loss. Recover all the same.
	if newlyEmptied && !s.lostData.Load() && !s.awaitingResync.Load() {
		s.log.Warn("redis lost a shard's data: re-asserting live connections")
		s.noteLoss()
		s.healthy.Store(false)
	}
	return dead, err
}

// forgetBatch bounds the users one shard forgets in one script.
const forgetBatch = 100

// forgetPace is how often a node forgets its shards at most. Each pass costs
// Redis a script call per owned shard, found nothing in nearly all of them
// once a second (a sixth of two idle nodes' calls), and a user forgotten
// after 30 days loses nothing by waiting 10 s more.
const forgetPace = 10 * time.Second

// forget drops the presence state of users offline for ForgetAfter: one
// script per shard (forget.lua), pipelined, each taking at most forgetBatch
// users from the shard's offline set, by Redis's clock. It is paced to once
// every forgetPace (ForgetAfter/4 when shorter), since forgetting is seldom
// due and never urgent; a full batch brings the next pass forward to the
// next sweep.
func (s *Store) forget(ctx context.Context) error {
	if s.cfg.ForgetAfter <= 0 {
		return nil
	}
	now, next := time.Now().UnixNano(), s.forgetNext.Load()
	if now < next || !s.forgetNext.CompareAndSwap(next, now+int64(min(forgetPace, s.cfg.ForgetAfter/4))) {
		return nil // not yet, or another sweep is at it
	}
	// Each shard is forgotten by its owner alone (see Sweep): forgetting is
	// never urgent, so a shard between owners for a beat can wait.
	owned := s.owned.Load()
	calls := make([]call, 0, numShards)
	for sh := range numShards {
		if owned&(1<<sh) != 0 {
			calls = append(calls, call{keys: shardKeys(sh), args: []any{s.cfg.ForgetAfter.Milliseconds(), forgetBatch}})
		}
	}
	replies, errs := s.evalMany(ctx, s.sc.forget, calls)
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("forget: %w", err)
		}
		if toInt(replies[i]) >= forgetBatch {
			s.forgetNext.Store(0) // more may be due in that shard
		}
	}
	return nil
}

// deadMsg, on the membership channel, tells every node to resync: a node
// was found dead, or a node lost a write's reply (tellLostReply). It names
// the node that tells (n), which resyncs its own viewers itself.
type deadMsg struct {
	Kind string `json:"k"` // "dead"
	Node string `json:"n,omitempty"`
}

// deadPayload is this node's deadMsg.
func (s *Store) deadPayload() []byte {
	b, _ := json.Marshal(deadMsg{Kind: "dead", Node: s.cfg.Node})
	return b
}

// tellNodeDead has every live node resync its viewers, this one too: a node
// killed between a script and its publish took the change with it (chaos
// seed 466426994, cluster: a disconnect committed as the node was killed
// left its user online at every viewer), and nothing else would send it
// before the user's next change. Told by the sweeps that find a crashed
// node (once per sweep that finds one; a node that left cleanly published
// all it wrote), and by a process's first beat when its id was still
// beating (a restart quicker than the node ttl). The resyncs it asks for are coalesced, and
// send only what differs.
func (s *Store) tellNodeDead(ctx context.Context) {
	s.m.crashesTold.Inc()
	s.needResync.Store(true)
	s.publish(ctx, []pubMsg{{membershipChannel, s.deadPayload()}})
}

// crashes is the crashed nodes this node told of lately, each as "node
// beat" (its last beat in one shard: a node that dies again after a
// restart is a new crash): a shard whose dead node had more connections
// than one sweep releases finds it again at the next sweeps.
type crashes struct {
	mu   sync.Mutex
	seen map[string]time.Time
}

// crashMemory is how long a crash told of is remembered: well past the
// sweeps that release its connections.
const crashMemory = time.Minute

// first reports whether crash was not told of lately, and notes it.
func (c *crashes) first(crash string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen[crash]; ok {
		return false
	}
	if c.seen == nil {
		c.seen = make(map[string]time.Time)
	}
	for k, at := range c.seen {
		if now.Sub(at) > crashMemory {
			delete(c.seen, k)
		}
	}
	c.seen[crash] = now
	return true
}
