package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
)

// teamChannel is the sharded Pub/Sub channel of a team. Channels carry one
// of numShards hash tags, so a node needs at most numShards subscription
// connections on a cluster (one per tag), and one on a single server.
func teamChannel(team string) string {
	return fmt.Sprintf("gd:{ev%d}:t:%s", crc32.ChecksumIEEE([]byte(team))%numShards, team)
}

func teamOfChannel(ch string) string {
	if i := strings.Index(ch, "}:t:"); i >= 0 {
		return ch[i+4:]
	}
	return ""
}

// subscriber owns this node's subscriptions and their reader goroutines.
//
// Every channel asked for is tracked until Redis confirms it. Watch returns
// only then: a change published before the confirmation would not reach
// this node. A confirmation of a channel that was confirmed already means
// go-redis lost its connection and subscribed again by itself: messages may
// have been lost meanwhile, so viewers are resynced.
type subscriber struct {
	s *Store
	// ctx ends with close: it stops the replacements of subscriptions
	// that Redis dropped (movedLocked).
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	members *redis.PubSub
	px      *redis.PubSub            // pxChannel, app messages (pusher.go)
	shards  map[string]*redis.PubSub // by channel hash tag ("" on a single server)
	watched map[string]int           // team → watches minus unwatches; absent when 0
	chans   map[string]*subState     // by channel, while subscribed
	// replacing: the subscriptions whose channels Redis dropped, being
	// replaced (movedLocked).
	replacing map[*redis.PubSub]bool
	wg        sync.WaitGroup
}

// subState is one channel's subscription.
type subState struct {
	confirmed bool
	waiters   []chan struct{} // closed on confirmation
}

func newSubscriber(s *Store) *subscriber {
	ctx, cancel := context.WithCancel(context.Background())
	return &subscriber{s: s, ctx: ctx, cancel: cancel, shards: make(map[string]*redis.PubSub),
		watched: make(map[string]int), chans: make(map[string]*subState), replacing: make(map[*redis.PubSub]bool)}
}

func (sb *subscriber) start(ctx context.Context) error {
	ps := sb.s.rdb.SSubscribe(ctx, membershipChannel)
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		return fmt.Errorf("redisstore: subscribe: %w", err)
	}
	// App messages have their own connection and reader: a burst of them
	// must not hold up membership and presence events (those two wait for
	// each other on one Redis, below: order first), and a resubscription
	// after an outage needs no resync (they are delivered at most once
	// anyway). Only nodes that serve them hold that connection.
	var px *redis.PubSub
	if sb.s.cfg.Broadcasts {
		px = sb.s.rdb.SSubscribe(ctx, pxChannel)
		if _, err := px.Receive(ctx); err != nil {
			_ = px.Close()
			_ = ps.Close()
			return fmt.Errorf("redisstore: subscribe: %w", err)
		}
	}
	sb.mu.Lock()
	sb.members = ps
	if !sb.s.cluster {
		// Teams' channels on the same connection: one reader dispatches
		// membership and presence events in the order Redis published
		// them, so a change made after a removal is routed once the removal
		// is applied, even when a node cut off from Redis gets both at the
		// heal (finding 21 of docs/reliability-findings.md). A cluster
		// spreads the channels over its masters, where no order holds.
		sb.shards[""] = ps
	}
	sb.px = px
	sb.chans[membershipChannel] = &subState{confirmed: true}
	if px != nil {
		sb.chans[pxChannel] = &subState{confirmed: true}
	}
	sb.mu.Unlock()
	sb.read(ps)
	if px != nil {
		sb.read(px)
	}
	return nil
}

func (sb *subscriber) bucket(ch string) string {
	if !sb.s.cluster {
		return ""
	}
	return ch[strings.Index(ch, "{"):strings.Index(ch, "}")]
}

