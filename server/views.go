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
// its last local member leaves. While an entry's members disagree it also
// names the connections holding something else (odds), at most maxOdds.
type views struct {
	mu     sync.Mutex
	byTeam map[string]map[string]view // team → subject → view; guarded by mu
}

// view is what the local members of one team hold of one subject.
type view struct {
	version uint64        // the newest version routed or read: older copies are stale
	routed  uint64        // the newest version routed: a copy of it is no news
	look    presence.Look // what they see: state, status text, last seen
	since   int64         // ms: when look's state began (a change of text keeps it); 0 unknown
	// odd: nil while every member holds look (at version, or at an older
	// one with the same look). Otherwise some may hold another (a snapshot
	// read disagreed with what was routed): who holds what, as far as known.
	// Cleared once a change at or above version has reached all of them.
	odd *odds
}

// presence is the view's state of subject, as a store would read it.
func (v view) presence(subject string) presence.Presence {
	return presence.Presence{UserID: subject, State: v.look.State, Version: v.version,
		Since: msTime(v.since), ShownLastSeen: msTime(v.look.LastSeen),
		Status: presence.Status{Text: v.look.Text, Emoji: v.look.Emoji, ExpiresAt: msTime(v.look.ExpiresAt)}}
}

// odds is what the members of a mixed view hold. Only the exceptions are
// kept, and only while the members disagree, so an idle connection costs a
// view nothing: a per-connection record of every teammate would. A change
// then goes to the connections whose hold differs from it, not to all of
// them: one that holds it already would get the same version twice.
//
// Only a snapshot read says exactly who holds what (noteSnapshot names the
// connection); every other disagreement (a join's catch-up, a team adopted
// from another) makes it all: every member is sent, as when nothing was
// known. A connection whose snapshot was not noted yet is always sent
// (client.noted): odds know nothing of it.
type odds struct {
	base   held             // what the members not in except hold
	except map[*client]held // connections that hold something else
	all    bool             // not known: every member is sent
}

// held is what a connection holds of a subject. The zero held is nothing,
// which any offline matches.
type held struct {
	version uint64
	look    presence.Look
	unknown bool // it may hold a newer state routed since its read
}

// same reports whether a and b show a viewer the same: equal, or both
// offline and differing only in the last seen. An offline after an offline
// moves no dot: the viewer missed the online between (its write reached
// Redis and its reply was lost, so nobody published it: chaos seed
// 643529765), and sending it would have clients fire "went offline" twice.
// Such a viewer keeps the older last seen until the next change or
// snapshot.
func same(a, b presence.Look) bool {
	if a.State == presence.Offline && b.State == presence.Offline {
		a.LastSeen = b.LastSeen
	}
	return a == b
}

// maxOdds bounds a view's exceptions; beyond them, every member is sent.
const maxOdds = 64

// unsure is a view's odds when who holds what is not known.
func unsure() *odds { return &odds{all: true} }

// hold records that c holds h (nil c: some members, not known which).
func (o *odds) hold(c *client, h held) {
	switch {
	case o.all:
	case c == nil:
		o.all, o.except = true, nil
	default:
		if o.except == nil {
			o.except = make(map[*client]held)
		}
		o.except[c] = h
		if len(o.except) > maxOdds {
			o.all, o.except = true, nil
		}
	}
}

// settled is o with the exceptions that agree with base dropped, or nil
// once every member holds look.
func (o *odds) settled(look presence.Look) *odds {
	if o.all {
		return o
	}
	for c, h := range o.except {
		if !h.unknown && same(h.look, o.base.look) {
			delete(o.except, c)
		}
	}
	if len(o.except) == 0 && same(o.base.look, look) {
		return nil
	}
	return o
}

// differs reports whether c may hold something other than look.
func (o *odds) differs(c *client, look presence.Look) bool {
	if o.all || !c.noted.Load() {
		return true
	}
	h, ok := o.except[c]
	if !ok {
		h = o.base
	}
	switch {
	case h.unknown:
		return true
	case h == held{}:
		return look.State != presence.Offline
	}
	return !same(h.look, look)
}

// reach is to whom of a team's members a change goes.
type reach struct {
	all  bool
	odd  *odds // unless all: the members whose hold differs from look; nil none
	look presence.Look
}

