package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/store"
)

// The user-level status (DESIGN.md Part 1b, "Status"): set_status frames,
// PUT and DELETE /v1/users/{user}/status, and my_status to the user's own
// connections. The rules (dnd, invisible, expiry) live in presence; the
// stores hold the status and publish what viewers see.

// statusOf turns a set_status frame (or the HTTP body) into a status,
// checked against the contract at now. The error is safe to show.
func statusOf(mode, text, emoji string, expiresAt *int64, now time.Time) (presence.Status, error) {
	m, ok := presence.ParseMode(mode)
	if !ok {
		return presence.Status{}, errors.New(`"mode" must be "auto", "dnd" or "invisible"`)
	}
	st := presence.Status{Mode: m, Text: text, Emoji: emoji}
	if expiresAt != nil {
		st.ExpiresAt = time.UnixMilli(*expiresAt)
	}
	if err := st.Validate(now); err != nil {
		return presence.Status{}, errors.New(statusProblem(err))
	}
	return st, nil
}

// statusProblem is the client-facing part of a status refusal.
func statusProblem(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, presence.ErrBadStatus.Error()+": "); i >= 0 {
		return msg[i+len(presence.ErrBadStatus.Error())+2:]
	}
	return "bad status"
}

// setUserStatus writes st through the store; errors are *httpError with
// the contract's code.
func (s *Server) setUserStatus(ctx context.Context, user string, st presence.Status) error {
	ss, ok := s.store.(store.StatusStore)
	if !ok {
		return &httpError{status: http.StatusNotImplemented, code: protocol.CodeUnavailable, message: "this store does not hold statuses"}
	}
	err := s.timed(store.OpUserStatus, func() error { return ss.SetUserStatus(ctx, user, st) })
	switch {
	case errors.Is(err, presence.ErrBadStatus):
		return badRequest(statusProblem(err))
	case err != nil:
		s.log.Warn("set user status", "err", err)
		return &httpError{status: http.StatusServiceUnavailable, code: protocol.CodeUnavailable, message: "store unavailable"}
	}
	return nil
}

// onSetStatus handles a set_status frame: the sender's user's status, on
// every device. Its own connections, this one included, learn the result
// from my_status; a refusal is an error frame and changes nothing.
func (s *Server) onSetStatus(c *client, f *protocol.SetStatus, now time.Time) {
	s.metrics.frames.WithLabelValues(protocol.TypeSetStatus).Inc()
	st, err := statusOf(f.Mode, f.Text, f.Emoji, f.ExpiresAt, now)
	if err != nil {
		s.metrics.framesRejected.WithLabelValues(reasonBadRequest).Inc()
		c.writeJSON(protocol.Error{Type: protocol.TypeError, Code: protocol.CodeBadRequest, Message: "set_status: " + err.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.setUserStatus(ctx, c.user, st); err != nil {
		var he *httpError
		code, msg := protocol.CodeUnavailable, "store unavailable"
		if errors.As(err, &he) {
			code, msg = he.code, he.message
		}
		c.writeJSON(protocol.Error{Type: protocol.TypeError, Code: code, Message: "set_status: " + msg})
	}
}

// statusBody is the body of PUT /v1/users/{user}/status: set_status
// without its type. Text and emoji are raw, to see what the decoder would
// replace with U+FFFD.
type statusBody struct {
	Mode      *string         `json:"mode"`
	Text      json.RawMessage `json:"text"`
	Emoji     json.RawMessage `json:"emoji"`
	ExpiresAt *int64          `json:"expires_at"`
}

func (s *Server) handlePutStatus(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	user, err := pathID(r, "user")
	if err != nil {
		return err
	}
	var body statusBody
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	if err := dec.Decode(&body); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &httpError{status: http.StatusRequestEntityTooLarge, code: protocol.CodeBadRequest, message: "body larger than 1 MiB"}
		}
		return badRequest(`body must be {"mode":"auto|dnd|invisible","text":"…","emoji":"…","expires_at":<ms>|null}`)
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("body must hold one JSON object")
	}
	if body.Mode == nil {
		return badRequest(`"mode" is required`)
	}
	text, err := rawString(body.Text, "text")
	if err != nil {
		return err
	}
	emoji, err := rawString(body.Emoji, "emoji")
	if err != nil {
		return err
	}
	st, err := statusOf(*body.Mode, text, emoji, body.ExpiresAt, s.cfg.Now())
	if err != nil {
		return badRequest(err.Error())
	}
	return s.writeStatus(ctx, w, user, st)
}

func (s *Server) handleDeleteStatus(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	user, err := pathID(r, "user")
	if err != nil {
		return err
	}
	return s.writeStatus(ctx, w, user, presence.Status{})
}

// writeStatus sets user's status and answers with the user's presence as
// GET /v1/users/{user}/presence does (the truth, with the mode).
func (s *Server) writeStatus(ctx context.Context, w http.ResponseWriter, user string, st presence.Status) error {
	if s.intact() != nil {
		return refuseRecovering(w)
	}
	if err := s.setUserStatus(ctx, user, st); err != nil {
		return err
	}
	ps, err := s.readPresence(ctx, []string{user})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, truthPresence(ps[0]))
	return nil
}

