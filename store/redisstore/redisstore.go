// Package redisstore is the shared store for many greendot nodes: Redis or
// Redis Cluster is the one source of truth.
//
// Every transition (connect, status, disconnect, a shard's sweep) is one Lua
// script on one cluster slot: a user's keys carry the hash tag of one of
// numShards shards, together with that shard's deadline and grace sorted sets
// and its copy of the node liveness set. Two nodes therefore never both
// publish one change, and an expired entry is claimed by exactly one sweeper.
// Heartbeats are batched per shard. Deadlines use Redis's clock. Changes are
// published on sharded Pub/Sub, one channel per team, and a node subscribes
// only to the teams of its own users. See docs/operations.md.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
)

// numShards is how many hash tags presence is spread over; it must be the
// same on every node of a deployment.
const numShards = 32

// A shard fits localConn's uint8: the build fails if numShards outgrows it.
const _ = uint8(numShards - 1)

// Errors, as store's sentinels.
var (
	ErrUnknownConn   = store.ErrUnknownConn
	ErrDuplicateConn = store.ErrDuplicateConn
	ErrUnavailable   = store.ErrUnavailable
	ErrRecovering    = store.ErrRecovering
)

// Config configures a Store.
type Config struct {
	URL   string        // redis://[user:pass@]host:port[/db]; any node of a cluster
	Node  string        // this node's id; required
	TTL   time.Duration // 25s
	Grace time.Duration // 0: none
	// NodeTTL: a node not heard from for this long is dead and its
	// connections are released. 3s.
	NodeTTL time.Duration
	// HoldOff: after a gap in sweeping (Redis away, restarted or emptied),
	// nothing is expired for this long, so live nodes re-assert first.
	// NodeTTL + 2s.
	HoldOff time.Duration
	// ForgetAfter: a user offline this long loses their presence state (u:,
	// sv:), answered as never seen; team membership (ut:) is kept. 0: never;
	// else at least Grace.
	ForgetAfter time.Duration
	// HeartbeatFlush is how often batched heartbeats are looked at: a
	// shard's batch is written once it holds heartbeatBatchFull ids, or
	// when its oldest waited 4 × HeartbeatFlush (at most TTL/10). 500ms, or
	// TTL/8 when that is shorter.
	HeartbeatFlush time.Duration
	// WebhookQueue, when above 0, turns webhooks on: every published change
	// is also queued in its shard's stream (at most WebhookQueue/numShards
	// entries each, rounded up) for Webhooks' Sender. Every node of a
	// deployment must agree on it.
	WebhookQueue int
	// WebhookGroups are the consumer groups that read the queue, one per
	// webhook format (WebhookGroup, PusherWebhookGroup); nil: WebhookGroup
	// alone. Every node of a deployment must agree on them.
	WebhookGroups []string
	// Broadcasts subscribes this node to app messages (store.Broadcaster:
	// Pusher channel events), on a Redis connection of their own; off, the
	// OnBroadcast handler is never called, though Broadcast still sends.
	Broadcasts bool
	// WebhookClaimIdle: the events a node read and has not renewed for this
	// long (it died) are claimed by another node. 3 × NodeTTL.
	WebhookClaimIdle time.Duration
	// ChannelCountsTTL: a node's channel counts not set again for this
	// long are no longer counted (store.ChannelCounter). Every node of a
	// deployment should agree on it. store.ChannelCountsTTL (15s).
	ChannelCountsTTL time.Duration
	Logger           *slog.Logger

	// clusterSlots, when set (tests), gives the cluster client its slot
	// map in place of CLUSTER SLOTS.
	clusterSlots func(context.Context) ([]redis.ClusterSlot, error)
}

type localConn struct {
	user, device, node string
	active             bool
	shard              uint8 // shardOf(user), kept: every heartbeat needs it
	// heard is this node's clockMS at the connection's last sign of life
	// (its connect, a Heartbeat, a SetStatus): a connection that drops or
	// expires is last seen then, not at its last heartbeat batch, which
	// waits up to heartbeatHold. (32 bits fit the padding: the entry stays
	// 64 B.)
	heard uint32
	// statusSeq counts SetStatus calls: Redis keeps the active flag of the
	// highest one it saw, so a re-assertion that read active before a
	// status change and reached Redis after it cannot undo it.
	statusSeq uint64
}