// to reports whether c is sent the change.
func (r reach) to(c *client) bool { return r.all || (r.odd != nil && r.odd.differs(c, r.look)) }

// any reports whether some member may be sent the change.
func (r reach) any() bool { return r.all || r.odd != nil }

// reachOf is to whom a change to look goes in a view with odds o: o must
// be detached from the view (the caller replaces it), as the reach is read
// after the views' lock is released.
func reachOf(o *odds, look presence.Look) reach {
	if o.all {
		return reach{all: true}
	}
	return reach{odd: o, look: look}
}

func newViews() *views {
	return &views{byTeam: make(map[string]map[string]view)}
}

// route decides, for each of teams (the subject's teams with local
// members), to which of that team's members a change is delivered, and
// records it in deliver. A copy of a change routed already through another
// team is delivered to nobody: whoever was indexed under a team since
// either got the first copy through another team or read the change in a
// snapshot taken after it. A change that moves no dot (same state, newer
// version, while the members agree) is recorded but not delivered:
// presence is state, and a restatement would only make clients fire their
// callbacks again.
func (v *views) route(teams []string, ch presence.Change, deliver []reach) {
	v.mu.Lock()
	defer v.mu.Unlock()
	copied := false
	for _, t := range teams {
		if cur, ok := v.byTeam[t][ch.UserID]; ok && cur.routed >= ch.Version {
			copied = true
			break
		}
	}
	sent := false
	var kept []string // teams whose view stays as it was, odds and all
	for i, t := range teams {
		m := v.teamLocked(t)
		cur, ok := m[ch.UserID]
		next := view{version: ch.Version, look: ch.Look(), since: msOf(ch.Since), routed: ch.Version}
		switch {
		case !ok:
			deliver[i] = reach{all: !copied}
		case ch.Version > cur.version && cur.odd != nil:
			deliver[i] = reachOf(cur.odd, next.look)
		case ch.Version > cur.version:
			deliver[i] = reach{all: !copied && !same(cur.look, next.look)}
		case ch.Version == cur.version && cur.odd != nil:
			// Members who read an older state catch up; version is the
			// newest anyone holds, so after this they all agree.
			deliver[i] = reachOf(cur.odd, next.look)
		default: // a copy already routed, or older than what they hold
			deliver[i] = reach{}
			cur.routed = max(cur.routed, ch.Version)
			next = cur
			if cur.odd != nil {
				kept = append(kept, t)
			}
		}
		sent = sent || deliver[i].any()
		m[ch.UserID] = next
	}
	if sent {
		// What reached a member through another team may change what it
		// holds here: those odds no longer know.
		for _, t := range kept {
			v.unsureLocked(t, ch.UserID)
		}
	}
}

// read records that a member of team was given subject's state (a snapshot,
// or the catch-up after joining a team): reader, the connection given it,
// or nil when not one known (then a disagreement sends every member the
// next change). others: the team had other local members already, who may
// hold something else.
func (v *views) read(team string, p presence.Presence, reader *client, others bool) {
	v.readAll(team, []presence.Presence{p}, reader, others)
}

// readAll is read for several subjects of one team.
func (v *views) readAll(team string, ps []presence.Presence, reader *client, others bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	m := v.teamLocked(team)
	for _, p := range ps {
		readLocked(m, p, reader, others, nil)
	}
}

// readSnapshot is readAll for reader's snapshot, with bystanders listing
// the team's other indexed connections (called at most once, under v.mu,
// while the index cannot change). A subject the view has no entry for is
// then recorded with those named as holding nothing and reader's state as
// the base, so the odds settle once they have all noted the same. Taking
// them for the base instead left, after a crowd connected at once with no
// change to come, every such view mixed for good: 22 MB on a node holding
// 5,000 idle connections in teams of 100.
func (v *views) readSnapshot(team string, ps []*presence.Presence, reader *client, bystanders func() []*client) {
	v.mu.Lock()
	defer v.mu.Unlock()
	m := v.teamLocked(team)
	var listed []*client
	done := false
	once := func() []*client {
		if !done {
			listed, done = bystanders(), true
		}
		return listed
	}
	for _, p := range ps {
		readLocked(m, *p, reader, true, once)
	}
}

