package server

import (
	"cmp"
	"hash/maphash"
	"slices"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
)

// recentWindow is how long a change may travel from the node that
// published it to this one (a slow network, a publish retried after a
// timeout) and still be one that a snapshot already showed.
const recentWindow = 10 * time.Second

// recentEntry is a snapshot's version of a subject, the subject named by
// its hash: one allocation of 16 bytes per entry, where a map of strings
// cost ~3.5 KB per connection and, freed 10 s after a mass connect, left
// its small objects' spans half empty for good (Redis nodes: 4.1 KiB of
// RSS per idle connection after a quiet minute, 2.6 without the entries).
// A change is taken for the snapshot's only if its subject's 64-bit hash
// equals an entry's and its version is not newer: two kept entries with
// one hash drop the whole list (noteRecentLocked), so only a subject
// without an entry (outside the snapshot, or in it with an older version)
// can be mistaken, at odds of one in 2^64 per entry.
type recentEntry struct {
	subject uint64 // subjectHash
	version uint64 // 0 once spent
}

var recentSeed = maphash.MakeSeed()

// subjectHash is a variable so that a test can make two subjects collide.
var subjectHash = func(user string) uint64 { return maphash.String(recentSeed, user) }

// noteRecentLocked keeps the entries of the snapshot sent whose versions
// are recent (a shared store's versions are Redis's clock in microseconds;
// the memory store's are counters, never recent, and it emits in order).
func (c *client) noteRecentLocked(users []presence.Presence, frame protocol.Snapshot) {
	now := c.srv.cfg.Now()
	cutoff := uint64(now.Add(-recentWindow).UnixMicro())
	c.recent = nil
	// Counted first, so the list is made at its size.
	n := 0
	for _, u := range frame.Users {
		if u.Version >= cutoff {
			n++
		}
	}
	for _, p := range users {
		if p.State == presence.Offline && p.Version >= cutoff {
			n++
		}
	}
	if n == 0 || n > 2*maxRecent {
		return // more than maxRecent, even if every subject came twice
	}
	recent := make([]recentEntry, 0, n)
	for _, u := range frame.Users {
		if u.Version >= cutoff {
			recent = append(recent, recentEntry{subjectHash(u.UserID), u.Version})
		}
	}
	for _, p := range users {
		if p.State == presence.Offline && p.Version >= cutoff {
			// Left out of the frame, but known.
			recent = append(recent, recentEntry{subjectHash(p.UserID), p.Version})
		}
	}
	slices.SortFunc(recent, func(a, b recentEntry) int { return cmp.Compare(a.subject, b.subject) })
	out := recent[:0]
	for _, e := range recent {
		if k := len(out) - 1; k >= 0 && out[k].subject == e.subject {
			// A subject both read and folded in from a pending change, or
			// two subjects with one hash: then keep none (resends are
			// harmless).
			if !oneSubject(e.subject, users, frame) {
				return
			}
			out[k].version = max(out[k].version, e.version)
			continue
		}
		out = append(out, e)
	}
	if len(out) > maxRecent {
		// After a data loss every version is recent: an idle connection
		// would hold a copy of its whole snapshot until its next change.
		// Resends are then possible (clients drop them); memory is not.
		return
	}
	c.recent = out
	c.recentLive = uint16(len(out))
	c.recentUntil = now.Add(recentWindow).UnixNano()
}

// oneSubject reports whether every subject of the snapshot with hash h is
// the same one.
func oneSubject(h uint64, users []presence.Presence, frame protocol.Snapshot) bool {
	var seen string
	found := false
	same := func(user string) bool {
		if subjectHash(user) != h {
			return true
		}
		if !found {
			seen, found = user, true
		}
		return user == seen
	}
	for _, u := range frame.Users {
		if !same(u.UserID) {
			return false
		}
	}
	for _, p := range users {
		if !same(p.UserID) {
			return false
		}
	}
	return true
}

// dropStaleRecent frees the snapshot's recent entries once their window is
// over, and returns how long until it is when they are kept (0: none
// kept). inSnapshotLocked drops them at the next change, but an idle
// connection may get none for hours: after a mass connect, where every
// teammate is recent, each would keep a copy of most of its snapshot.
func (c *client) dropStaleRecent() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.recent == nil {
		return 0
	}
	left := time.Duration(c.recentUntil - c.srv.cfg.Now().UnixNano())
	if left < 0 {
		c.recent = nil
		return 0
	}
	return left + 1 // past recentUntil, not at it
}

// maxRecent bounds the snapshot entries a connection keeps (noteRecentLocked).
const maxRecent = 256

// inSnapshotLocked reports a change the snapshot already gave: not newer
// than its recent entry for the subject. Past the window, the entries go.
func (c *client) inSnapshotLocked(ch protocol.Change) bool {
	if c.srv.cfg.Now().UnixNano() > c.recentUntil {
		c.recent = nil
		return false
	}
	h := subjectHash(ch.UserID)
	i, ok := slices.BinarySearchFunc(c.recent, h, func(e recentEntry, h uint64) int { return cmp.Compare(e.subject, h) })
	if !ok || c.recent[i].version == 0 {
		return false
	}
	if ch.Version <= c.recent[i].version {
		return true
	}
	c.recent[i].version = 0 // newer than the snapshot: the entry is spent
	if c.recentLive--; c.recentLive == 0 {
		c.recent = nil
	}
	return false
}