// subscribeLocked asks for ch (on ps, the subscription of its slot, made
// when nil) unless it is asked for already, and returns a channel closed
// once Redis has confirmed it.
func (sb *subscriber) subscribeLocked(ctx context.Context, ps *redis.PubSub, ch string) (<-chan struct{}, error) {
	done := make(chan struct{})
	if st := sb.chans[ch]; st != nil {
		if st.confirmed {
			close(done)
		} else {
			st.waiters = append(st.waiters, done) // asked for by another watch
		}
		return done, nil
	}
	sb.chans[ch] = &subState{waiters: []chan struct{}{done}}
	if ps == nil {
		// Made with its first channel, which picks the slot's node, before
		// its reader starts (which would connect to any node). go-redis
		// drops this first subscribe's error: the confirmation, or its
		// absence, tells.
		ps = sb.s.rdb.SSubscribe(ctx, ch)
		sb.shards[sb.bucket(ch)] = ps
		sb.read(ps)
		return done, nil
	}
	if err := ps.SSubscribe(ctx, ch); err != nil {
		return nil, err
	}
	return done, nil
}

// Watch implements store.Watcher: it returns once Redis has confirmed the
// subscription of every team's channel, or fails and takes back its watches.
func (s *Store) Watch(ctx context.Context, teams []string) error {
	sb := s.subs
	var wait []<-chan struct{}
	sb.mu.Lock()
	for i, t := range teams {
		// Counts may go below zero when an unwatch overtakes its watch;
		// the channel is subscribed exactly while the count is positive.
		sb.watched[t]++
		if sb.watched[t] == 0 {
			delete(sb.watched, t)
		}
		if sb.watched[t] < 1 {
			continue
		}
		ch := teamChannel(t)
		done, err := sb.subscribeLocked(ctx, sb.shards[sb.bucket(ch)], ch)
		if err != nil {
			sb.mu.Unlock()
			s.Unwatch(teams[:i+1])
			return fmt.Errorf("redisstore: subscribe %s: %w", t, errors.Join(ErrUnavailable, err))
		}
		wait = append(wait, done)
	}
	sb.mu.Unlock()
	for _, done := range wait {
		select {
		case <-done:
		case <-ctx.Done():
			s.Unwatch(teams)
			return fmt.Errorf("redisstore: subscribe: no confirmation: %w", errors.Join(ErrUnavailable, ctx.Err()))
		}
	}
	return nil
}

// Unwatch implements store.Watcher.
func (s *Store) Unwatch(teams []string) {
	sb := s.subs
	sb.mu.Lock()
	defer sb.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, t := range teams {
		sb.watched[t]--
		if sb.watched[t] != 0 {
			continue
		}
		delete(sb.watched, t)
		ch := teamChannel(t)
		sb.dropLocked(ch)
		if ps := sb.shards[sb.bucket(ch)]; ps != nil {
			_ = ps.SUnsubscribe(ctx, ch)
		}
	}
}

// dropLocked forgets a channel; whoever still waits for it is let go (the
// watches that asked for it were taken back).
func (sb *subscriber) dropLocked(ch string) {
	if st := sb.chans[ch]; st != nil {
		for _, w := range st.waiters {
			close(w)
		}
		delete(sb.chans, ch)
	}
}

// sync returns once every subscription of this node is in place in Redis,
// after any subscriptions go-redis re-established were confirmed (and so
// counted): a probe channel is subscribed on each subscription connection,
// behind them, and its confirmation waited for. Twice: a probe asked for
// while go-redis is still reconnecting goes out in the same command as the
// channels it re-subscribes, in no set order, so its confirmation may come
// before theirs; the second probe is sent on the connection the first one
// was confirmed on, after that command.
func (sb *subscriber) sync(ctx context.Context) error {
	if err := sb.probe(ctx); err != nil {
		return err
	}
	return sb.probe(ctx)
}