// Store is the Redis store.
type Store struct {
	cfg     Config
	rdb     redis.UniversalClient
	cluster bool
	sc      scripts
	log     *slog.Logger
	m       *storeMetrics

	// obs: set by SetObserver, read by every write, the store's own loops'
	// among them (write-backs, retried ends), which run from New on.
	obs atomic.Pointer[store.Observer]
	// handler: set by Subscribe, read by the subscriber and the health
	// loop, which run from New on (a message can come before Subscribe).
	handler atomic.Pointer[store.Handler]

	mu    sync.Mutex
	conns map[string]*localConn // this node's live connections

	beats       beatBatches         // heartbeats, written in batches by flushLoop
	ends        backlog[pendingEnd] // ends to make again, by flushLoop
	unpublished backlog[pubMsg]     // changes whose publish failed, retried by flushLoop
	// statusesLost: users whose status write lost its reply; their status
	// is sent again with the resync told of (restateStatuses).
	statusesLost backlog[string]

	subs *subscriber
	wh   map[string]*whQueue // by consumer group; nil: webhooks off
	// occupancyOn: Pusher webhooks are on, and removals keep the teams'
	// occupancy records right (member_team.lua, occupancy.go).
	occupancyOn bool

	healthy atomic.Bool
	beaten  atomic.Bool  // the first beat is done
	crashes crashes      // crashed nodes told of lately (sweep.go)
	present atomic.Int64 // users not offline, all shards
	// needResync: a subscription was re-established; the health check
	// resyncs viewers.
	needResync atomic.Bool
	// replyLost: a write got no reply (a timeout, a connection lost on the
	// way): it may have run in Redis with nobody publishing what it
	// changed. Once Redis answers, the health check has every node resync.
	replyLost atomic.Bool
	// subsUnsure: a recovery could not confirm the subscriptions within
	// subsSyncTimeout; the health check probes them again until it can.
	subsUnsure atomic.Bool
	// lostData: this node found itself missing from Redis (Redis lost its
	// data, or took the node for dead); the resync after recovery waits
	// for the other nodes to write theirs back.
	lostData atomic.Bool
	lossAt   atomic.Int64 // when lostData was last set, unix ns
	// lossHeld: this node held connections when it found the loss, so it
	// has some to write back (see restoring).
	lossHeld atomic.Bool
	// emptied: the shards (bit per shard) whose last sweep found them in a
	// data loss's hold-off; see Intact.
	emptied atomic.Uint64
	// awaitingResync: this node knows Redis lost its data and waits out
	// the hold-off before it resyncs; until then its own view of the
	// membership may be the one from before the loss. See Intact.
	awaitingResync atomic.Bool
	forgetNext     atomic.Int64 // UnixNano before which Sweep does not forget (pacing only)
	// owned: the shards (bit per shard) this node sweeps, shared out among
	// the live nodes by the beats; the others it sweeps only when their
	// sweep record stands still (see Sweep). All until the first beat says.
	owned atomic.Uint64
	// staleChecked: when this node last looked at the others' sweep records
	// (staleShards), on its monotonic clock (since epoch; 0: never);
	// records: what it knows of each, under recordsMu.
	staleChecked atomic.Int64
	recordsMu    sync.Mutex
	records      [numShards]sweepRecord
	lastSwept    [numShards]atomic.Int64 // UnixNano of this node's last sweep of each shard
	sweepDue     [numShards]atomic.Int64 // UnixNano when an owned shard's next claim falls due (sweep.lua)
	onBroadcast  atomic.Pointer[func([]byte)]
	countsSet    atomic.Bool   // this node set channel counts: Close removes them
	stop         chan struct{} // closed by Close; never sent on
	epoch        time.Time     // clockMS counts from it
	wg           sync.WaitGroup
	closed       atomic.Bool
	deferMu      sync.Mutex   // orders deferMembership's wg.Add before Close's Wait
	graceSweeps  atomic.Int64 // sweeps at a grace end (sweepAtGraceEnd) run
	// deferWaiting, when set (tests only), is called as a deferred
	// membership event starts waiting for a whole read.
	deferWaiting func(team, user string)
}

