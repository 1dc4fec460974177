package redisstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
)

var (
	_ store.Counter        = (*Store)(nil)
	_ store.TeamsBatcher   = (*Store)(nil)
	_ store.MembersBatcher = (*Store)(nil)
	_ store.StateReader    = (*Store)(nil)
)

// flushLoop writes batched heartbeats.
func (s *Store) flushLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.HeartbeatFlush)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s.writeHeartbeats(ctx, heartbeatBatchFull, s.heartbeatHold())
		s.retryPublish(ctx)
		s.retryEnds(ctx)
		cancel()
	}
}

// heartbeatBatchFull is the batch a shard's heartbeats are written at
// without waiting longer: a script call's fixed cost is most of a small
// batch's (BenchmarkHeartbeatBatch: 2.3-2.9 µs of Redis CPU per id in
// batches of 25, 1.1-1.3 in batches of 100).
const heartbeatBatchFull = 100

// heartbeatHold is how long a shard's heartbeats wait at most for a full
// batch: an idle crowd's few heartbeats per shard and flush cost Redis a
// script call each for a handful of ids. Waiting is safe: a deadline in
// Redis only backs the node's own expiry, which no batch delays (an expiry
// writes its shard's batch first: Disconnect), with a safety net a ttl past
// it (docs/design.md), whose margin the hold spends no more than a tenth
// of the ttl of.
func (s *Store) heartbeatHold() time.Duration {
	return min(4*s.cfg.HeartbeatFlush, s.cfg.TTL/10)
}

// flushHeartbeats writes every heartbeat waiting (Close, and tests that
// stand in for the flush loop).
func (s *Store) flushHeartbeats(ctx context.Context) { s.writeHeartbeats(ctx, 0, 0) }

// writeHeartbeats writes the shards' batches that are due (beatBatches.take).
func (s *Store) writeHeartbeats(ctx context.Context, full int, hold time.Duration) {
	if pending, some := s.beats.take(time.Now(), full, hold); some {
		s.writeBatches(ctx, &pending)
	}
}

// writeBatches writes each shard's batch as one script call, in one
// pipeline, and re-asserts connections Redis no longer knows.
func (s *Store) writeBatches(ctx context.Context, pending *[numShards][]string) {
	calls := make([]call, 0, numShards)
	ttl := any(s.ttlMS()) // boxed once, not per shard
	for sh, ids := range pending {
		if len(ids) == 0 {
			continue
		}
		ids = dropRepeats(ids)
		// The ids go as pointers into the batch, which go-redis writes as
		// the strings: boxing each string would allocate once per heartbeat.
		args := make([]any, 0, len(ids)+1)
		args = append(args, ttl)
		for k := range ids {
			args = append(args, &ids[k])
		}
		// The deadlines are all a heartbeat touches: only they are passed
		// (KEYS[1]), which spares Redis nine keys per call on its hottest path.
		calls = append(calls, call{keys: shardKeys(sh)[:1], args: args})
		s.m.pipelineSize.Observe(float64(len(ids)))
	}
	start := time.Now()
	replies, errs := s.evalMany(ctx, s.sc.heartbeat, calls)
	s.m.scriptLatency.WithLabelValues(store.OpHeartbeat).Observe(time.Since(start).Seconds())
	var missing []string
	for i, err := range errs {
		if err != nil {
			s.m.errors.WithLabelValues(store.OpHeartbeat).Inc()
			// An outage: the health check re-asserts everything once Redis
			// answers again. A timeout is only lateness: the next batch
			// carries these connections' next heartbeats.
			if lostContact(err) {
				s.healthy.Store(false)
			}
			continue
		}
		missing = append(missing, asStrings(replies[i])...)
	}
	// While Redis is unhealthy the recovery re-asserts every connection:
	// doing it here too would double the heaviest load just as Redis
	// struggles (after a node was taken for dead, every id comes back).
	if len(missing) > 0 && s.healthy.Load() {
		s.reassert(ctx, missing)
	}
}

