package redisstore

import (
	"context"
	"encoding/json"
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
type subscriber struct {
	s *Store

	mu      sync.Mutex
	members *redis.PubSub
	shards  map[string]*redis.PubSub // by channel hash tag ("" on a single server)
	watched map[string]int           // team → watches minus unwatches; absent when 0
	expect  map[string]int           // subscription confirmations we asked for, by channel
	wg      sync.WaitGroup
}

func newSubscriber(s *Store) *subscriber {
	return &subscriber{s: s, shards: make(map[string]*redis.PubSub), watched: make(map[string]int),
		expect: make(map[string]int)}
}

func (sb *subscriber) start(ctx context.Context) error {
	ps := sb.s.rdb.SSubscribe(ctx, membershipChannel)
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		return fmt.Errorf("redisstore: subscribe: %w", err)
	}
	sb.members = ps
	sb.read(ps)
	return nil
}

func (sb *subscriber) bucket(ch string) string {
	if !sb.s.cluster {
		return ""
	}
	return ch[strings.Index(ch, "{"):strings.Index(ch, "}")]
}

// Watch implements store.Watcher.
func (s *Store) Watch(ctx context.Context, teams []string) error {
	sb := s.subs
	sb.mu.Lock()
	defer sb.mu.Unlock()
	for _, t := range teams {
		// Counts may go below zero when an unwatch overtakes its watch;
		// the channel is subscribed exactly while the count is positive.
		sb.watched[t]++
		if sb.watched[t] == 0 {
			delete(sb.watched, t)
		}
		if sb.watched[t] != 1 {
			continue
		}
		ch := teamChannel(t)
		b := sb.bucket(ch)
		ps := sb.shards[b]
		sb.expect[ch]++
		if ps == nil {
			ps = s.rdb.SSubscribe(ctx, ch)
			sb.shards[b] = ps
			sb.read(ps)
			continue
		}
		if err := ps.SSubscribe(ctx, ch); err != nil {
			return fmt.Errorf("redisstore: subscribe %s: %w", t, err)
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
		if ps := sb.shards[sb.bucket(ch)]; ps != nil {
			_ = ps.SUnsubscribe(ctx, ch)
		}
	}
}

func (sb *subscriber) read(ps *redis.PubSub) {
	sb.wg.Add(1)
	go func() {
		defer sb.wg.Done()
		for msg := range ps.ChannelWithSubscriptions() { // closed by ps.Close
			switch m := msg.(type) {
			case *redis.Message:
				sb.dispatch(m)
			case *redis.Subscription:
				sb.confirmed(m)
			}
		}
	}()
}

// confirmed notes a subscription confirmation. One nobody asked for means
// go-redis reconnected and subscribed again by itself: messages may have been
// lost meanwhile, so viewers are resynced.
func (sb *subscriber) confirmed(m *redis.Subscription) {
	if m.Kind != "ssubscribe" && m.Kind != "subscribe" {
		return
	}
	sb.mu.Lock()
	expected := sb.expect[m.Channel] > 0
	if expected {
		sb.expect[m.Channel]--
		if sb.expect[m.Channel] == 0 {
			delete(sb.expect, m.Channel)
		}
	}
	sb.mu.Unlock()
	if !expected {
		sb.s.needResync.Store(true)
	}
}

func (sb *subscriber) dispatch(msg *redis.Message) {
	h := sb.s.handler
	if h == nil {
		return
	}
	if msg.Channel == membershipChannel {
		var m membershipMsg
		if err := json.Unmarshal([]byte(msg.Payload), &m); err != nil {
			sb.s.log.Warn("bad membership message", "err", err)
			return
		}
		h.OnMembership(store.MembershipEvent{Team: m.Team, UserID: m.User, Joined: m.Joined,
			UserTeams: m.Teams, State: presence.State(m.State), Version: m.Version})
		return
	}
	var m changeMsg
	if err := json.Unmarshal([]byte(msg.Payload), &m); err != nil {
		sb.s.log.Warn("bad change message", "err", err)
		return
	}
	sb.s.m.pubsubLag.Observe(time.Since(time.UnixMilli(m.At)).Seconds())
	h.OnPresence(store.PresenceEvent{
		Change: presence.Change{UserID: m.User, State: presence.State(m.State), Version: m.Version, At: time.UnixMilli(m.At)},
		Teams:  m.Teams,
		Via:    teamOfChannel(msg.Channel),
	})
}

func (sb *subscriber) close() {
	sb.mu.Lock()
	if sb.members != nil {
		_ = sb.members.Close()
	}
	for _, ps := range sb.shards {
		_ = ps.Close()
	}
	sb.mu.Unlock()
	sb.wg.Wait()
}