var (
	_ store.Store       = (*Store)(nil)
	_ store.Pinger      = (*Store)(nil)
	_ store.Observable  = (*Store)(nil)
	_ store.Closer      = (*Store)(nil)
	_ store.Watcher     = (*Store)(nil)
	_ store.StatusStore = (*Store)(nil)
)

// New connects to Redis (detecting a cluster from the node given) and
// starts the store's background work: heartbeat batches, node liveness,
// subscriptions and the health check that re-asserts connections after an
// outage. Close stops it.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.URL == "" {
		return nil, errors.New("redisstore: a redis URL is required")
	}
	if cfg.Node == "" || strings.ContainsAny(cfg.Node, "\n\r") {
		return nil, errors.New("redisstore: a node id without line breaks is required")
	}
	if cfg.TTL == 0 {
		cfg.TTL = 25 * time.Second
	}
	if cfg.TTL < 0 || cfg.Grace < 0 {
		return nil, errors.New("redisstore: ttl and grace must not be negative")
	}
	if cfg.ForgetAfter < 0 || (cfg.ForgetAfter > 0 && cfg.ForgetAfter < cfg.Grace) {
		return nil, errors.New("redisstore: forget-after must be 0 (never) or at least the grace")
	}
	if cfg.NodeTTL == 0 {
		cfg.NodeTTL = 3 * time.Second
	}
	if cfg.HoldOff == 0 {
		cfg.HoldOff = cfg.NodeTTL + 2*time.Second
	}
	if cfg.HeartbeatFlush == 0 {
		cfg.HeartbeatFlush = min(500*time.Millisecond, cfg.TTL/8)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ChannelCountsTTL == 0 {
		cfg.ChannelCountsTTL = store.ChannelCountsTTL
	}
	if cfg.ChannelCountsTTL < 0 {
		return nil, errors.New("redisstore: channel-counts ttl must not be negative")
	}
	if cfg.WebhookClaimIdle <= 0 {
		cfg.WebhookClaimIdle = 3 * cfg.NodeTTL
	}
	opts, err := redis.ParseURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	s := &Store{
		cfg:   cfg,
		sc:    loadScripts(whShardMax(cfg.WebhookQueue)),
		log:   cfg.Logger,
		m:     newStoreMetrics(),
		conns: make(map[string]*localConn),
		stop:  make(chan struct{}),
		epoch: time.Now(),
	}
	// A script that timed out may have run: retrying it could apply it twice.
	// Failures surface instead, and re-assertion repairs what they leave.
	opts.MaxRetries = -1
	opts.ContextTimeoutEnabled = true // deadlines hold even when Redis hangs
	probe := redis.NewClient(opts)
	info, err := probe.Info(ctx, "cluster").Result()
	_ = probe.Close()
	if err != nil {
		return nil, fmt.Errorf("redisstore: reach %s: %w", opts.Addr, err)
	}
	if strings.Contains(info, "cluster_enabled:1") {
		s.cluster = true
		s.rdb = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:        []string{opts.Addr},
			Username:     opts.Username,
			Password:     opts.Password,
			TLSConfig:    opts.TLSConfig,
			DialTimeout:  opts.DialTimeout,
			ReadTimeout:  opts.ReadTimeout,
			WriteTimeout: opts.WriteTimeout,
			PoolSize:     opts.PoolSize,
			MaxRetries:   -1,
			ClusterSlots: cfg.clusterSlots,

			ContextTimeoutEnabled: true,
		})
	} else {
		s.rdb = redis.NewClient(opts)
	}
	s.healthy.Store(true)
	s.owned.Store(allShards)
	if cfg.WebhookQueue > 0 {
		groups := cfg.WebhookGroups
		if len(groups) == 0 {
			groups = []string{WebhookGroup}
		}
		s.wh = map[string]*whQueue{}
		all := make([]int, numShards)
		for sh := range all {
			all[sh] = sh
		}
		for _, g := range groups {
			q := newWHQueue(s, g, groups)
			if err := q.makeGroups(ctx, all); err != nil {
				_ = s.rdb.Close()
				return nil, fmt.Errorf("redisstore: webhook queue: %w", err)
			}
			s.wh[g] = q
		}
		s.occupancyOn = s.wh[PusherWebhookGroup] != nil
	}
	s.subs = newSubscriber(s)
	if err := s.subs.start(ctx); err != nil {
		_ = s.rdb.Close()
		return nil, err
	}
	// A previous process with this node id may have left connections: this
	// one has none yet, so end them all.
	since, err := s.rdb.Time(ctx).Result()
	if err != nil {
		s.subs.close()
		_ = s.rdb.Close()
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	replies, err := s.evalShards(ctx, s.sc.reconcile, func(sh int) call {
		return s.reconcileCall(sh, since)
	})
	if err != nil {
		s.subs.close()
		_ = s.rdb.Close()
		return nil, fmt.Errorf("redisstore: reconcile at start: %w", err)
	}
	for _, v := range replies {
		_ = s.apply(ctx, store.OpDisconnect, v, time.Now())
	}
	s.beat(ctx, false)
	// A first sweep records every shard as swept (LS): a fresh Redis would
	// otherwise read as emptied, and snapshots be refused (WholeStates),
	// until the server's first sweep.
	if err := s.Sweep(ctx); err != nil {
		s.subs.close()
		_ = s.rdb.Close()
		return nil, err
	}
	s.wg.Add(3)
	go s.flushLoop()
	go s.beatLoop()
	go s.healthLoop()
	return s, nil
}