// readBy is read given to each of readers (a joiner's connections, each
// sent the state): who holds what stays known, where a nil reader would make
// every member of a mixed view take the next resync's copy. No readers is a
// nil reader.
func (v *views) readBy(team string, p presence.Presence, readers []*client, others bool) {
	if len(readers) == 0 {
		v.read(team, p, nil, others)
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	m := v.teamLocked(team)
	for _, c := range readers {
		readLocked(m, p, c, others, nil)
	}
}

// readLocked records reader's read of p. others: the team may have other
// members; bystanders, when known, lists their connections (readSnapshot).
func readLocked(m map[string]view, p presence.Presence, reader *client, others bool, bystanders func() []*client) {
	look := p.Look()
	cur, ok := m[p.UserID]
	forgot := ok && forgotten(p.Version, look, cur.look)
	if forgot {
		look.LastSeen = cur.look.LastSeen
	}
	if !ok {
		nv := view{version: p.Version, look: look, since: msOf(p.Since)}
		if others && p.State != presence.Offline {
			// Members already there hold nothing of the subject: offline.
			// Those indexed later read after this read, and note their
			// own.
			mine := held{version: p.Version, look: look}
			var by []*client
			named := reader != nil && bystanders != nil
			if named {
				by = bystanders()
			}
			if named && len(by) <= maxOdds {
				nv.odd = &odds{base: mine}
				for _, b := range by {
					// The subject's own connections are never sent the
					// subject, and never note it: named, they would
					// keep the view mixed.
					if b.user != p.UserID {
						nv.odd.hold(b, held{})
					}
				}
				nv.odd = nv.odd.settled(look)
			} else {
				// Too many to name (or none known): as if every other
				// member held nothing, the reader its read.
				nv.odd = &odds{}
				nv.odd.hold(reader, mine)
			}
		}
		m[p.UserID] = nv
		return
	}
	if same(look, cur.look) && cur.odd == nil {
		if p.Version > cur.version {
			cur.version, cur.since = p.Version, msOf(p.Since)
		}
		m[p.UserID] = cur
		return
	}
	o := cur.odd
	if o == nil {
		o = &odds{base: held{version: cur.version, look: cur.look}}
	}
	// A read older than the view: a change routed since may have reached
	// the reader (folded into its snapshot), or not.
	o.hold(reader, held{version: p.Version, look: look, unknown: p.Version < cur.version && !forgot})
	if p.Version > cur.version {
		cur.version, cur.look, cur.since = p.Version, look, msOf(p.Since)
	}
	cur.odd = o.settled(cur.look)
	m[p.UserID] = cur
}

// forgotten reports whether a read at version of look is of a subject the
// store holds nothing of (its keys lost with the data, or forgotten: offline
// at version 0, no last seen) whom members hold offline (held): only the
// last seen differs, and it is the store that lost it, not news (chaos seed
// 681366401: such a read made a view unsure of what its members held, and
// the next resync sent every member the offline again). resync judges the
// store's truth so too.
func forgotten(version uint64, look, held presence.Look) bool {
	return version == 0 && look.State == presence.Offline && held.State == presence.Offline
}

// lacking records that reader holds nothing of the subjects team's view
// holds but its snapshot (given, by user; self aside) left out: Redis lost
// a membership the view still has, and the reader connected before it was
// written back. The view would otherwise take the join that writes it back
// for no news to the reader.
func (v *views) lacking(team string, given map[string]*presence.Presence, queued map[string]held, reader *client, self string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for subject, cur := range v.byTeam[team] {
		if _, ok := given[subject]; ok || subject == self {
			continue
		}
		if _, ok := queued[subject]; ok {
			continue // queuedTo
		}
		if cur.look.State == presence.Offline && cur.odd == nil {
			continue // nothing is what an offline looks like
		}
		o := cur.odd
		if o == nil {
			o = &odds{base: held{version: cur.version, look: cur.look}}
		}
		o.hold(reader, held{})
		cur.odd = o
		v.byTeam[team][subject] = cur
	}
}

// queuedTo records that reader holds what was queued to it (queued) newer
// than its read (given): a snapshot sent folds it in. A join's push can
// come before the snapshot is noted (found in review: recorded as holding
// nothing, the reader was not sent the subject's offline, a ghost).
func (v *views) queuedTo(team string, queued map[string]held, given map[string]*presence.Presence, reader *client) {
	if len(queued) == 0 {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	m := v.byTeam[team]
	for subject, hd := range queued {
		cur, ok := m[subject]
		if p, read := given[subject]; !ok || (read && p.Version >= hd.version) {
			continue // the read is what the snapshot shows, and is recorded
		}
		if cur.odd == nil && hd.version == cur.version && same(hd.look, cur.look) {
			continue // it holds what every member does
		}
		o := cur.odd
		if o == nil {
			o = &odds{base: held{version: cur.version, look: cur.look}}
		}
		hd.unknown = hd.version < cur.version // a change routed since may have reached it too
		o.hold(reader, hd)
		cur.odd = o.settled(cur.look)
		m[subject] = cur
	}
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
		nv := view{version: src.version, look: src.look, since: src.since}
		if src.odd != nil || (others && src.look.State != presence.Offline) {
			nv.odd = unsure()
		}
		m[subject] = nv
		return
	}
	look := src.look
	if forgotten(src.version, look, cur.look) {
		look.LastSeen = cur.look.LastSeen
	}
	if src.odd != nil || cur.odd != nil || !same(look, cur.look) {
		cur.odd = unsure() // the joiner's connections hold what from's members do
	}
	if src.version > cur.version {
		cur.version, cur.look, cur.since = src.version, src.look, src.since
	}
	m[subject] = cur
}

// lackers is which of conns (a user's connections, members of team) team's
// view says hold nothing of subject: all of them when it has no entry (its
// members were not shown subject), else the noted ones its odds name as
// holding nothing (a snapshot that lacked subject). Unknown odds name
// nobody: what each holds is not known, and most hold the view's state.
func (v *views) lackers(team, subject string, conns []*client) (all bool, some []*client) {
	v.mu.Lock()
	defer v.mu.Unlock()
	cur, ok := v.byTeam[team][subject]
	switch {
	case !ok:
		return true, nil
	case cur.odd == nil || cur.odd.all || cur.look.State == presence.Offline:
		return false, nil // nothing is what an offline looks like
	}
	for _, c := range conns {
		if !c.noted.Load() {
			continue // its snapshot is not sent yet: no news to it
		}
		h, ok := cur.odd.except[c]
		if !ok {
			h = cur.odd.base
		}
		if h == (held{}) {
			some = append(some, c)
		}
	}
	return false, some
}

// gone drops c, a connection closed before its snapshot was noted, from the
// odds of teams' views that name it (a crowd's first read named it as
// holding nothing), settling them: it holds nothing any more, and would
// keep them mixed, and itself in memory, until each subject's next change.
func (v *views) gone(teams []string, c *client) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, t := range teams {
		m := v.byTeam[t]
		for subject, cur := range m {
			if cur.odd == nil || cur.odd.all {
				continue
			}
			if _, ok := cur.odd.except[c]; !ok {
				continue
			}
			delete(cur.odd.except, c)
			cur.odd = cur.odd.settled(cur.look)
			m[subject] = cur
		}
	}
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
// team's local members hold, returns the changes to send them, each with
// whom of them it is for, and makes the truth what they hold. floor(subject)
// is above every version published before the store asked for the resync:
// a view newer than it came from a change after that, which the read may
// not show, so it is left alone; a truth older than the view means the
// store lost data, and the truth is sent at the floor so that it overrides
// what viewers hold.
func (v *views) resync(team string, truth []presence.Presence, floor func(string) uint64) []resyncChange {
	v.mu.Lock()
	defer v.mu.Unlock()
	old := v.byTeam[team]
	if old == nil {
		return nil // the team's last local member left meanwhile
	}
	m := make(map[string]view, len(truth))
	var out []resyncChange
	send := func(t presence.Presence, v uint64, r reach) {
		if r.any() {
			out = append(out, resyncChange{t.ChangeAt(v, time.Time{}), r})
		}
	}
	for _, t := range truth {
		cur, ok := old[t.UserID]
		f := floor(t.UserID)
		look := t.Look()
		// Offline at version 0 is a user the store holds nothing of (its
		// keys lost with the data, or forgotten): where viewers hold them
		// offline, only the last seen differs, and it is the store that
		// forgot it, not news to send.
		if ok && forgotten(t.Version, look, cur.look) {
			look.LastSeen = cur.look.LastSeen
		}
		switch {
		case ok && cur.version > f:
			m[t.UserID] = cur // newer than this resync: the live path has it
			continue
		case !ok:
			if t.State != presence.Offline {
				send(t, t.Version, reach{all: true})
			}
		case t.Version >= cur.version && cur.odd != nil:
			send(t, t.Version, reachOf(cur.odd, look))
		case t.Version >= cur.version:
			send(t, t.Version, reach{all: !same(cur.look, look)})
		case cur.odd != nil || !same(cur.look, look): // the store lost what they hold
			t.Version = f
			if cur.odd != nil {
				send(t, f, reachOf(cur.odd, look))
			} else {
				send(t, f, reach{all: true})
			}
		default: // they hold it already: the view keeps what they hold
			t.Version, t.Since, look = cur.version, msTime(cur.since), cur.look
		}
		// A change above the floor was written after the store asked for
		// this resync: its live copy is still to come, through every team
		// of the subject, and must not be taken for a second copy where a
		// team read before the write still holds the older state (chaos
		// seed 618395093: lost).
		routed := cur.routed
		if t.Version <= f {
			routed = max(routed, t.Version)
		}
		m[t.UserID] = view{version: t.Version, look: look, since: msOf(t.Since), routed: routed}
	}
	// Subjects no longer members are not carried over: nothing more is sent
	// between users who no longer share the team.
	v.byTeam[team] = m
	return out
}

// resyncChange is a change a resync sends, and to whom of the team's members.
type resyncChange struct {
	presence.Change
	to reach
}

// unsure records that team's members may now hold of subject something
// other than its odds say (a push the view did not see).
func (v *views) unsure(team, subject string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.unsureLocked(team, subject)
}

// unsureReach is unsure, returning to whom of team's members a push of the
// view's current state goes first: those whose hold differs from it (a
// connection whose snapshot read it holds it already).
// placed is the odds it leaves in the view, for pushed.
func (v *views) unsureReach(team, subject string) (r reach, placed *odds) {
	v.mu.Lock()
	defer v.mu.Unlock()
	cur, ok := v.byTeam[team][subject]
	if !ok || cur.odd == nil {
		return reach{}, nil // every member holds it
	}
	r = reachOf(cur.odd, cur.look) // detached below: the view gets new odds
	v.unsureLocked(team, subject)
	return r, v.byTeam[team][subject].odd
}

// pushed records that the view's state was pushed to every member of team
// its odds named as holding something else (unsureReach), but those kept
// (skipped: they hold what another team showed them): the others hold it
// now. Without it the view stays unsure, and the next resync sends every
// member the state they hold (chaos seed 618395093). The caller holds h.mu
// for writing from unsureReach on, so nothing routes or reads meanwhile;
// placed still guards the view against a change having replaced its odds.
func (v *views) pushed(team, subject string, placed *odds, kept map[*client]held) {
	v.mu.Lock()
	defer v.mu.Unlock()
	cur, ok := v.byTeam[team][subject]
	if !ok || placed == nil || cur.odd != placed {
		return
	}
	o := &odds{base: held{version: cur.version, look: cur.look}}
	for c, hd := range kept {
		o.hold(c, hd)
	}
	cur.odd = o.settled(cur.look)
	v.byTeam[team][subject] = cur
}

// heldBy is what team's view says c holds of subject, if it knows.
func (v *views) heldBy(team, subject string, c *client) (held, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	cur, ok := v.byTeam[team][subject]
	switch {
	case !ok:
		return held{}, false
	case cur.odd == nil:
		return held{version: cur.version, look: cur.look}, true
	case cur.odd.all || !c.noted.Load():
		return held{}, false
	}
	hd, ok := cur.odd.except[c]
	if !ok {
		hd = cur.odd.base
	}
	return hd, !hd.unknown
}

func (v *views) unsureLocked(team, subject string) {
	if cur, ok := v.byTeam[team][subject]; ok && cur.odd != nil {
		cur.odd = unsure()
		v.byTeam[team][subject] = cur
	}
}

func (v *views) teamLocked(team string) map[string]view {
	m := v.byTeam[team]
	if m == nil {
		m = make(map[string]view)
		v.byTeam[team] = m
	}
	return m
}
