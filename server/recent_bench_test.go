package server

import (
	"strconv"
	"testing"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
)

// BenchmarkSnapshotRecent is what a connect on Redis pays to remember its
// snapshot's recent versions (note: 99 team-mates, all recent, as in a mass
// connect), and what each change routed to it then pays to be checked
// against them (check: a late copy of a snapshot's change, dropped).
func BenchmarkSnapshotRecent(b *testing.B) {
	s := socketlessServer()
	now := time.Now()
	s.cfg.Now = func() time.Time { return now }
	v := uint64(now.Add(-time.Second).UnixMicro())
	users := make([]presence.Presence, 99)
	frame := protocol.Snapshot{Type: protocol.TypeSnapshot}
	for i := range users {
		users[i] = presence.Presence{UserID: "user-" + strconv.Itoa(i), State: presence.Online, Version: v}
		frame.Users = append(frame.Users, protocol.UserState{UserID: users[i].UserID, State: protocol.StateOnline, Version: v})
	}
	b.Run("note", func(b *testing.B) {
		c := &client{srv: s}
		b.ReportAllocs()
		for b.Loop() {
			c.recent = nil
			c.noteRecentLocked(users, frame)
		}
	})
	b.Run("check", func(b *testing.B) {
		c := &client{srv: s}
		c.noteRecentLocked(users, frame)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if !c.inSnapshotLocked(protocol.Change{UserID: users[i%len(users)].UserID, Version: v}) {
				b.Fatal("a snapshot's change taken for news")
			}
		}
	})
}
