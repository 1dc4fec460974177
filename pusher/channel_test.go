package pusher

import (
	"strings"
	"testing"
)

func TestKindOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		want Kind
	}{
		{"orders", Public},
		{"private-foobar", Private},
		{"private-encrypted-foobar", Encrypted},
		{"presence-eng", Presence},
		{"privatefoo", Public},
		{"presence", Public},
		{"Private-x", Public}, // prefixes are case-sensitive
		{"", Public},
	} {
		if got := KindOf(tc.name); got != tc.want {
			t.Errorf("KindOf(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestValidChannel(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"foo-bar_1234@=,.;", true}, // Pusher's documented example
		{"a", true},
		{"private-foobar", true},
		{"presence-eng", true},
		{"private-encrypted-x", true},
		{"presence-chat.1", true}, // Laravel Echo's names
		{strings.Repeat("a", MaxChannelLen), true},
		{"presence-" + strings.Repeat("a", MaxChannelLen-len("presence-")), true},
		{strings.Repeat("a", MaxChannelLen+1), false},
		{"", false},
		{"private-", false},
		{"presence-", false},
		{"private-encrypted-", false},
		{"#server-to-user-42", false},
		{"a b", false},
		{"a:b", false}, // a colon would make auth strings ambiguous
		{"a/b", false},
		{"é", false},
		{"a\x00", false},
	} {
		if got := ValidChannel(tc.name); got != tc.ok {
			t.Errorf("ValidChannel(%q) = %v, want %v", tc.name, got, tc.ok)
		}
	}
}

func TestValidClientEvent(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"client-typing", true},
		{"client-" + strings.Repeat("x", MaxEventNameLen-len("client-")), true},
		{"client-" + strings.Repeat("x", MaxEventNameLen-len("client-")+1), false},
		{"typing", false},
		{"pusher:subscribe", false},
		{"Client-typing", false},
		{"", false},
	} {
		if got := ValidClientEvent(tc.name); got != tc.ok {
			t.Errorf("ValidClientEvent(%q) = %v, want %v", tc.name, got, tc.ok)
		}
	}
}

func TestPresenceTeam(t *testing.T) {
	for _, tc := range []struct {
		channel, team string
		ok            bool
	}{
		{"presence-eng", "eng", true},
		{"presence-chat.1", "chat.1", true},
		{"presence-", "", false},
		{"private-eng", "", false},
		{"eng", "", false},
		{"presence-a b", "", false},
	} {
		team, ok := PresenceTeam(tc.channel)
		if team != tc.team || ok != tc.ok {
			t.Errorf("PresenceTeam(%q) = %q, %v; want %q, %v", tc.channel, team, ok, tc.team, tc.ok)
		}
	}
}