// dropRepeats drops repeated ids of a heartbeat batch in place, sorting
// them (the script does not care for their order), so that no set is
// allocated per batch.
func dropRepeats(ids []string) []string {
	if len(ids) < 2 {
		return ids
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// dedupe drops repeated ids in place, keeping the order of their first
// sight (restateStatuses drops the oldest when it must).
func dedupe(ids []string) []string {
	if len(ids) < 2 {
		return ids
	}
	seen := make(map[string]struct{}, len(ids))
	out := ids[:0]
	for _, id := range ids {
		if _, ok := seen[id]; !ok {
			seen[id] = struct{}{}
			out = append(out, id)
		}
	}
	return out
}

// reassert writes live connections Redis lost back into it, in one
// pipeline: a node taken for dead finds all its ids missing at once, and
// one round trip each stalled its flush loop for seconds.
func (s *Store) reassert(ctx context.Context, ids []string) {
	s.mu.Lock()
	all := make([]assertion, 0, len(ids))
	for _, id := range ids {
		if lc, ok := s.conns[id]; ok {
			all = append(all, assertion{id, *lc})
		}
	}
	s.mu.Unlock()
	if err := s.reassertAll(ctx, all); err != nil {
		s.log.Warn("re-assert connections", "n", len(all), "err", err)
	}
}

// assertion is a live connection to write back into Redis.
type assertion struct {
	id string
	c  localConn
}

// reassertAll writes conns back into Redis and ends again those closed
// meanwhile. It returns the first error that is not the script's answer
// (Redis not reached), after applying every reply that came.
func (s *Store) reassertAll(ctx context.Context, all []assertion) error {
	if len(all) == 0 {
		return nil
	}
	calls := make([]call, len(all))
	for i, e := range all {
		keys, args := s.connectCall(presence.Conn{ID: e.id, UserID: e.c.user, Device: e.c.device, Node: e.c.node}, e.c, true)
		calls[i] = call{keys: keys, args: args}
	}
	start := time.Now()
	replies, errs := s.evalMany(ctx, s.sc.connect, calls)
	var firstErr error
	done := 0
	for i, v := range replies {
		if errs[i] != nil {
			s.noteLostReply(errs[i])
			_ = s.failed(store.OpConnect, errs[i])
			if firstErr == nil && !isRedisReply(errs[i]) {
				firstErr = errs[i]
			}
			continue
		}
		_ = s.apply(ctx, store.OpConnect, v, start)
		done++
	}
	s.m.reassertions.Add(float64(done))
	// A connection closed while being re-asserted may have been ended in
	// Redis before the re-assertion wrote it back: end it again. Its local
	// entry went before its script ran, so checking now catches every one.
	var gone []assertion
	s.mu.Lock()
	for _, e := range all {
		if _, live := s.conns[e.id]; !live {
			gone = append(gone, e)
		}
	}
	s.mu.Unlock()
	for _, e := range gone {
		s.endInRedis(ctx, e.id, e.c.user, e.c.node)
	}
	return firstErr
}

// countPresent refreshes the number of users not offline, over all shards.
func (s *Store) countPresent(ctx context.Context) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, numShards)
	for sh := range cmds {
		cmds[sh] = pipe.Get(ctx, prefix(sh)+"present")
	}
	_, _ = pipe.Exec(ctx)
	var n int64
	for _, c := range cmds {
		v, err := c.Int64()
		if err != nil && err != redis.Nil {
			return
		}
		n += v
	}
	s.present.Store(n)
}

// Counts reports this node's live connections and the users not offline
// across the deployment (refreshed every NodeTTL/3).
func (s *Store) Counts() (conns, present int) {
	s.mu.Lock()
	conns = len(s.conns)
	s.mu.Unlock()
	return conns, int(s.present.Load())
}

