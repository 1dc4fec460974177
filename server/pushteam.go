package server

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/pusher"
	"github.com/greendot/greendot/store"
)

// pxTeam is a presence channel on this node: the team's members as its
// subscribers were told them (present or not, at which version) and its
// subscribers. Members are users: one member_added when a user's first
// device comes online anywhere, one member_removed when the store
// publishes their offline after the grace. The hub hands it the team's
// changes and membership events (route.go); a goroutine of its own
// applies them in order, reading user_info where it needs to, so the hub
// never waits for it. It runs from the first subscription here to the
// last.
type pxTeam struct {
	p       *pxServer
	team    string
	channel string
	refs    int // subscriptions here, pending ones included; guarded by p.mu

	mu      sync.Mutex
	queue   []pxItem
	pending map[*pxConn]struct{} // subscribed, not answered yet
	subs    map[*pxConn]string   // answered, by their user
	wake    chan struct{}
	done    chan struct{}
	stopped bool

	// Only the loop touches these.
	loaded  bool
	members map[string]pxMember
	infos   map[string]json.RawMessage
}

type pxMember struct {
	version uint64
	present bool
}

type pxItemKind int

const (
	itemChange pxItemKind = iota // user's presence changed
	itemLeave                    // user left the team
	itemSub                      // conn subscribed: answer it
	itemTruth                    // a resync read the team again
	itemInfo                     // user's user_info, known before their online
)

type pxItem struct {
	kind    pxItemKind
	user    string
	version uint64
	present bool
	conn    *pxConn
	info    json.RawMessage
	truth   []presence.Presence
}

func newPxTeam(p *pxServer, team string) *pxTeam {
	return &pxTeam{
		p:       p,
		team:    team,
		channel: "presence-" + team,
		pending: make(map[*pxConn]struct{}),
		subs:    make(map[*pxConn]string),
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		members: make(map[string]pxMember),
		infos:   make(map[string]json.RawMessage),
	}
}

func (t *pxTeam) enqueue(it pxItem) {
	t.mu.Lock()
	if !t.stopped {
		t.queue = append(t.queue, it)
	}
	t.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// pend notes pc as subscribed and waiting for its answer.
func (t *pxTeam) pend(pc *pxConn) {
	t.mu.Lock()
	t.pending[pc] = struct{}{}
	t.mu.Unlock()
}

// release forgets pc: it unsubscribed or closed.
func (t *pxTeam) release(pc *pxConn) {
	t.mu.Lock()
	delete(t.pending, pc)
	delete(t.subs, pc)
	t.mu.Unlock()
}

// stop ends the loop; the caller took the team out of p.teams.
func (t *pxTeam) stop() {
	t.mu.Lock()
	if !t.stopped {
		t.stopped = true
		t.queue = nil
		close(t.done)
	}
	t.mu.Unlock()
}

func (t *pxTeam) loop() {
	defer t.p.s.wg.Done()
	for {
		select {
		case <-t.done:
			return
		case <-t.p.s.stop:
			return
		case <-t.wake:
		}
		if !t.loaded && !t.load() {
			continue
		}
		t.mu.Lock()
		items := t.queue
		t.queue = nil
		t.mu.Unlock()
		t.apply(items)
	}
}

// load reads the team's members once, before any item is applied: items
// queued since the team was registered carry versions, so none is lost or
// applied twice whatever the order. It retries until it succeeds or the
// team stops.
func (t *pxTeam) load() bool {
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		truth, err := t.p.s.teamStates(ctx, t.team)
		cancel()
		if err == nil {
			for _, ps := range truth {
				t.members[ps.UserID] = pxMember{version: ps.Version, present: ps.State != presence.Offline}
			}
			t.loaded = true
			return true
		}
		if !errors.Is(err, store.ErrRecovering) {
			t.p.s.log.Warn("pusher presence channel", "team", t.team, "err", err)
		}
		select {
		case <-t.done:
			return false
		case <-t.p.s.stop:
			return false
		case <-time.After(wait):
		}
	}
}

// pxEvent is one member_added or member_removed to send.
type pxEvent struct {
	user  string
	added bool
}

func (t *pxTeam) apply(items []pxItem) {
	var out []pxEvent
	flush := func() {
		if len(out) > 0 {
			t.emit(out)
			out = out[:0]
		}
	}
	for _, it := range items {
		switch it.kind {
		case itemChange:
			if e, ok := t.change(it.user, it.version, it.present); ok {
				out = append(out, e)
			}
		case itemLeave:
			if m, ok := t.members[it.user]; ok {
				delete(t.members, it.user)
				delete(t.infos, it.user)
				if m.present {
					out = append(out, pxEvent{user: it.user})
				}
			}
			t.dropSubsOf(it.user)
		case itemTruth:
			seen := make(map[string]struct{}, len(it.truth))
			for _, ps := range it.truth {
				seen[ps.UserID] = struct{}{}
				if e, ok := t.change(ps.UserID, ps.Version, ps.State != presence.Offline); ok {
					out = append(out, e)
				}
			}
			for u, m := range t.members {
				if _, ok := seen[u]; !ok {
					delete(t.members, u)
					delete(t.infos, u)
					if m.present {
						out = append(out, pxEvent{user: u})
					}
				}
			}
		case itemInfo:
			t.infos[it.user] = it.info
		case itemSub:
			// Events before it go out first: the new subscriber's list
			// is the state after them.
			flush()
			if it.info != nil {
				t.infos[it.user] = it.info
			} else {
				delete(t.infos, it.user)
			}
			t.answer(it.conn, it.user)
		}
	}
	flush()
}