// Intact implements store.LossGuard: ErrRecovering while a shard is in the
// hold-off after Redis lost its data (a restart without it, FLUSHALL, a
// failover to an empty replica). Until every live node has written its
// connections back, a read would take their users for offline; the hold-off
// bounds that. Known from the sweeps, so it costs no round trip; a loss is
// seen from the first sweep after it (a tenth of a second).
//
// It holds until this node's own resync after the loss, too: the hold-off
// it waits out starts when it recovered, which may be after the sweep that
// marked the shards, and meanwhile what it holds of the membership (the
// server's team index) may be the one from before the loss.
func (s *Store) Intact() error {
	if s.emptied.Load() != 0 || s.awaitingResync.Load() {
		return ErrRecovering
	}
	return nil
}

// Cluster reports whether the store talks to a Redis Cluster.
func (s *Store) Cluster() bool { return s.cluster }

// Subscribe implements store.Store.
func (s *Store) Subscribe(h store.Handler) { s.handler.Store(&h) }

// handlerOf is what Subscribe set, or nil.
func (s *Store) handlerOf() store.Handler {
	if h := s.handler.Load(); h != nil {
		return *h
	}
	return nil
}

// SetObserver implements store.Observable.
func (s *Store) SetObserver(o store.Observer) {
	if o == nil {
		s.obs.Store(nil)
		return
	}
	s.obs.Store(&o)
}

// Ping implements store.Pinger: not ready while Redis is unreachable, nor
// until this node's connections are re-asserted after an outage.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return errors.Join(ErrUnavailable, err)
	}
	if !s.healthy.Load() {
		return errors.Join(ErrUnavailable, errors.New("re-asserting connections after an outage"))
	}
	return nil
}

// Close stops the background work, marks this node as gone so its
// remaining connections are released at once, and closes the clients.
func (s *Store) Close() error {
	s.deferMu.Lock()
	wasClosed := s.closed.Swap(true)
	s.deferMu.Unlock()
	if wasClosed {
		return nil
	}
	close(s.stop)
	s.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if s.replyLost.Load() {
		// Not told yet (the health check spaces its tells): a node that
		// stops cleanly leaves nothing unpublished, as far as it can.
		s.tellLostReply(ctx)
	}
	s.flushHeartbeats(ctx)
	s.beat(ctx, true)
	s.releaseChannelCounts(ctx)
	s.subs.close()
	return s.rdb.Close()
}