// beatLoop keeps this node's liveness fresh in every shard.
func (s *Store) beatLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.NodeTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		// A beat that lands within 2/3 of the node ttl still keeps this
		// node alive (the previous one landed at most a third ago): a slow
		// link to Redis must not make it dead.
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.NodeTTL*2/3)
		s.beat(ctx, false)
		cancel()
		ctx, cancel = context.WithTimeout(context.Background(), s.cfg.NodeTTL/3)
		s.countPresent(ctx)
		cancel()
	}
}

func (s *Store) beat(ctx context.Context, leaving bool) {
	beaten := s.beaten.Load()
	calls := make([]call, numShards)
	for sh := range calls {
		calls[sh] = call{keys: shardKeys(sh), args: []any{s.cfg.Node, boolArg(leaving), boolArg(beaten),
			s.cfg.HoldOff.Milliseconds(), s.cfg.NodeTTL.Milliseconds(), boolArg(!leaving && s.restoring())}}
	}
	all, errs := s.evalMany(ctx, s.sc.beat, calls)
	var replies []any
	var err error
	crashed := false // an earlier process under this id beat, and did not leave
	for sh, e := range errs {
		if e != nil {
			err = cmp.Or(err, e)
			continue // its share stays as it was; stale shards are found by Sweep
		}
		r, _ := all[sh].([]any)
		if len(r) != 4 {
			err = cmp.Or(err, fmt.Errorf("beat reply %v", all[sh]))
			continue
		}
		replies = append(replies, r[0])
		crashed = crashed || toInt(r[3]) == 1
		s.share(sh, toInt(r[1]), toInt(r[2]))
	}
	if err != nil {
		s.m.errors.WithLabelValues("beat").Inc()
		if lostContact(err) {
			s.healthy.Store(false)
		}
	}
	// The shards that answered count even when others failed (a Redis
	// restarted empty may answer some before it loads the scripts): the
	// next beat finds this node there, so a missing one is now or never.
	missing := false
	for _, v := range replies {
		missing = missing || toInt(v) == 1
	}
	// This process's first beat found its id beating: an earlier process
	// under it was killed less than a node ttl ago, and the sweeps will not
	// find it dead. What it wrote and did not publish is told by a resync.
	// (One that stopped cleanly left a 0, and published all it wrote.)
	if !beaten && !leaving && crashed {
		s.tellNodeDead(ctx)
	}
	// The first beat that lands is this process's first: missing there is
	// a fresh start (or its entry is still there, after a restart under the
	// same id), and every later one counts.
	if len(replies) > 0 {
		s.beaten.Store(true)
	}
	// This node vanished from a shard although it beat before: Redis lost
	// its data, or the node stalled and was taken for dead. Recover now.
	if missing && beaten && !leaving {
		s.log.Warn("redis no longer knew this node: re-asserting live connections")
		s.noteLoss()
		s.healthy.Store(false)
	}
}

// noteLoss marks that this node found a data loss (lostData), when, and
// whether it held connections then.
func (s *Store) noteLoss() {
	s.mu.Lock()
	held := len(s.conns) > 0
	s.mu.Unlock()
	if !s.lostData.Swap(true) {
		s.lossAt.Store(time.Now().UnixNano())
		s.lossHeld.Store(held)
	}
}

// restoring says whether this node's beats hold a loss's hold-off open
// (beat.lua): it found a loss and has not written its connections back,
// for at most maxRestoringHoldOffs hold-offs, so that a node that cannot
// write them back (cut off from one master, able to beat into another)
// does not keep every read of the cluster refused. A node that held none
// has nothing to write back: a process started during a hold-off finds the
// loss too, and held it open a hold-off longer (chaos seed 409074510).
func (s *Store) restoring() bool {
	return s.lostData.Load() && s.lossHeld.Load() && time.Since(time.Unix(0, s.lossAt.Load())) < maxRestoringHoldOffs*s.cfg.HoldOff
}

const maxRestoringHoldOffs = 6