// change applies a versioned state; it reports a member event when the
// user's presence in the list flips.
func (t *pxTeam) change(user string, version uint64, present bool) (pxEvent, bool) {
	m := t.members[user]
	if version <= m.version && m.version != 0 {
		return pxEvent{}, false
	}
	flip := m.present != present
	t.members[user] = pxMember{version: version, present: present}
	if !present {
		delete(t.infos, user)
	}
	return pxEvent{user: user, added: present}, flip
}

// answer sends subscription_succeeded to pc, if it is still waiting.
func (t *pxTeam) answer(pc *pxConn, user string) {
	ids := []string{user}
	for u, m := range t.members {
		if m.present && u != user {
			ids = append(ids, u)
		}
	}
	infos := t.infosOf(ids)
	members := make([]pusher.Member, len(ids))
	for i, u := range ids {
		members[i] = pusher.Member{ID: u, Info: infos[u]}
	}
	frame := pusher.Frame("pusher_internal:subscription_succeeded", t.channel, pusher.PresenceData(members))
	t.mu.Lock()
	if _, ok := t.pending[pc]; !ok {
		t.mu.Unlock()
		return
	}
	delete(t.pending, pc)
	t.subs[pc] = user
	// Written under t.mu, so no member event can overtake it.
	pc.write(frame)
	t.mu.Unlock()
}

// infosOf returns the user_info of users, reading from the store those not
// known here yet.
func (t *pxTeam) infosOf(users []string) map[string]json.RawMessage {
	out := make(map[string]json.RawMessage, len(users))
	var missing []string
	for _, u := range users {
		if info, ok := t.infos[u]; ok {
			out[u] = info
		} else {
			missing = append(missing, u)
		}
	}
	mi, ok := t.p.s.store.(store.MemberInfos)
	if len(missing) == 0 || !ok {
		return out
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := mi.MemberInfos(ctx, t.team, missing)
	if err != nil {
		// The member still shows, without its info: better than late.
		t.p.s.log.Warn("pusher user_info", "team", t.team, "err", err)
		return out
	}
	for i, u := range missing {
		if got[i] != nil {
			out[u] = json.RawMessage(got[i])
			t.infos[u] = out[u]
		}
	}
	return out
}

func (t *pxTeam) emit(events []pxEvent) {
	var added []string
	for _, e := range events {
		if e.added {
			added = append(added, e.user)
		}
	}
	infos := t.infosOf(added)
	frames := make([][]byte, len(events))
	for i, e := range events {
		if e.added {
			info := infos[e.user]
			if info == nil {
				info = json.RawMessage("{}")
			}
			frames[i] = pusher.Frame("pusher_internal:member_added", t.channel, struct {
				UserID   string          `json:"user_id"`
				UserInfo json.RawMessage `json:"user_info"`
			}{e.user, info})
		} else {
			frames[i] = pusher.Frame("pusher_internal:member_removed", t.channel, struct {
				UserID string `json:"user_id"`
			}{e.user})
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, e := range events {
		for pc, user := range t.subs {
			if user != e.user { // a user's own devices hear nothing of it
				pc.write(frames[i])
			}
		}
		t.p.s.metrics.pusherMemberEvents.WithLabelValues(map[bool]string{true: "added", false: "removed"}[e.added]).Inc()
	}
}

// dropSubsOf ends the subscriptions of a user taken out of the team: after
// a removal nothing more passes between them and its members.
func (t *pxTeam) dropSubsOf(user string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for pc, u := range t.subs {
		if u == user {
			delete(t.subs, pc)
		}
	}
}

// noteInfo hands a subscriber's user_info to the team's channel here, if
// there is one, ahead of the online that its subscription may cause.
func (p *pxServer) noteInfo(team, user string, info json.RawMessage) {
	if info == nil {
		info = json.RawMessage("{}")
	}
	p.mu.Lock()
	t := p.teams[team]
	p.mu.Unlock()
	if t != nil {
		t.enqueue(pxItem{kind: itemInfo, user: user, info: info})
	}
}

// Hub hooks: called with the hub's lock held, so they only queue.

func (p *pxServer) teamChange(team string, ch presence.Change) {
	p.mu.Lock()
	t := p.teams[team]
	p.mu.Unlock()
	if t != nil {
		t.enqueue(pxItem{kind: itemChange, user: ch.UserID, version: ch.Version, present: ch.State != presence.Offline})
	}
}

func (p *pxServer) teamMembership(ev store.MembershipEvent) {
	p.mu.Lock()
	t := p.teams[ev.Team]
	p.mu.Unlock()
	if t == nil {
		return
	}
	if ev.Joined {
		t.enqueue(pxItem{kind: itemChange, user: ev.UserID, version: ev.Version, present: ev.State != presence.Offline})
	} else {
		t.enqueue(pxItem{kind: itemLeave, user: ev.UserID})
	}
}

func (p *pxServer) teamTruth(team string, truth []presence.Presence) {
	p.mu.Lock()
	t := p.teams[team]
	p.mu.Unlock()
	if t != nil {
		t.enqueue(pxItem{kind: itemTruth, truth: truth})
	}
}

// presenceMembers is the online members of team, for the REST API.
func (p *pxServer) presenceMembers(ctx context.Context, team string) ([]string, error) {
	truth, err := p.s.teamStates(ctx, team)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ps := range truth {
		if ps.State != presence.Offline {
			out = append(out, ps.UserID)
		}
	}
	return out, nil
}
