package protocol

import (
	"encoding/json"
	"strconv"
)

// AppendSnapshot appends f as json.Marshal encodes it, without reflection:
// every connect writes one, of a whole team. TestAppendIsWhatMarshalWrites
// holds the two equal.
func AppendSnapshot(dst []byte, f Snapshot) []byte {
	dst = append(dst, `{"type":`...)
	dst = appendString(dst, f.Type)
	dst = append(dst, `,"users":`...)
	if f.Users == nil {
		return append(dst, "null}"...)
	}
	dst = append(dst, '[')
	for i, u := range f.Users {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"user_id":`...)
		dst = appendString(dst, u.UserID)
		dst = append(dst, `,"state":`...)
		dst = appendString(dst, u.State)
		dst = append(dst, `,"version":`...)
		dst = strconv.AppendUint(dst, u.Version, 10)
		dst = appendStatus(dst, u.Text, u.Emoji, u.ExpiresAt, u.Since)
		dst = append(dst, '}')
	}
	return append(dst, "]}"...)
}

// AppendPresence appends f as json.Marshal encodes it, without reflection:
// fan-out writes one per viewer per batch.
func AppendPresence(dst []byte, f Presence) []byte {
	dst = append(dst, `{"type":`...)
	dst = appendString(dst, f.Type)
	dst = append(dst, `,"changes":`...)
	if f.Changes == nil {
		return append(dst, "null}"...)
	}
	dst = append(dst, '[')
	for i, c := range f.Changes {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"user_id":`...)
		dst = appendString(dst, c.UserID)
		dst = append(dst, `,"state":`...)
		dst = appendString(dst, c.State)
		dst = append(dst, `,"version":`...)
		dst = strconv.AppendUint(dst, c.Version, 10)
		dst = append(dst, `,"at":`...)
		dst = strconv.AppendInt(dst, c.At, 10)
		dst = appendStatus(dst, c.Text, c.Emoji, c.ExpiresAt, c.Since)
		if c.LastSeen != 0 {
			dst = append(dst, `,"last_seen":`...)
			dst = strconv.AppendInt(dst, c.LastSeen, 10)
		}
		dst = append(dst, '}')
	}
	return append(dst, "]}"...)
}

// appendStatus appends the omitempty fields UserState and Change share.
func appendStatus(dst []byte, text, emoji string, expiresAt, since int64) []byte {
	if text != "" {
		dst = append(dst, `,"text":`...)
		dst = appendString(dst, text)
	}
	if emoji != "" {
		dst = append(dst, `,"emoji":`...)
		dst = appendString(dst, emoji)
	}
	if expiresAt != 0 {
		dst = append(dst, `,"expires_at":`...)
		dst = strconv.AppendInt(dst, expiresAt, 10)
	}
	if since != 0 {
		dst = append(dst, `,"since":`...)
		dst = strconv.AppendInt(dst, since, 10)
	}
	return dst
}

// appendString appends s quoted as json.Marshal quotes it. Printable ASCII
// other than the characters Marshal escapes (quote, backslash, and <, >, &
// for HTML) is copied; any other string (non-ASCII, control characters,
// invalid UTF-8) is left to Marshal, so the rules stay Marshal's own.
func appendString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // a string: cannot fail
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

// SnapshotSize is the length of f encoded when none of its strings needs
// escaping, and a little more: the capacity for one allocation per frame.
func SnapshotSize(f Snapshot) int {
	n := 26 + len(f.Type)
	for _, u := range f.Users {
		n += 37 + uintLen(u.Version) + len(u.UserID) + len(u.State) + statusSize(u.Text, u.Emoji, u.ExpiresAt, u.Since)
	}
	return n
}

// PresenceSize is SnapshotSize for a Presence.
func PresenceSize(f Presence) int {
	n := 26 + len(f.Type)
	for _, c := range f.Changes {
		n += 64 + uintLen(c.Version) + len(c.UserID) + len(c.State) + statusSize(c.Text, c.Emoji, c.ExpiresAt, c.Since)
		if c.LastSeen != 0 {
			n += 33
		}
	}
	return n
}

func statusSize(text, emoji string, expiresAt, since int64) int {
	n := 0
	if text != "" {
		n += 10 + len(text)
	}
	if emoji != "" {
		n += 11 + len(emoji)
	}
	if expiresAt != 0 {
		n += 34
	}
	if since != 0 {
		n += 29
	}
	return n
}

// uintLen is the number of decimal digits of v.
func uintLen(v uint64) int {
	n := 1
	for ; v >= 10; v /= 10 {
		n++
	}
	return n
}