// shardOf is the user's shard: crc32.ChecksumIEEE of the id, read in place
// (crc32 only reads it) rather than copied to the heap, since a snapshot
// asks it of every team-mate.
func shardOf(user string) int {
	return int(crc32.Update(0, crc32.IEEETable, unsafe.Slice(unsafe.StringData(user), len(user))) % numShards)
}

// prefix is the shard's key prefix, made once: a snapshot builds a key per
// team-mate.
func prefix(shard int) string { return prefixes[shard] }

var prefixes = func() (p [numShards]string) {
	for sh := range p {
		p[sh] = fmt.Sprintf("gd:{gd%d}:", sh)
	}
	return p
}()

func dlKey(shard int) string { return prefix(shard) + "dl" }

func teamKey(team string) string { return "gd:{t:" + team + "}:m" }

func (s *Store) ttlMS() int64   { return s.cfg.TTL.Milliseconds() }
func (s *Store) graceMS() int64 { return s.cfg.Grace.Milliseconds() }

// Connect implements store.Tracker.
func (s *Store) Connect(ctx context.Context, c presence.Conn) error {
	return s.connect(ctx, c, localConn{active: !c.Idle}, false)
}

// connect writes c into Redis with the status in lc (active, statusSeq);
// assert: a re-assertion of a connection this node holds.
func (s *Store) connect(ctx context.Context, c presence.Conn, lc localConn, assert bool) error {
	start := time.Now()
	known := assert
	if !assert {
		// Redis checks ids within the user's shard; ids are random, and this
		// node's own are checked here across shards.
		s.mu.Lock()
		held, dup := s.conns[c.ID]
		if dup && held.user == c.UserID {
			// The server asserting again a connection Redis lost (a status
			// write found it unknown). Its count of status writes goes on:
			// started again at 0, it would lose to the count a re-assertion
			// of this node wrote, and Redis would ignore the next status
			// writes (chaos, seed 621771424).
			lc, known = *held, true
		}
		s.mu.Unlock()
		if dup && !known {
			return ErrDuplicateConn
		}
	}
	if c.Node == "" {
		c.Node = s.cfg.Node
	}
	keys, args := s.connectCall(c, lc, assert)
	v, err := run(ctx, s.rdb, s.sc.connect, keys, args...)
	return s.connected(ctx, c, lc, known, v, err, start)
}

// connectCall is the connect script's keys and arguments.
func (s *Store) connectCall(c presence.Conn, lc localConn, assert bool) ([]string, []any) {
	return userKeys(c.UserID, ncKey(shardOf(c.UserID), c.Node)),
		[]any{c.ID, c.UserID, c.Device, c.Node, s.ttlMS(), boolArg(lc.active), boolArg(assert), lc.statusSeq}
}

// connected takes the connect script's reply v (or its error): it records
// the connection and publishes what the script changed. known: the node
// held the connection before (a re-assertion).
func (s *Store) connected(ctx context.Context, c presence.Conn, lc localConn, known bool, v any, err error, start time.Time) error {
	if err != nil {
		s.noteLostReply(err)
		if !known && !isRedisReply(err) {
			// The script may have run: make sure no ghost stays behind.
			s.endLater(pendingEnd{id: c.ID, user: c.UserID, node: c.Node, cause: presence.Closed, heard: noneHeard})
		}
		return s.failed(store.OpConnect, fmt.Errorf("redisstore: connect: %w", scriptErr(err)))
	}
	s.mu.Lock()
	_, live := s.conns[c.ID]
	if !known {
		s.conns[c.ID] = &localConn{user: c.UserID, device: c.Device, node: c.Node, active: lc.active, shard: uint8(shardOf(c.UserID)), heard: s.clockMS()}
	}
	// A re-asserted connection keeps its entry: a status change may have
	// updated it since lc was read.
	s.mu.Unlock()
	if err := s.apply(ctx, store.OpConnect, v, start); err != nil {
		return err
	}
	if known && !live {
		// Closed while being re-asserted: end it in Redis too.
		s.endInRedis(ctx, c.ID, c.UserID, c.Node)
	}
	return nil
}