// rawString decodes an optional JSON string, refusing one whose decoding
// would replace invalid UTF-8.
func rawString(raw json.RawMessage, name string) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", badRequest(`"` + name + `" must be a string`)
	}
	if !protocol.IntactString(raw, v) {
		return "", badRequest(`"` + name + `" must be valid UTF-8`)
	}
	return v, nil
}

// OnStatus implements store.StatusHandler: the user's own connections here
// learn their status.
func (h *hub) OnStatus(ev presence.StatusChange) {
	frame := myStatusFrame(ev.Status, ev.Version)
	h.mu.RLock()
	defer h.mu.RUnlock()
	lu := h.users[ev.UserID]
	if lu == nil {
		return
	}
	for _, c := range lu.conns {
		c.sendMyStatus(frame)
	}
}

func myStatusFrame(st presence.Status, version uint64) protocol.MyStatus {
	f := protocol.MyStatus{Type: protocol.TypeMyStatus, Mode: st.Mode.String(), Text: st.Text, Emoji: st.Emoji, Version: version}
	if !st.ExpiresAt.IsZero() {
		ms := st.ExpiresAt.UnixMilli()
		f.ExpiresAt = &ms
	}
	return f
}

// sendMyStatus writes a my_status frame unless the connection holds a
// newer one; before welcome it is kept for welcomeStatus.
func (c *client) sendMyStatus(f protocol.MyStatus) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.statusKnown && f.Version <= c.statusVersion {
		return
	}
	c.statusKnown, c.statusVersion = true, f.Version
	if c.welcomed {
		c.writeJSONLocked(f)
	} else {
		c.earlyStatus = &f
	}
}

// welcomeStatusLocked writes, right after welcome, the status the
// connection holds, read at connect or brought by an event since, unless
// it is the default.
func (c *client) welcomeStatusLocked(read protocol.MyStatus) {
	if f, send := c.takeWelcomeStatusLocked(read); send {
		c.writeJSONLocked(f)
	}
}

// takeWelcomeStatusLocked is the my_status welcomeStatusLocked writes: the
// newer of read and one an event brought before welcome; send is false for
// the default status.
func (c *client) takeWelcomeStatusLocked(read protocol.MyStatus) (f protocol.MyStatus, send bool) {
	f = read
	if c.statusKnown && read.Version <= c.statusVersion {
		f = *c.earlyStatus
	}
	c.statusKnown, c.statusVersion, c.earlyStatus = true, f.Version, nil
	return f, f.Mode != protocol.ModeAuto || f.Text != "" || f.Emoji != "" || f.ExpiresAt != nil
}

// viewerPresence is p as a query or an HTTP answer other than the truth
// shows it to viewers.
func viewerPresence(p presence.Presence) protocol.UserPresence {
	v := p.Visible()
	up := protocol.UserPresence{
		UserID:          v.UserID,
		State:           v.State.String(),
		ConnectionCount: v.ConnectionCount,
		Devices:         v.Devices,
		Version:         v.Version,
		Text:            v.Status.Text,
		Emoji:           v.Status.Emoji,
	}
	l := p.Look()
	if l.ExpiresAt != 0 {
		up.ExpiresAt = &l.ExpiresAt
	}
	if !v.LastSeen.IsZero() {
		ms := v.LastSeen.UnixMilli()
		up.LastSeen = &ms
	}
	if !v.Since.IsZero() {
		ms := v.Since.UnixMilli()
		up.Since = &ms
	}
	return up
}

// truthPresence is p as an API key reads it for one user: the real state
// (an invisible user's too), the whole status and the mode.
func truthPresence(p presence.Presence) protocol.UserPresence {
	up := protocol.UserPresence{
		UserID:          p.UserID,
		State:           p.Actual.String(),
		ConnectionCount: p.ConnectionCount,
		Devices:         p.Devices,
		Version:         p.Version,
		Text:            p.Status.Text,
		Emoji:           p.Status.Emoji,
		Mode:            p.Status.Mode.String(),
	}
	if !p.Status.ExpiresAt.IsZero() {
		ms := p.Status.ExpiresAt.UnixMilli()
		up.ExpiresAt = &ms
	}
	if !p.LastSeen.IsZero() {
		ms := p.LastSeen.UnixMilli()
		up.LastSeen = &ms
	}
	if !p.ActualSince.IsZero() {
		ms := p.ActualSince.UnixMilli()
		up.Since = &ms
	}
	return up
}

// userState is a snapshot or team list entry of p, as viewers see it.
func userState(p presence.Presence) protocol.UserState {
	l := p.Look()
	return protocol.UserState{UserID: p.UserID, State: l.State.String(), Version: p.Version,
		Text: l.Text, Emoji: l.Emoji, ExpiresAt: l.ExpiresAt, Since: msOf(p.Since)}
}

// changeOf is p as a change at version v (a catch-up after a team join).
func changeOf(p presence.Presence, v uint64, at time.Time) protocol.Change {
	l := p.Look()
	return protocol.Change{UserID: p.UserID, State: l.State.String(), Version: v, At: at.UnixMilli(),
		Text: l.Text, Emoji: l.Emoji, ExpiresAt: l.ExpiresAt, Since: msOf(p.Since), LastSeen: l.LastSeen}
}

func msOf(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}
