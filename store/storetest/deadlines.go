package storetest

import (
	"testing"
	"time"

	"github.com/greendot/greendot/presence"
)

// testStatusExpiryBeforeGraceEnd: a user's dnd status ends while they are
// in grace, and the grace ends after it, both before the next sweep: what
// is published follows the clock, dnd → online (the status over, the user
// still in grace) → offline, however the store takes its deadlines.
func testStatusExpiryBeforeGraceEnd(t *testing.T, h *harness) {
	h.connect("c1", "bob", "web")
	h.expectHistory(time.Second, "bob=online")
	h.disconnect("c1")
	graceEnd := time.Now().Add(Grace)
	// The status ends half way through the grace (on the clock's ms).
	until := time.UnixMilli(time.Now().Add(Grace / 2).UnixMilli())
	h.setUserStatus("bob", presence.Status{Mode: presence.ModeDND, ExpiresAt: until})
	h.expectHistory(time.Second, "bob=online", "bob=dnd")
	for time.Now().Before(graceEnd.Add(50 * time.Millisecond)) {
		time.Sleep(10 * time.Millisecond) // both deadlines pass with no sweep
	}
	h.sweepFor(100 * time.Millisecond)
	h.expectHistory(time.Second, "bob=online", "bob=dnd", "bob=online", "bob=offline")
}