// disconnectCall is the disconnect script's call for connection id of user
// on node; known: the node held it (see disconnect.lua).
//
// heard is this node's clockMS at the connection's last sign of life, or
// noneHeard: the script takes the connection as last seen that long ago
// on Redis's clock (a drop or an expiry; a close is seen at once).
func (s *Store) disconnectCall(id, user, node string, cause presence.Cause, known bool, heard int64) call {
	ago := int64(-1)
	if heard != noneHeard {
		ago = int64(s.clockMS() - uint32(heard)) // modulo 2^32: a connection is never silent 49 days
	}
	return call{keys: userKeys(user, ncKey(shardOf(user), node)),
		args: []any{id, int(cause), s.ttlMS(), s.graceMS(), user, node, boolArg(known),
			max(s.cfg.Grace, s.cfg.HoldOff).Milliseconds(), ago}}
}

// noneHeard, for disconnectCall: the node has no sign of life to give, and
// the script takes the connection's last heartbeat batch.
const noneHeard = -1

// clockMS is this node's monotonic clock in ms, modulo 2^32 (localConn.heard).
func (s *Store) clockMS() uint32 { return uint32(time.Since(s.epoch) / time.Millisecond) }

// endInRedis ends a connection this node no longer has.
func (s *Store) endInRedis(ctx context.Context, id, user, node string) {
	c := s.disconnectCall(id, user, node, presence.Closed, true, noneHeard)
	v, err := run(ctx, s.rdb, s.sc.disconnect, c.keys, c.args...)
	switch {
	case err == nil:
		s.sweepAtGraceEnd(shardOf(user), v)
		_ = s.apply(ctx, store.OpDisconnect, v, time.Now())
	case !isRedisReply(err):
		s.noteLostReply(err)
		// Not ended: left to its deadline, the connection would keep its
		// user online up to a ttl.
		s.endLater(pendingEnd{id: id, user: user, node: node, cause: presence.Closed, known: true, heard: noneHeard})
	}
}

// Heartbeat implements store.Tracker: it only queues the id; a shard's
// batch is written once full, or when its oldest waited heartbeatHold.
func (s *Store) Heartbeat(_ context.Context, connID string) error {
	now := s.clockMS()
	s.mu.Lock()
	lc, ok := s.conns[connID]
	if ok {
		lc.heard = now
	}
	s.mu.Unlock()
	if !ok {
		return ErrUnknownConn
	}
	s.beats.add(int(lc.shard), connID)
	return nil
}

// SetStatus implements store.Tracker. A status frame is a sign of life,
// as a heartbeat is (the connection's last_seen if it drops).
func (s *Store) SetStatus(ctx context.Context, connID string, active bool) error {
	start := time.Now()
	now := s.clockMS()
	s.mu.Lock()
	lc, ok := s.conns[connID]
	var seq uint64
	if ok {
		lc.active = active
		lc.statusSeq++
		seq = lc.statusSeq
		lc.heard = now
	}
	s.mu.Unlock()
	if !ok {
		return ErrUnknownConn
	}
	v, err := run(ctx, s.rdb, s.sc.status, userKeys(lc.user), connID, lc.user, boolArg(active), s.ttlMS(), seq)
	if err != nil {
		s.noteLostReply(err)
		err = scriptErr(err)
		if errors.Is(err, ErrUnknownConn) {
			return err
		}
		return s.failed(store.OpStatus, fmt.Errorf("redisstore: status: %w", err))
	}
	return s.apply(ctx, store.OpStatus, v, start)
}

// SetUserStatus implements store.StatusStore: one atomic script in the
// user's shard (user_status.lua). The status is checked here, by this
// node's clock; the expiry is then Redis's to keep (the shard's ST set).
func (s *Store) SetUserStatus(ctx context.Context, user string, st presence.Status) error {
	if err := st.Validate(time.Now()); err != nil {
		return fmt.Errorf("redisstore: %w", err)
	}
	start := time.Now()
	v, err := run(ctx, s.rdb, s.sc.userStatus, userKeys(user), user, int(st.Mode), st.Text, st.Emoji, unixMS(st.ExpiresAt))
	if err != nil {
		if replyLost(err) {
			// A retry finds the status set and publishes nothing: the
			// user's own devices would never get it. Listed before the
			// flag is set, so the tell it causes sends it.
			s.statusesLost.addDroppingOldest(maxStatusesLost, user)
			s.replyLost.Store(true)
		}
		return s.failed(store.OpUserStatus, fmt.Errorf("redisstore: status: %w", scriptErr(err)))
	}
	if !st.ExpiresAt.IsZero() {
		// The shard's owner may not sweep it before its next known claim.
		s.sweepAfter(shardOf(user), time.Until(st.ExpiresAt))
	}
	return s.apply(ctx, store.OpUserStatus, v, start)
}

