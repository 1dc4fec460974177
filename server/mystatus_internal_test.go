package server

import (
	"testing"

	"github.com/greendot/greendot/protocol"
)

// A connection keeps, after welcome, only the version of the newest
// my_status it was given; before welcome, the newest frame itself.
func TestWelcomeStatusIsTheNewestOfTheReadAndEvents(t *testing.T) {
	frame := func(v uint64, text string) protocol.MyStatus {
		return protocol.MyStatus{Type: protocol.TypeMyStatus, Mode: protocol.ModeAuto, Text: text, Version: v}
	}
	for _, tc := range []struct {
		name     string
		early    []protocol.MyStatus // events before welcome
		read     protocol.MyStatus
		want     protocol.MyStatus
		wantSend bool
	}{
		{"read only, default", nil, frame(3, ""), frame(3, ""), false},
		{"read only, text", nil, frame(3, "lunch"), frame(3, "lunch"), true},
		{"an event newer than the read", []protocol.MyStatus{frame(5, "away"), frame(4, "older")}, frame(3, "lunch"), frame(5, "away"), true},
		{"the read newer than an event", []protocol.MyStatus{frame(5, "away")}, frame(7, ""), frame(7, ""), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &client{}
			c.closed.Store(true) // socketless: writes are no-ops
			for _, f := range tc.early {
				c.sendMyStatus(f)
			}
			c.welcomed = true
			got, send := c.takeWelcomeStatusLocked(tc.read)
			if got != tc.want || send != tc.wantSend {
				t.Fatalf("welcome status %+v (send %v), want %+v (send %v)", got, send, tc.want, tc.wantSend)
			}
			if c.earlyStatus != nil || !c.statusKnown || c.statusVersion != tc.want.Version {
				t.Fatalf("after welcome: early %v, known %v, version %d; want nil, true, %d", c.earlyStatus, c.statusKnown, c.statusVersion, tc.want.Version)
			}
			// After welcome an older frame is not news; a newer one is.
			c.sendMyStatus(frame(tc.want.Version, "same"))
			if c.statusVersion != tc.want.Version || c.earlyStatus != nil {
				t.Fatalf("an equal version moved the connection to %d", c.statusVersion)
			}
			c.sendMyStatus(frame(tc.want.Version+1, "newer"))
			if c.statusVersion != tc.want.Version+1 || c.earlyStatus != nil {
				t.Fatalf("a newer version left the connection at %d (early %v)", c.statusVersion, c.earlyStatus)
			}
		})
	}
}
