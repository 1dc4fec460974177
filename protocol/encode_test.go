package protocol_test

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/greendot/greendot/protocol"
)

// randomText draws strings that exercise Marshal's escaping: plain ASCII,
// the characters it escapes, control characters, non-ASCII, U+2028 and
// invalid UTF-8, and the empty string.
func randomText(r *rand.Rand) string {
	pieces := []string{"", "a", "Z9", "bob.smith_1-2", " ", `"`, `\`, "<", ">", "&", "\n", "\t", "\x00", "\x1f", "\x7f",
		"é", "日本", "🟢", "\u2028", "\u2029", "\xff", "\xc3", "/", "'", "%", "+", "{}", "[]", ":", ","}
	var s string
	for range r.IntN(6) {
		s += pieces[r.IntN(len(pieces))]
	}
	return s
}

func randomInt(r *rand.Rand) int64 {
	switch r.IntN(4) {
	case 0:
		return 0
	case 1:
		return -r.Int64()
	default:
		return r.Int64()
	}
}

func TestAppendIsWhatMarshalWrites(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 2000 {
		n := r.IntN(5)
		snap := protocol.Snapshot{Type: randomText(r)}
		pres := protocol.Presence{Type: randomText(r)}
		if n > 0 || i%2 == 0 { // nil and empty lists both occur
			snap.Users = []protocol.UserState{}
			pres.Changes = []protocol.Change{}
		}
		for range n {
			snap.Users = append(snap.Users, protocol.UserState{UserID: randomText(r), State: randomText(r),
				Version: r.Uint64() >> r.IntN(64), Text: randomText(r), Emoji: randomText(r),
				ExpiresAt: randomInt(r), Since: randomInt(r)})
			pres.Changes = append(pres.Changes, protocol.Change{UserID: randomText(r), State: randomText(r),
				Version: r.Uint64() >> r.IntN(64), At: randomInt(r), Text: randomText(r), Emoji: randomText(r),
				ExpiresAt: randomInt(r), Since: randomInt(r), LastSeen: randomInt(r)})
		}
		want, err := json.Marshal(snap)
		if err != nil {
			t.Fatal(err)
		}
		if got := protocol.AppendSnapshot([]byte("x"), snap); string(got[1:]) != string(want) || got[0] != 'x' {
			t.Fatalf("snapshot %+v:\nAppendSnapshot %s\nMarshal         %s", snap, got, want)
		}
		if want, err = json.Marshal(pres); err != nil {
			t.Fatal(err)
		}
		if got := protocol.AppendPresence(nil, pres); string(got) != string(want) {
			t.Fatalf("presence %+v:\nAppendPresence %s\nMarshal        %s", pres, got, want)
		}
	}
}

func TestSizesHoldPlainFrames(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	big := func() int64 { return -1 << 63 } // the longest int64
	for range 500 {
		snap := protocol.Snapshot{Type: protocol.TypeSnapshot}
		pres := protocol.Presence{Type: protocol.TypePresence}
		for range r.IntN(40) {
			id := "user-" + string(rune('a'+r.IntN(26)))
			snap.Users = append(snap.Users, protocol.UserState{UserID: id, State: protocol.StateOffline, Version: ^uint64(0),
				Text: "lunch", Emoji: "x", ExpiresAt: big(), Since: big()})
			pres.Changes = append(pres.Changes, protocol.Change{UserID: id, State: protocol.StateOffline, Version: ^uint64(0),
				At: big(), Text: "lunch", Emoji: "x", ExpiresAt: big(), Since: big(), LastSeen: big()})
		}
		if n, size := len(protocol.AppendSnapshot(nil, snap)), protocol.SnapshotSize(snap); n > size {
			t.Fatalf("snapshot of %d users: %d bytes, SnapshotSize %d", len(snap.Users), n, size)
		}
		if n, size := len(protocol.AppendPresence(nil, pres)), protocol.PresenceSize(pres); n > size {
			t.Fatalf("presence of %d changes: %d bytes, PresenceSize %d", len(pres.Changes), n, size)
		}
	}
}

// TestAppendKnowsEveryField: a field added to a frame's structs must be
// added to the encoders too. The randomized test above fills only the
// fields it names, so an omitempty field the encoders lack would pass it
// and be dropped from every frame.
func TestAppendKnowsEveryField(t *testing.T) {
	for _, c := range []struct {
		v    any
		tags []string
	}{
		{protocol.Snapshot{}, []string{"type", "users"}},
		{protocol.UserState{}, []string{"user_id", "state", "version", "text,omitempty", "emoji,omitempty",
			"expires_at,omitempty", "since,omitempty"}},
		{protocol.Presence{}, []string{"type", "changes"}},
		{protocol.Change{}, []string{"user_id", "state", "version", "at", "text,omitempty", "emoji,omitempty",
			"expires_at,omitempty", "since,omitempty", "last_seen,omitempty"}},
	} {
		typ := reflect.TypeOf(c.v)
		var tags []string
		for i := range typ.NumField() {
			tags = append(tags, typ.Field(i).Tag.Get("json"))
		}
		if !slices.Equal(tags, c.tags) {
			t.Errorf("%s's fields are %q; protocol/encode.go writes %q: teach AppendSnapshot/AppendPresence the change", typ, tags, c.tags)
		}
	}
}