func (sb *subscriber) probe(ctx context.Context) error {
	sb.mu.Lock()
	probes := map[string]*redis.PubSub{"gd:{members}:sync:" + sb.s.cfg.Node: sb.members}
	for b, ps := range sb.shards {
		tag := b + "}"
		if b == "" {
			tag = "{ev0}"
		}
		probes["gd:"+tag+":sync:"+sb.s.cfg.Node] = ps
	}
	var wait []<-chan struct{}
	var err error
	for ch, ps := range probes {
		var done <-chan struct{}
		if done, err = sb.subscribeLocked(ctx, ps, ch); err != nil {
			break
		}
		wait = append(wait, done)
	}
	sb.mu.Unlock()
	for _, done := range wait {
		if err != nil {
			break
		}
		select {
		case <-done:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	sb.mu.Lock()
	for ch, ps := range probes {
		sb.dropLocked(ch)
		_ = ps.SUnsubscribe(ctx, ch)
	}
	sb.mu.Unlock()
	return err
}

func (sb *subscriber) read(ps *redis.PubSub) {
	sb.wg.Add(1)
	go func() {
		defer sb.wg.Done()
		for msg := range ps.ChannelWithSubscriptions() { // closed by ps.Close
			switch m := msg.(type) {
			case *redis.Message:
				if m.Channel == pxChannel {
					sb.s.deliverBroadcast(m.Payload)
				} else {
					sb.dispatch(m)
				}
			case *redis.Subscription:
				sb.confirmed(ps, m)
			}
		}
	}()
}

// confirmed notes a subscription confirmation. A second one for a channel
// means go-redis reconnected and subscribed again by itself; one for a
// channel nobody asked for, that it subscribed a channel taken back while
// the connection was down. Either way messages may have been lost (not
// app messages: they are delivered at most once anyway).
//
// An unsubscription of a channel still held is Redis's: its slot moved to
// another node (a failover, a resharding), and ps is replaced.
func (sb *subscriber) confirmed(ps *redis.PubSub, m *redis.Subscription) {
	sb.mu.Lock()
	st := sb.chans[m.Channel]
	if m.Kind == "sunsubscribe" {
		// Ours drop the channel first (Unwatch, probe), and one asked for
		// again since is not confirmed yet.
		if st != nil && st.confirmed {
			sb.movedLocked(ps)
		}
		sb.mu.Unlock()
		return
	}
	if m.Kind != "ssubscribe" && m.Kind != "subscribe" {
		sb.mu.Unlock()
		return
	}
	again := st == nil || st.confirmed
	if st != nil && !st.confirmed {
		st.confirmed = true
		for _, w := range st.waiters {
			close(w)
		}
		st.waiters = nil
	}
	sb.mu.Unlock()
	if again && m.Channel != pxChannel {
		sb.s.needResync.Store(true)
	}
}

// movedLocked replaces ps, whose channels Redis dropped as their slot moved
// to another node. go-redis keeps such a connection and never subscribes
// again, so the node would hear nothing more of those channels: a new
// subscription is made on the slot's new master, and the viewers are
// resynced once it is confirmed (what was published meanwhile is lost).
func (sb *subscriber) movedLocked(ps *redis.PubSub) {
	// Only a cluster moves slots.
	if !sb.s.cluster || sb.replacing[ps] || sb.ctx.Err() != nil {
		return
	}
	sb.replacing[ps] = true
	sb.s.log.Warn("redis dropped this node's subscriptions (their slot moved: a failover?); subscribing on the new master")
	sb.wg.Add(1)
	go func() {
		defer sb.wg.Done()
		sb.replace(ps)
	}()
}

// replace subscribes old's channels again on a new connection until Redis
// confirms them all, then asks for a resync.
func (sb *subscriber) replace(old *redis.PubSub) {
	backoff := 50 * time.Millisecond
	for {
		if cc, ok := sb.s.rdb.(*redis.ClusterClient); ok {
			sb.mu.Lock()
			bucket, held := sb.bucketOfLocked(old)
			sb.mu.Unlock()
			if held {
				sb.awaitMaster(cc, bucket+"}")
			}
		}
		sb.mu.Lock()
		if sb.ctx.Err() != nil {
			delete(sb.replacing, old)
			sb.mu.Unlock()
			return
		}
		// Should Redis drop the new one's channels too once confirmed,
		// confirmed starts another replace of it.
		nps, wait := sb.resubscribeLocked(old)
		delete(sb.replacing, old)
		sb.mu.Unlock()
		_ = old.Close()
		if nps == nil {
			return // nothing was left on it
		}
		ctx, cancel := context.WithTimeout(sb.ctx, subsSyncTimeout)
		err := waitAll(ctx, wait)
		cancel()
		if err == nil {
			sb.s.log.Info("subscriptions moved to the new master; resyncing viewers")
			sb.s.needResync.Store(true)
			return
		}
		if sb.ctx.Err() != nil {
			return
		}
		sb.s.log.Warn("subscriptions on the new master not confirmed; trying again", "err", err, "in", backoff)
		select {
		case <-sb.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
		old = nps
	}
}

// resubscribeLocked puts a new subscription in old's place, with the
// channels held on it marked unconfirmed, and returns it with a channel per
// channel closed once Redis confirms it; nil if old is no longer in use.
func (sb *subscriber) resubscribeLocked(old *redis.PubSub) (*redis.PubSub, []<-chan struct{}) {
	bucket, held := sb.bucketOfLocked(old)
	if !held {
		return nil, nil
	}
	var chans []string
	var wait []<-chan struct{}
	for ch, st := range sb.chans {
		if sb.bucket(ch) != bucket {
			continue
		}
		chans = append(chans, ch)
		st.confirmed = false
		done := make(chan struct{})
		st.waiters = append(st.waiters, done)
		wait = append(wait, done)
	}
	if len(chans) == 0 {
		// Every team of it was unwatched: the next watch subscribes anew.
		delete(sb.shards, bucket)
		return nil, nil
	}
	nps := sb.s.rdb.SSubscribe(sb.ctx, chans...)
	switch {
	case old == sb.members:
		sb.members = nps
	case old == sb.px:
		sb.px = nps
	}
	if sb.shards[bucket] == old {
		sb.shards[bucket] = nps // also the members' own on one Redis
	}
	sb.read(nps)
	return nps, wait
}

// bucketOfLocked is the bucket whose channels ps holds; false if ps is no
// longer in use.
func (sb *subscriber) bucketOfLocked(ps *redis.PubSub) (string, bool) {
	switch {
	case ps == sb.members:
		return sb.bucket(membershipChannel), true
	case ps == sb.px && ps != nil:
		return sb.bucket(pxChannel), true
	}
	for b, held := range sb.shards {
		if held == ps {
			return b, true
		}
	}
	return "", false
}

// awaitMaster waits until cc's slot map gives key's slot to a node that
// says it is a master, or sb stops. Redis drops the subscriptions of a
// slot as the slot moves, before go-redis knows: it learns of a failover
// from a redirected command (MOVED) or a reload, which ReloadState only
// starts. Subscribed by the old map, the channels would go to the former
// master, a replica being reconfigured that hears none of the shard's
// messages until the new master counts it as its own (seconds, finding 24
// of docs/reliability-findings.md), and the resync that follows the
// confirmation would come before the changes it missed.
func (sb *subscriber) awaitMaster(cc *redis.ClusterClient, key string) {
	start := time.Now()
	warned := false
	for d := 20 * time.Millisecond; ; d = min(2*d, 500*time.Millisecond) {
		cc.ReloadState(sb.ctx)
		ctx, cancel := context.WithTimeout(sb.ctx, time.Second)
		role, err := masterRole(ctx, cc, key)
		cancel()
		if role == "master" || sb.ctx.Err() != nil {
			return
		}
		// A node that answers with an error (a user not allowed ROLE)
		// will not answer otherwise: subscribed by the map as it is.
		var refused redis.Error
		if errors.As(err, &refused) {
			sb.s.log.Warn("cannot ask ROLE; subscribing by the slot map as it is", "err", err)
			return
		}
		if !warned && time.Since(start) > 5*time.Second {
			warned = true
			sb.s.log.Warn("no master for the dropped subscriptions' slot yet; waiting", "role", role, "err", err)
		}
		select {
		case <-sb.ctx.Done():
			return
		case <-time.After(d):
		}
	}
}

// masterRole is the role (ROLE) of the node that cc's slot map gives key's
// slot to.
func masterRole(ctx context.Context, cc *redis.ClusterClient, key string) (string, error) {
	node, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return "", err
	}
	reply, err := node.Do(ctx, "ROLE").Slice()
	if err != nil || len(reply) == 0 {
		return "", err
	}
	role, _ := reply[0].(string)
	return role, nil
}

func waitAll(ctx context.Context, wait []<-chan struct{}) error {
	for _, done := range wait {
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (sb *subscriber) dispatch(msg *redis.Message) {
	h := sb.s.handlerOf()
	if h == nil {
		return
	}
	if msg.Channel == membershipChannel && strings.HasPrefix(msg.Payload, `{"k":"dead"`) {
		// sweep.go, tellNodeDead and tellLostReply; the node that told
		// resyncs by itself.
		var m deadMsg
		if err := json.Unmarshal([]byte(msg.Payload), &m); err != nil || m.Node != sb.s.cfg.Node {
			sb.s.needResync.Store(true)
		}
		return
	}
	if msg.Channel == membershipChannel && strings.HasPrefix(msg.Payload, `{"k":"status"`) {
		var m statusMsg
		if err := json.Unmarshal([]byte(msg.Payload), &m); err != nil {
			sb.s.log.Warn("bad status message", "err", err)
			return
		}
		if sh, ok := h.(store.StatusHandler); ok {
			sh.OnStatus(presence.StatusChange{UserID: m.User, Version: m.Version, Status: presence.Status{
				Mode: presence.Mode(m.Mode), Text: m.Text, Emoji: m.Emoji, ExpiresAt: msTime(m.ExpiresAt)}})
		}
		return
	}
	if msg.Channel == membershipChannel {
		var m membershipMsg
		if err := json.Unmarshal([]byte(msg.Payload), &m); err != nil {
			sb.s.log.Warn("bad membership message", "err", err)
			return
		}
		h.OnMembership(store.MembershipEvent{Team: m.Team, UserID: m.User, Joined: m.Joined,
			UserTeams: memberView{sb.s, m.User, m.Teams, m.Many}, State: presence.State(m.State), Version: m.Version, Presence: m.shownPresence()})
		return
	}
	var m changeMsg
	if err := json.Unmarshal([]byte(msg.Payload), &m); err != nil {
		sb.s.log.Warn("bad change message", "err", err)
		return
	}
	sb.s.m.pubsubLag.Observe(time.Since(time.UnixMilli(m.At)).Seconds())
	h.OnPresence(store.PresenceEvent{
		Change: presence.Change{UserID: m.User, State: presence.State(m.State), Version: m.Version, At: time.UnixMilli(m.At),
			Text: m.Text, Emoji: m.Emoji, ExpiresAt: msTime(m.ExpiresAt), Since: msTime(m.Since), LastSeen: msTime(m.LastSeen)},
		Teams: m.Teams,
		Via:   teamOfChannel(msg.Channel),
	})
}

func (sb *subscriber) close() {
	sb.cancel()
	sb.mu.Lock()
	if sb.members != nil {
		_ = sb.members.Close()
	}
	if sb.px != nil {
		_ = sb.px.Close()
	}
	for _, ps := range sb.shards {
		if ps != sb.members {
			_ = ps.Close()
		}
	}
	sb.mu.Unlock()
	sb.wg.Wait()
}
