package server

import (
	"sync"
	"time"

	"github.com/greendot/greendot/presence"
)

// views is what this node's viewers hold, team by team: for each team with
// local members and each subject they may see through it, the newest state
// and version routed to them or read in their snapshots. Only a shared store
// needs it (the memory store emits each change once, in order):
//
//   - A change reaches a node once per team channel of its subject. The
//     first copy is delivered to every local member of every team named in
//     the change; later copies find their version already there and are
//     dropped. Nothing depends on which copy comes first, nor on the index
//     changing between copies.
//   - A resync (after the node may have missed changes) compares the store
//     with views and sends only what differs.
//
// Memory is one entry per team with local members and subject seen through
// it: bounded by what the local viewers may see. A team's entries go when
// its last local member leaves.
type views struct {
	mu     sync.Mutex
	byTeam map[string]map[string]view // team → subject → view; guarded by mu
}

// view is what the local members of one team hold of one subject.
type view struct {
	version uint64        // the newest version routed or read: older copies are stale
	routed  uint64        // the newest version routed: a copy of it is no news
	look    presence.Look // what they see: state, status text, last seen
	// mixed: some members may hold another look than look (a snapshot read
	// disagreed with what was routed, or changes were missed). Cleared once a
	// change at or above version has been delivered to all of them.
	mixed bool
}

func newViews() *views {
	return &views{byTeam: make(map[string]map[string]view)}
}

// route decides, for each of teams (the subject's teams with local
// members), whether a change is delivered to that team's members, and
// records it in deliver. A copy of a change routed already through another
// team is delivered to nobody: whoever was indexed under a team since
// either got the first copy through another team or read the change in a
// snapshot taken after it. A change that moves no dot (same state, newer
// version, while the members agree) is recorded but not delivered:
// presence is state, and a restatement would only make clients fire their
// callbacks again.
func (v *views) route(teams []string, ch presence.Change, deliver []bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	copied := false
	for _, t := range teams {
		if cur, ok := v.byTeam[t][ch.UserID]; ok && cur.routed >= ch.Version {
			copied = true
			break
		}
	}
	for i, t := range teams {
		m := v.teamLocked(t)
		cur, ok := m[ch.UserID]
		next := view{version: ch.Version, look: ch.Look(), routed: ch.Version}
		switch {
		case !ok:
			deliver[i] = !copied
		case ch.Version > cur.version:
			deliver[i] = cur.mixed || (!copied && cur.look != next.look)
		case ch.Version == cur.version && cur.mixed:
			// Members who read an older state catch up; version is the
			// newest anyone holds, so after this they all agree.
			deliver[i] = true
		default: // a copy already routed, or older than what they hold
			deliver[i] = false
			cur.routed = max(cur.routed, ch.Version)
			next = cur
		}
		m[ch.UserID] = next
	}
}

// read records that a member of team was given subject's state (a snapshot,
// or the catch-up after joining a team). others: the team had other local
// members already, who may hold something else.
func (v *views) read(team string, p presence.Presence, others bool) {
	v.readAll(team, []presence.Presence{p}, others)
}

// readAll is read for several subjects of one team.
func (v *views) readAll(team string, ps []presence.Presence, others bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	m := v.teamLocked(team)
	for _, p := range ps {
		readLocked(m, p, others)
	}
}

func readLocked(m map[string]view, p presence.Presence, others bool) {
	cur, ok := m[p.UserID]
	if !ok {
		// Members already there hold nothing of the subject: offline.
		m[p.UserID] = view{version: p.Version, look: p.Look(), mixed: others && p.State != presence.Offline}
		return
	}
	if p.Look() != cur.look {
		cur.mixed = true
	}
	if p.Version > cur.version {
		cur.version, cur.look = p.Version, p.Look()
	}
	m[p.UserID] = cur
}

// adopt records that a member of team holds of subject what the members of
// team from hold (a join's catch-up leaves out whom the joiner sees through
// another team). others: as for read.
func (v *views) adopt(team, from, subject string, others bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	src, ok := v.byTeam[from][subject]
	if !ok {
		return
	}
	m := v.teamLocked(team)
	cur, had := m[subject]
	if !had {
		m[subject] = view{version: src.version, look: src.look, mixed: src.mixed || (others && src.look.State != presence.Offline)}
		return
	}
	if src.mixed || src.look != cur.look {
		cur.mixed = true
	}
	if src.version > cur.version {
		cur.version, cur.look = src.version, src.look
	}
	m[subject] = cur
}

// get is what team's members hold of subject, if anything is known.
func (v *views) get(team, subject string) (view, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	cur, ok := v.byTeam[team][subject]
	return cur, ok
}

// unseenOffline is the offline users of truth that team's view lacks.
func (v *views) unseenOffline(team string, truth []presence.Presence) []presence.Presence {
	v.mu.Lock()
	defer v.mu.Unlock()
	m := v.byTeam[team]
	var out []presence.Presence
	for _, p := range truth {
		if _, ok := m[p.UserID]; !ok && p.State == presence.Offline {
			out = append(out, p)
		}
	}
	return out
}

// versions is the version team's members hold of each subject.
func (v *views) versions(team string) map[string]uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make(map[string]uint64, len(v.byTeam[team]))
	for s, cur := range v.byTeam[team] {
		out[s] = cur.version
	}
	return out
}

// forget drops subject from team's views (the subject left the team).
func (v *views) forget(team, subject string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if m := v.byTeam[team]; m != nil {
		delete(m, subject)
	}
}

// dropTeam drops a team whose last local member left.
func (v *views) dropTeam(team string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.byTeam, team)
}

// resync compares the store's truth for a team's members with what the
// team's local members hold, returns the changes to send them and makes the
// truth what they hold. floor(subject) is above every version published
// before the store asked for the resync: a view newer than it came from a
// change after that, which the read may not show, so it is left alone; a
// truth older than the view means the store lost data, and the truth is
// sent at the floor so that it overrides what viewers hold.
func (v *views) resync(team string, truth []presence.Presence, floor func(string) uint64) []presence.Change {
	v.mu.Lock()
	defer v.mu.Unlock()
	old := v.byTeam[team]
	if old == nil {
		return nil // the team's last local member left meanwhile
	}
	m := make(map[string]view, len(truth))
	var out []presence.Change
	for _, t := range truth {
		cur, ok := old[t.UserID]
		f := floor(t.UserID)
		switch {
		case ok && cur.version > f:
			m[t.UserID] = cur // newer than this resync: the live path has it
			continue
		case !ok:
			if t.State != presence.Offline {
				out = append(out, t.ChangeAt(t.Version, time.Time{}))
			}
		case t.Version >= cur.version:
			if cur.mixed || cur.look != t.Look() {
				out = append(out, t.ChangeAt(t.Version, time.Time{}))
			}
		case cur.mixed || cur.look != t.Look(): // the store lost what they hold
			t.Version = f
			out = append(out, t.ChangeAt(f, time.Time{}))
		default:
			t.Version = cur.version
		}
		m[t.UserID] = view{version: t.Version, look: t.Look(), routed: max(cur.routed, t.Version)}
	}
	// Subjects no longer members are not carried over: nothing more is sent
	// between users who no longer share the team.
	v.byTeam[team] = m
	return out
}

func (v *views) teamLocked(team string) map[string]view {
	m := v.byTeam[team]
	if m == nil {
		m = make(map[string]view)
		v.byTeam[team] = m
	}
	return m
}
