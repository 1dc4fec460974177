package presence

import (
	"errors"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"
)

// Mode is the user-level status mode (DESIGN.md Part 1b, "Status"): it
// applies to every device of the user, on every node.
type Mode uint8

const (
	// ModeAuto: the state is derived from the devices alone.
	ModeAuto Mode = iota
	// ModeDND: a user who is online or away is shown as DND.
	ModeDND
	// ModeInvisible: the user is shown offline to every viewer.
	ModeInvisible
)

func (m Mode) String() string {
	switch m {
	case ModeDND:
		return "dnd"
	case ModeInvisible:
		return "invisible"
	}
	return "auto"
}

// ParseMode is the inverse of String.
func ParseMode(s string) (Mode, bool) {
	switch s {
	case "auto":
		return ModeAuto, true
	case "dnd":
		return ModeDND, true
	case "invisible":
		return ModeInvisible, true
	}
	return ModeAuto, false
}

// Status is a user's status setting: it outlives connections, until it is
// replaced or ExpiresAt passes (then it is the zero Status, mode auto).
type Status struct {
	Mode      Mode
	Text      string
	Emoji     string
	ExpiresAt time.Time // zero: no expiry
}

// IsZero reports the default status: mode auto, no text, no emoji.
func (s Status) IsZero() bool {
	return s.Mode == ModeAuto && s.Text == "" && s.Emoji == "" && s.ExpiresAt.IsZero()
}

// Equal compares two statuses at millisecond precision, the precision of
// the wire and of the Redis store.
func (s Status) Equal(o Status) bool {
	return s.Mode == o.Mode && s.Text == o.Text && s.Emoji == o.Emoji &&
		s.ExpiresAt.UnixMilli() == o.ExpiresAt.UnixMilli() && s.ExpiresAt.IsZero() == o.ExpiresAt.IsZero()
}

// Limits of a status (the contract's; MaxStatusAhead is ours).
const (
	MaxTextChars   = 100
	MaxEmojiBytes  = 32
	MaxStatusAhead = 366 * 24 * time.Hour // an expiry further ahead is refused
)

// ErrBadStatus is a status that breaks the contract's rules; the wrapped
// message is safe to show to the client.
var ErrBadStatus = errors.New("bad status")

// Validate checks a status against the contract at now: text of at most
// 100 characters and emoji of at most 32 bytes, both printable UTF-8, and
// an expiry in the future (and at most MaxStatusAhead away) or none.
func (s Status) Validate(now time.Time) error {
	if s.Mode > ModeInvisible {
		return fmt.Errorf("%w: mode must be auto, dnd or invisible", ErrBadStatus)
	}
	if utf8.RuneCountInString(s.Text) > MaxTextChars {
		return fmt.Errorf("%w: text must be at most %d characters", ErrBadStatus, MaxTextChars)
	}
	if !printable(s.Text, false) {
		return fmt.Errorf("%w: text must be printable UTF-8, without control or format characters", ErrBadStatus)
	}
	if len(s.Emoji) > MaxEmojiBytes {
		return fmt.Errorf("%w: emoji must be at most %d bytes", ErrBadStatus, MaxEmojiBytes)
	}
	if !printable(s.Emoji, true) {
		return fmt.Errorf("%w: emoji must be printable UTF-8, without control characters", ErrBadStatus)
	}
	if !s.ExpiresAt.IsZero() {
		if !s.ExpiresAt.After(now) {
			return fmt.Errorf("%w: expires_at must be in the future", ErrBadStatus)
		}
		if s.ExpiresAt.Sub(now) > MaxStatusAhead {
			return fmt.Errorf("%w: expires_at must be at most 366 days ahead", ErrBadStatus)
		}
	}
	return nil
}

// printable admits letters, marks, numbers, punctuation, symbols and
// spaces, and refuses control and format characters (bidi overrides, zero
// width spaces), which could disguise a text. An emoji may also hold the
// format characters emoji sequences are made of: the zero width joiner
// (👩‍💻) and tag characters (subdivision flags).
func printable(s string, emoji bool) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsGraphic(r) {
			continue
		}
		if emoji && (r == '\u200d' || (r >= 0xE0020 && r <= 0xE007F)) {
			continue
		}
		return false
	}
	return true
}

// StatusChange is a user's status as it changed, for the user's own
// connections (my_status): Version is the user's presence version at the
// change.
type StatusChange struct {
	UserID  string
	Status  Status
	Version uint64
}

// Look is what viewers see of a user, beside the version: the fields whose
// every difference is a change. Comparable.
type Look struct {
	State     State
	Text      string
	Emoji     string
	ExpiresAt int64 // ms; 0 none
	LastSeen  int64 // ms, offline only; 0 otherwise
}

// Look is what the change shows.
func (c Change) Look() Look {
	return Look{State: c.State, Text: c.Text, Emoji: c.Emoji, ExpiresAt: ms(c.ExpiresAt), LastSeen: ms(c.LastSeen)}
}

// Look is what viewers see of p (p as the store reports it).
func (p Presence) Look() Look {
	v := p.Visible()
	l := Look{State: v.State, Text: v.Status.Text, Emoji: v.Status.Emoji}
	if l.Text != "" || l.Emoji != "" || l.State == DND {
		l.ExpiresAt = ms(v.Status.ExpiresAt) // as showLocked: beside what it ends
	}
	if v.State == Offline {
		l.LastSeen = ms(v.LastSeen)
	}
	return l
}

// Visible is p as viewers may see it: while the user is invisible, no
// connection, device, text or emoji, and last seen when they went
// invisible; when offline, the last seen viewers were told. The mode
// itself is never shown (dnd is in State).
func (p Presence) Visible() Presence {
	v := p
	v.Actual, v.ActualSince = p.State, p.Since
	v.Status.Mode = ModeAuto
	if p.State == Offline {
		v.LastSeen = p.ShownLastSeen
	}
	if p.Status.Mode == ModeInvisible {
		v.ConnectionCount, v.Devices = 0, nil
		v.Status = Status{}
	}
	return v
}

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// ChangeAt is p as a change at version v, made at: a resync or a catch-up
// sends what viewers see of p as a change.
func (p Presence) ChangeAt(v uint64, at time.Time) Change {
	l := p.Look()
	c := Change{UserID: p.UserID, State: l.State, Version: v, At: at, Text: l.Text, Emoji: l.Emoji, Since: p.Since}
	if l.ExpiresAt != 0 {
		c.ExpiresAt = time.UnixMilli(l.ExpiresAt)
	}
	if l.LastSeen != 0 {
		c.LastSeen = time.UnixMilli(l.LastSeen)
	}
	return c
}
