package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/greendot/greendot/protocol"
)

// UserStatus is the user's own status (DESIGN.md Part 1b, "Status"): it
// applies to every device of the user, on every node, and outlives
// connections until replaced or ExpiresAt passes.
type UserStatus struct {
	// Mode is protocol.ModeAuto, ModeDND or ModeInvisible; "" reads as auto.
	Mode      string
	Text      string    // at most 100 characters
	Emoji     string    // at most 32 bytes
	ExpiresAt time.Time // zero: no expiry; else in the future
	// Version is the server's version of the status (my_status); 0 in a
	// status the client sends.
	Version uint64
}

// SetUserStatus sets the user's status, replacing the previous one whole,
// on every device: dnd, invisible, a text and emoji with an expiry. It
// returns once the frame is written; every connection of the user, this
// one included, then learns the result (MyStatus, Options.OnMyStatus). The
// server refuses a bad status (unknown mode, text over 100 characters, an
// expiry in the past, control characters) with an error frame, logged, and
// changes nothing; the checks here catch the obvious ones first. Not
// connected: ErrDisconnected (a status, unlike the device status, is the
// server's to keep; it is not re-sent).
func (c *Client) SetUserStatus(ctx context.Context, st UserStatus) error {
	if st.Mode == "" {
		st.Mode = protocol.ModeAuto
	}
	if !protocol.ValidMode(st.Mode) {
		return fmt.Errorf("client: status mode must be %q, %q or %q", protocol.ModeAuto, protocol.ModeDND, protocol.ModeInvisible)
	}
	if !st.ExpiresAt.IsZero() && !st.ExpiresAt.After(time.Now()) {
		return errors.New("client: status ExpiresAt must be in the future")
	}
	frame := protocol.SetStatus{Type: protocol.TypeSetStatus, Mode: st.Mode, Text: st.Text, Emoji: st.Emoji}
	if !st.ExpiresAt.IsZero() {
		ms := st.ExpiresAt.UnixMilli()
		frame.ExpiresAt = &ms
	}
	c.mu.Lock()
	if c.frozen {
		c.mu.Unlock()
		return ErrFrozen
	}
	s := c.sess
	c.mu.Unlock()
	if c.ctx.Err() != nil {
		return ErrClosed
	}
	if s == nil {
		return ErrDisconnected
	}
	return s.send(ctx, protocol.TypeSetStatus, frame)
}

// MyStatus is the user's status as the server last told this client
// (my_status); ok is false until it has, which it does right after welcome
// only when the status is not the default.
func (c *Client) MyStatus() (st UserStatus, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.myStatus, c.myStatus.Version != 0
}

// applyMyStatus records a my_status frame unless it is older than the one
// held, and tells Options.OnMyStatus.
func (c *Client) applyMyStatus(f protocol.MyStatus) {
	st := UserStatus{Mode: f.Mode, Text: f.Text, Emoji: f.Emoji, Version: f.Version}
	if f.ExpiresAt != nil {
		st.ExpiresAt = time.UnixMilli(*f.ExpiresAt)
	}
	c.mu.Lock()
	if st.Version < c.myStatus.Version {
		c.mu.Unlock()
		return
	}
	c.myStatus = st
	c.mu.Unlock()
	if c.opts.OnMyStatus != nil {
		c.opts.OnMyStatus(st)
	}
}

func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}