// A failed re-assertion is tried again after a backoff that doubles from
// minRecoverBackoff to maxRecoverBackoff. Everything this node wrote during
// the outage (statuses set, connections ended) lands only with it: a cluster
// answers CLUSTERDOWN for seconds after a master is back, and a backoff that
// had grown to 15 s meanwhile delayed a status by 8 s after Redis was whole
// again (chaos, cluster). An attempt that fails partway writes this node's
// connections again on the masters that answer: at most every 2 s, about
// what a heartbeat round costs.
const (
	minRecoverBackoff = 500 * time.Millisecond
	maxRecoverBackoff = 2 * time.Second
)

// healthLoop watches Redis. When it answers again after failing, every live
// connection of this node is re-asserted and the ones that ended meanwhile
// are ended in Redis too, before this node reports ready again.
func (s *Store) healthLoop() {
	defer s.wg.Done()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	var notBefore time.Time // a failed recovery backs off, briefly
	backoff := minRecoverBackoff
	var resyncAt time.Time // a resync waits until then (zero: none waits)
	var toldLost time.Time // the last tellLostReply
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if time.Now().Before(notBefore) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := s.rdb.Ping(ctx).Err()
		recovered := false // recovery resynced this node's viewers just now
		switch {
		case err != nil:
			if s.healthy.Swap(false) {
				s.log.Warn("redis unreachable: keeping connections, publishing nothing", "err", err)
			}
			s.m.up.Set(0)
			s.reloadSlots()
		case !s.healthy.Load():
			s.reloadSlots()
			s.log.Info("redis is back: re-asserting live connections")
			rctx, rcancel := context.WithTimeout(context.Background(), 15*time.Second)
			err := s.recover(rctx)
			rcancel()
			if err != nil {
				s.log.Warn("re-assertion failed; trying again later", "err", err, "in", backoff)
				notBefore = time.Now().Add(backoff)
				backoff = min(2*backoff, maxRecoverBackoff)
			} else {
				s.healthy.Store(true)
				s.m.up.Set(1)
				backoff = minRecoverBackoff
				if s.lostData.Swap(false) {
					// Redis lost its data (or took this node for dead): the
					// other nodes write theirs back within the hold-off. A
					// resync before then reads their users as gone and
					// tells viewers so; it waits, and so do the resyncs
					// asked for meanwhile.
					resyncAt = time.Now().Add(s.cfg.HoldOff)
					s.awaitingResync.Store(true)
				} else {
					s.resync()
				}
				recovered = true
			}
		case !resyncAt.IsZero():
			s.m.up.Set(1)
			if !time.Now().Before(resyncAt) {
				resyncAt = time.Time{}
				s.needResync.Store(false)
				s.resync()
				s.awaitingResync.Store(false)
			}
		default:
			s.m.up.Set(1)
			if s.subsUnsure.Load() {
				// What the unconfirmed subscriptions carried may be lost.
				if s.syncSubs(ctx) == nil {
					s.resyncUnlessLost(ctx)
				}
				break
			}
			if s.needResync.Swap(false) {
				s.resyncUnlessLost(ctx)
			}
		}
		cancel()
		if err == nil && s.mayTellLostReply(&toldLost) && !recovered {
			s.needResync.Store(true) // this node's own viewers too
		}
	}
}

// resyncUnlessLost resyncs unless a beat finds that Redis lost this node:
// go-redis subscribes again by itself after an outage shorter than a
// health check's tick, which this loop never saw fail, and the resync
// that asks for would read an emptied Redis before anyone wrote back
// (a recovery follows instead, whose resync waits out the hold-off:
// TestOutageEndsInOneResync, two busy loops beside it, resynced twice).
func (s *Store) resyncUnlessLost(ctx context.Context) {
	s.beat(ctx, false)
	if s.healthy.Load() {
		s.resync()
	}
}

// reloadSlots has a cluster client read again which master serves which
// slot (in the background). go-redis learns of a failover from a MOVED
// reply or its reload every minute; a master that died answers nothing, so
// this node kept dialing it while its replica served the slots (and
// MaxRetries -1 never lets go-redis try another node that would redirect).
func (s *Store) reloadSlots() {
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		cc.ReloadState(context.Background())
	}
}