// Disconnect implements store.Tracker. The connection leaves this node's
// books even if Redis is unreachable; reconciliation ends it there later.
func (s *Store) Disconnect(ctx context.Context, connID string, cause presence.Cause) error {
	start := time.Now()
	s.mu.Lock()
	lc, ok := s.conns[connID]
	delete(s.conns, connID)
	s.mu.Unlock()
	if !ok {
		return ErrUnknownConn
	}
	if cause == presence.Expired {
		// The script ends with this connection the user's others here
		// whose deadline in Redis has passed: the node reaps them in the
		// same tick. A heartbeat of theirs still waiting in its batch
		// would not have moved it yet, so the batch goes first.
		if ids := s.beats.takeShard(int(lc.shard)); len(ids) > 0 {
			var pending [numShards][]string
			pending[lc.shard] = ids
			s.writeBatches(ctx, &pending)
		}
	}
	dc := s.disconnectCall(connID, lc.user, lc.node, cause, true, int64(lc.heard))
	v, err := run(ctx, s.rdb, s.sc.disconnect, dc.keys, dc.args...)
	if err == nil {
		s.sweepAtGraceEnd(shardOf(lc.user), v)
	}
	if err != nil {
		s.noteLostReply(err)
		if !isRedisReply(err) {
			s.endLater(pendingEnd{id: connID, user: lc.user, node: lc.node, cause: cause, known: true, heard: int64(lc.heard)})
		}
		err = scriptErr(err)
		if errors.Is(err, ErrUnknownConn) {
			return err
		}
		return s.failed(store.OpDisconnect, fmt.Errorf("redisstore: disconnect: %w", err))
	}
	return s.apply(ctx, store.OpDisconnect, v, start)
}

// evalShards runs script once per shard, as mk makes the call, in one
// pipeline.
func (s *Store) evalShards(ctx context.Context, script *redis.Script, mk func(sh int) call) ([]any, error) {
	calls := make([]call, numShards)
	for sh := range calls {
		calls[sh] = mk(sh)
	}
	replies, errs := s.evalMany(ctx, script, calls)
	out := replies[:0]
	var firstErr error
	for i, err := range errs {
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		out = append(out, replies[i])
	}
	return out, firstErr
}

// call is one script invocation: its keys and arguments.
type call struct {
	keys []string
	args []any
}

// evalMany runs script for every call in one pipeline, loading the script
// and trying again once if Redis lost it. errs[i] is the error of call i.
func (s *Store) evalMany(ctx context.Context, script *redis.Script, calls []call) ([]any, []error) {
	replies := make([]any, len(calls))
	errs := make([]error, len(calls))
	todo := make([]int, len(calls)) // indexes still to run
	for i := range todo {
		todo[i] = i
	}
	for attempt := 0; attempt < 2 && len(todo) > 0; attempt++ {
		pipe := s.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(todo))
		for j, i := range todo {
			cmds[j] = evalSha(ctx, script, calls[i].keys, calls[i].args)
			_ = pipe.Process(ctx, cmds[j])
		}
		_, _ = pipe.Exec(ctx)
		var again []int
		for j, i := range todo {
			replies[i], errs[i] = cmds[j].Result()
			if errs[i] != nil && redis.HasErrorPrefix(errs[i], "NOSCRIPT") {
				again = append(again, i) // a node lost its script cache: nothing ran
			}
		}
		if len(again) == 0 || attempt == 1 {
			break
		}
		if err := s.loadScript(ctx, script); err != nil {
			for _, i := range again {
				errs[i] = err
			}
			break
		}
		todo = again
	}
	return replies, errs
}

