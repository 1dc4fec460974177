package pusher

import "strings"

// Kind is the kind of a channel, given by its name's prefix.
type Kind int

// Kinds of channel.
const (
	Public    Kind = iota
	Private        // "private-"
	Presence       // "presence-"
	Encrypted      // "private-encrypted-"; a Private channel whose events the server cannot read
)

// Channel name prefixes.
const (
	PrefixPrivate   = "private-"
	PrefixPresence  = "presence-"
	PrefixEncrypted = "private-encrypted-"
)

// MaxChannelLen is the longest channel name, prefix included, that Pusher accepts.
const MaxChannelLen = 164

// MaxEventNameLen is the longest event name Pusher accepts.
const MaxEventNameLen = 200

// PrefixClientEvent starts the name of every event a client may send to a channel.
const PrefixClientEvent = "client-"

// KindOf returns the kind of channel named name. It does not check the name.
func KindOf(channel string) Kind {
	switch {
	case strings.HasPrefix(channel, PrefixEncrypted):
		return Encrypted
	case strings.HasPrefix(channel, PrefixPrivate):
		return Private
	case strings.HasPrefix(channel, PrefixPresence):
		return Presence
	}
	return Public
}

// ValidChannel reports whether name may be subscribed to: 1 to MaxChannelLen
// bytes of letters, digits and _ - = @ , . ; with something after a private-,
// private-encrypted- or presence- prefix. A "#server-to-user-" channel is
// never valid here: '#' is not in the set, and such channels are the server's.
func ValidChannel(name string) bool {
	if len(name) == 0 || len(name) > MaxChannelLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		if !channelByte(name[i]) {
			return false
		}
	}
	switch KindOf(name) {
	case Encrypted:
		return len(name) > len(PrefixEncrypted)
	case Private:
		return len(name) > len(PrefixPrivate)
	case Presence:
		return len(name) > len(PrefixPresence)
	}
	return true
}

func channelByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("_-=@,.;", c) >= 0
}

// ValidClientEvent reports whether name may be sent by a client: it starts
// with "client-" and is at most MaxEventNameLen bytes.
func ValidClientEvent(name string) bool {
	return strings.HasPrefix(name, PrefixClientEvent) && len(name) <= MaxEventNameLen
}

// PresenceTeam returns the team a presence channel stands for:
// "presence-eng" is team "eng". ok is false for any name that is not a valid
// presence channel.
func PresenceTeam(channel string) (team string, ok bool) {
	if KindOf(channel) != Presence || !ValidChannel(channel) {
		return "", false
	}
	return channel[len(PrefixPresence):], true
}
