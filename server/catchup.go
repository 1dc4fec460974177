package server

import (
	"sync"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
)

// catchUps is a local user's membership catch-ups in flight: from a
// membership event of theirs to its reconcile on the worker
// (reconcileSubject). It exists only while one is queued, so an idle
// connection holds none of it; its entries are bounded by the changes that
// reached the user meanwhile.
//
// A catch-up sends the joiner the members they could not see before. What
// they could see is what they were sent, in the order of their events: the
// teams whose members they were given (indexed, and their own catch-up
// run) and those they left whose reconcile has not run yet. The store's
// list of their teams will not do: it may hold a team joined since, whose
// catch-up will take this one for the team that showed the members
// (finding 8 of docs/reliability-findings.md).
//
// Guarded by the hub's mu, but sent.
type catchUps struct {
	queued  int            // reconciles queued, not run yet
	joining map[string]int // teams joined whose catch-up has not run: their members were not sent
	leaving map[string]int // teams left whose reconcile has not run: their members were seen until then
	// sent: what was queued to the user's connections since: a catch-up
	// read before a change routed meanwhile is stale, and one at a version
	// sent already is a resend (finding 9: the memory store has no views to
	// tell).
	sent sentVersions
}

// sentVersions is the newest change of each subject queued to a user's
// connections. Routing notes it under the hub's read lock: its own lock.
type sentVersions struct {
	mu sync.Mutex
	m  map[string]held
}

// catchUpLocked counts a reconcile queued for lu's membership event of
// team (joined, or left while indexed under it: left); h.mu held.
func (lu *localUser) catchUpLocked(team string, joined, left bool) {
	f := lu.flight
	if f == nil {
		f = &catchUps{joining: make(map[string]int), leaving: make(map[string]int)}
		lu.flight = f
	}
	f.queued++
	switch {
	case joined:
		f.joining[team]++
	case left:
		f.leaving[team]++
	}
}

// caughtUpLocked is catchUpLocked's reconcile done; h.mu held.
func (lu *localUser) caughtUpLocked(team string, joined, left bool) {
	f := lu.flight
	if f == nil {
		return
	}
	dec := func(m map[string]int) {
		if m[team]--; m[team] <= 0 {
			delete(m, team)
		}
	}
	switch {
	case joined:
		dec(f.joining)
	case left:
		dec(f.leaving)
	}
	if f.queued--; f.queued <= 0 {
		lu.flight = nil
	}
}

// toldLocked is the small teams other than team whose members lu was given
// (see catchUps); h.mu held.
func (h *hub) toldLocked(lu *localUser, team string) map[string]struct{} {
	out := make(map[string]struct{}, len(lu.teams))
	for _, t := range lu.teams {
		if t == team || h.large[t] {
			continue
		}
		if f := lu.flight; f != nil && f.joining[t] > 0 {
			continue
		}
		out[t] = struct{}{}
	}
	if f := lu.flight; f != nil {
		for t := range f.leaving {
			if t != team {
				out[t] = struct{}{}
			}
		}
	}
	return out
}

// note records that ch was queued to the user's connections. Safe on nil
// (no catch-up in flight).
func (f *catchUps) note(ch protocol.Change) {
	if f == nil {
		return
	}
	sv := &f.sent
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.m == nil {
		sv.m = make(map[string]held)
	}
	if cur, ok := sv.m[ch.UserID]; !ok || ch.Version > cur.version {
		sv.m[ch.UserID] = held{version: ch.Version, look: lookOf(ch)}
	}
}

// holds reports that the user's connections were queued subject at version
// or newer since the catch-up began: sending version again is a resend, or
// takes them back. Safe on nil.
func (f *catchUps) holds(subject string, version uint64) bool {
	hd, ok := f.newest(subject)
	return ok && hd.version >= version
}

// newest is the newest change of subject queued since the catch-up began,
// if any. Safe on nil.
func (f *catchUps) newest(subject string) (held, bool) {
	if f == nil {
		return held{}, false
	}
	sv := &f.sent
	sv.mu.Lock()
	defer sv.mu.Unlock()
	hd, ok := sv.m[subject]
	return hd, ok
}

// forget is for subject hidden from one of the user's connections with a
// change of theirs still queued: the hide dropped it unsent (client.hide),
// so what was noted is no longer known to be held. Only then: with the
// memory store, which has no views, the note is all that stops a resend of
// what was written. Safe on nil.
func (f *catchUps) forget(subject string) {
	if f == nil {
		return
	}
	sv := &f.sent
	sv.mu.Lock()
	defer sv.mu.Unlock()
	delete(sv.m, subject)
}

// holdsLook reports that the newest change of subject queued to the user's
// connections since the catch-up began shows look: a newer version of the
// same look is routed to nobody, so it is no news to them either. Safe on
// nil.
func (f *catchUps) holdsLook(subject string, look presence.Look) bool {
	hd, ok := f.newest(subject)
	return ok && same(hd.look, look)
}