// recover re-asserts every local connection and reconciles each shard.
func (s *Store) recover(ctx context.Context) error {
	since, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return err
	}
	s.beat(ctx, false)
	s.mu.Lock()
	all := make([]assertion, 0, len(s.conns))
	for id, lc := range s.conns {
		all = append(all, assertion{id, *lc})
	}
	s.mu.Unlock()
	if err := s.reassertAll(ctx, all); err != nil {
		return err
	}
	// Live ids as they are now: connections made while re-asserting stay.
	s.mu.Lock()
	byShard := make(map[int][]any)
	for id, lc := range s.conns {
		sh := shardOf(lc.user)
		byShard[sh] = append(byShard[sh], id)
	}
	s.mu.Unlock()
	replies, err := s.evalShards(ctx, s.sc.reconcile, func(sh int) call {
		return s.reconcileCall(sh, since, byShard[sh]...)
	})
	for _, v := range replies {
		_ = s.apply(ctx, store.OpDisconnect, v, time.Now())
	}
	if err != nil {
		s.noteLostReply(err)
		return err
	}
	// The subscriptions go-redis re-establishes after an outage ask for a
	// resync too: wait until they are in place, so that this one resync
	// covers them. Not for long: the node is not ready meanwhile, and what
	// it claimed or ended during the outage waits with it (chaos, cluster:
	// a probe unconfirmed for the recovery's whole 15 s held a viewer's
	// offlines until then). The health check probes again until they are
	// in place, and resyncs then.
	if err := s.syncSubs(ctx); err != nil {
		s.log.Warn("subscriptions not confirmed after an outage; probing again", "err", err)
	}
	return nil // the health check resyncs the viewers
}

// subsSyncTimeout bounds one confirmation of the subscriptions: a round
// trip per connection when they are in place.
const subsSyncTimeout = 2 * time.Second

// syncSubs confirms the subscriptions (subscriber.sync) within
// subsSyncTimeout; until one succeeds, subsUnsure says so.
func (s *Store) syncSubs(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, subsSyncTimeout)
	defer cancel()
	if err := s.subs.sync(ctx); err != nil {
		s.subsUnsure.Store(true)
		return err
	}
	s.subsUnsure.Store(false)
	s.needResync.Store(false)
	return nil
}

// reconcileCall is the reconcile script's call for shard sh: this node's
// connections there not in live and not heard from since since end.
func (s *Store) reconcileCall(sh int, since time.Time, live ...any) call {
	keys := shardKeys(sh)
	return call{keys: append(keys[:len(keys):len(keys)], ncKey(sh, s.cfg.Node)),
		args: append([]any{s.cfg.Node, s.ttlMS(), s.graceMS(), since.UnixMilli()}, live...)}
}

// resync asks the handler to catch its viewers up. The floor of each shard
// is raised first, on the shard's own clock, so that what the handler
// reads afterwards is at or below it and every later change above it. If a
// shard cannot be reached, the resync is asked for again.
func (s *Store) resync() {
	r, ok := s.handlerOf().(store.Resyncer)
	if !ok {
		return
	}
	// Its own deadline: the health check's may be spent by a recovery.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	calls := make([]call, numShards)
	for sh := range calls {
		calls[sh] = call{keys: shardKeys(sh)}
	}
	replies, errs := s.evalMany(ctx, s.sc.floor, calls)
	floors := make([]uint64, numShards)
	for sh, err := range errs {
		if err != nil {
			s.m.errors.WithLabelValues("resync").Inc()
			s.needResync.Store(true)
			return
		}
		floors[sh], _ = strconv.ParseUint(toString(replies[sh]), 10, 64)
	}
	r.OnResync(func(user string) uint64 { return floors[shardOf(user)] })
}

func asStrings(v any) []string {
	arr, _ := v.([]any)
	out := make([]string, 0, len(arr))
	for _, x := range arr {
		out = append(out, toString(x))
	}
	return out
}
