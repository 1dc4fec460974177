package redisstore

import (
	"strings"
	"testing"
	"unsafe"

	"github.com/greendot/greendot/presence"
)

func TestParseShownReadsEveryForm(t *testing.T) {
	for _, tc := range []struct {
		sv   string
		ok   bool
		want presence.Presence
	}{
		{"", false, presence.Presence{}},
		{"1", false, presence.Presence{}},
		{"1:7", true, presence.Presence{State: presence.State(1), Version: 7}},           // before the look existed
		{"1:7:1000:2000", true, presence.Presence{State: presence.State(1), Version: 7}}, // too short for the look: state and version only
		{"0:9:1000:0:3000\n\n", true, presence.Presence{State: presence.State(0), Version: 9, Since: msTime(1000), ShownLastSeen: msTime(3000)}},
		{"2:8:1000:2000:0\nlunch\n🍔", true, presence.Presence{State: presence.State(2), Version: 8, Since: msTime(1000),
			Status: presence.Status{Text: "lunch", Emoji: "🍔", ExpiresAt: msTime(2000)}}},
		{"2:8:1000:2000:0:extra\nt\ne", true, presence.Presence{State: presence.State(2), Version: 8, Since: msTime(1000),
			Status: presence.Status{Text: "t", Emoji: "e", ExpiresAt: msTime(2000)}}},
	} {
		var got presence.Presence
		ok := parseShown(tc.sv, &got)
		if ok != tc.ok || ok && (got.State != tc.want.State || got.Version != tc.want.Version || !got.Since.Equal(tc.want.Since) ||
			!got.ShownLastSeen.Equal(tc.want.ShownLastSeen) || got.Status.Text != tc.want.Status.Text ||
			got.Status.Emoji != tc.want.Status.Emoji || !got.Status.ExpiresAt.Equal(tc.want.Status.ExpiresAt)) {
			t.Errorf("parseShown(%q) = %+v, %v; want %+v, %v", tc.sv, got, ok, tc.want, tc.ok)
		}
	}
}

// An empty status text or emoji read from a state copy points nowhere into
// it: views keep the looks they read, and a pointer into the reply would
// keep the whole reply alive with them.
func TestParseShownKeepsNoPointerIntoAnEmptyStatus(t *testing.T) {
	sv := strings.Clone("1:7:1000:0:3000\n\n") // a reply's string, on the heap
	var p presence.Presence
	if !parseShown(sv, &p) {
		t.Fatalf("parseShown(%q) failed", sv)
	}
	base := uintptr(unsafe.Pointer(unsafe.StringData(sv)))
	for name, s := range map[string]string{"text": p.Status.Text, "emoji": p.Status.Emoji} {
		if d := uintptr(unsafe.Pointer(unsafe.StringData(s))); d >= base && d <= base+uintptr(len(sv)) {
			t.Errorf("the empty %s points into the state copy (at +%d)", name, d-base)
		}
	}
}