// isRedisReply reports whether err is Redis's answer to the call itself, a
// script's error reply, as opposed to a connection failure or a refusal of
// every call for now (transientReply).
func isRedisReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !transientReply(re.Error())
}

// transientReply reports a reply that refuses the call for a while and ran
// nothing: a cluster that lost a master or its majority (CLUSTERDOWN), a
// server loading its data, a slot moving or served elsewhere, a write that
// reached a demoted master, a script running long. Taken for an answer, a
// status write refused so was never made again: the node stayed healthy and
// re-asserted nothing (chaos seed 239783446, cluster: a viewer showed away
// for 14 s a user who had gone online).
func transientReply(msg string) bool {
	for _, p := range []string{"CLUSTERDOWN", "LOADING", "TRYAGAIN", "MASTERDOWN", "READONLY", "BUSY", "MOVED", "ASK"} {
		if strings.HasPrefix(msg, p+" ") {
			return true
		}
	}
	return false
}

// loadScript loads a script on every master (Redis lost its script cache).
func (s *Store) loadScript(ctx context.Context, script *redis.Script) error {
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return script.Load(ctx, c).Err()
		})
	}
	return script.Load(ctx, s.rdb).Err()
}

// apply publishes a transition's changes and reports it.
func (s *Store) apply(ctx context.Context, op string, v any, start time.Time) error {
	out, err := parseOutcome(v)
	if err != nil {
		return err
	}
	if len(out.Expired) > 0 {
		s.mu.Lock()
		for _, c := range out.Expired {
			delete(s.conns, c.ID)
		}
		s.mu.Unlock()
	}
	if len(out.Statuses) > 0 {
		s.publishStatuses(ctx, out.Statuses)
	}
	if len(out.Changes) > 0 {
		s.publishChanges(ctx, out)
	}
	s.m.scriptLatency.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if o := s.obs.Load(); o != nil {
		(*o).ObserveOutcome(op, out.Outcome, time.Since(start))
	}
	return nil
}

// failed counts a failed operation. Lost contact with Redis makes the
// health check re-assert and reconcile once Redis answers; a mere timeout
// does not, since re-asserting every connection into an overloaded Redis
// would only feed the overload (the failed call itself is retried instead,
// where it matters: see endLater).
func (s *Store) failed(op string, err error) error {
	s.m.errors.WithLabelValues(op).Inc()
	if lostContact(err) {
		s.healthy.Store(false)
	}
	return err
}

// lostContact reports an error that means Redis was not reached (refused,
// reset, closed), as opposed to a script's answer or a timeout.
func lostContact(err error) bool {
	if err == nil || isRedisReply(err) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// pendingEnd is a connection to end in Redis again: its disconnect (or its
// failed connect) may or may not have reached Redis.
type pendingEnd struct {
	id, user string // user picks the shard
	node     string // the node it was connected on
	cause    presence.Cause
	known    bool  // the user was connected here: a lost record still ends in an offline
	heard    int64 // as disconnectCall takes it
	tries    int
}

// maxPendingEnds bounds the retry list; past it the health check's
// reconciliation is left to clean up.
const maxPendingEnds = 100000

func (s *Store) endLater(e pendingEnd) {
	if !s.ends.add(maxPendingEnds, e) {
		s.healthy.Store(false)
	}
}

// retryEnds runs the pending ends; the ones that fail again wait for the
// next flush, up to 20 tries (reconciliation covers the rest).
func (s *Store) retryEnds(ctx context.Context) {
	for _, e := range s.ends.take() {
		c := s.disconnectCall(e.id, e.user, e.node, e.cause, e.known, e.heard)
		v, err := run(ctx, s.rdb, s.sc.disconnect, c.keys, c.args...)
		switch {
		case err == nil:
			s.sweepAtGraceEnd(shardOf(e.user), v)
			_ = s.apply(ctx, store.OpDisconnect, v, time.Now())
		case isRedisReply(err): // unknown: nothing left to end
		case e.tries < 20:
			s.noteLostReply(err)
			e.tries++
			s.endLater(e)
		default:
			s.noteLostReply(err)
			s.healthy.Store(false)
		}
	}
}

func boolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
