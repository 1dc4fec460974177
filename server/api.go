package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/store"
)

// api wraps an HTTP API handler with the API key check, a store deadline and
// JSON errors.
func (s *Server) api(h func(ctx context.Context, w http.ResponseWriter, r *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !apiKeyOK(s.cfg.APIKey, r) {
			writeError(w, http.StatusUnauthorized, protocol.CodeUnauthorized, "missing or wrong API key (Authorization: Bearer <key>)")
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		if err := h(ctx, w, r); err != nil {
			var he *httpError
			if errors.As(err, &he) {
				writeError(w, he.status, he.code, he.message)
				return
			}
			if errors.Is(err, store.ErrRecovering) {
				he = refuseRecovering(w).(*httpError)
				writeError(w, he.status, he.code, he.message)
				return
			}
			s.log.Error("api", "path", r.URL.Path, "err", err)
			writeError(w, http.StatusServiceUnavailable, protocol.CodeUnavailable, "store unavailable")
		}
	}
}

// httpError is a client-facing error: its message is safe to show.
type httpError struct {
	status  int
	code    string
	message string
}

func (e *httpError) Error() string { return e.message }

func badRequest(msg string) error {
	return &httpError{status: http.StatusBadRequest, code: protocol.CodeBadRequest, message: msg}
}

func pathID(r *http.Request, name string) (string, error) {
	v := r.PathValue(name)
	if !protocol.ValidID(v) {
		return "", badRequest(errBadID(name).Error())
	}
	return v, nil
}

func (s *Server) handleUserPresence(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	user, err := pathID(r, "user")
	if err != nil {
		return err
	}
	if s.intact() != nil {
		return refuseRecovering(w)
	}
	ps, err := s.readPresence(ctx, []string{user})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, truthPresence(ps[0]))
	return nil
}

func (s *Server) handleQuery(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	var req struct {
		// Raw, to see what the decoder would replace with U+FFFD.
		UserIDs []json.RawMessage `json:"user_ids"`
	}
	body := http.MaxBytesReader(w, r.Body, 1<<20)
	dec := json.NewDecoder(body)
	if err := dec.Decode(&req); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &httpError{status: http.StatusRequestEntityTooLarge, code: protocol.CodeBadRequest, message: "body larger than 1 MiB"}
		}
		return badRequest(`body must be {"user_ids":[…]}`)
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("body must hold one JSON object")
	}
	if req.UserIDs == nil {
		return badRequest(`"user_ids" is required`)
	}
	if len(req.UserIDs) > protocol.MaxQueryIDs {
		return &httpError{status: http.StatusBadRequest, code: protocol.CodeTooManyIDs, message: "at most 500 user ids"}
	}
	ids := make([]string, len(req.UserIDs))
	for i, raw := range req.UserIDs {
		if err := json.Unmarshal(raw, &ids[i]); err != nil {
			return badRequest(`body must be {"user_ids":[…]}`)
		}
		if !protocol.ValidID(ids[i]) || !protocol.IntactString(raw, ids[i]) {
			return badRequest(errBadID("user").Error())
		}
	}
	if s.intact() != nil {
		return refuseRecovering(w)
	}
	ps, err := s.readPresence(ctx, ids)
	if err != nil {
		return err
	}
	out := struct {
		Users []protocol.UserPresence `json:"users"`
	}{Users: make([]protocol.UserPresence, len(ps))}
	for i, p := range ps {
		out.Users[i] = viewerPresence(p)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) handleTeamPresence(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	team, err := pathID(r, "team")
	if err != nil {
		return err
	}
	if s.intact() != nil {
		return refuseRecovering(w)
	}
	members, err := s.store.Members(ctx, team)
	if err != nil {
		return err
	}
	out := struct {
		TeamID      string                   `json:"team_id"`
		MemberCount int                      `json:"member_count"`
		Online      []protocol.UserState     `json:"online"`
		Offline     []protocol.OfflineMember `json:"offline"`
	}{TeamID: team, MemberCount: len(members), Online: []protocol.UserState{}, Offline: []protocol.OfflineMember{}}
	// Read even with no members: a team that a loss emptied is refused
	// (the check witnesses every master), not answered empty.
	ps, err := s.readPresence(ctx, members)
	if err != nil {
		return err
	}
	for _, p := range ps {
		if p.State != presence.Offline {
			out.Online = append(out.Online, userState(p))
			continue
		}
		up, st := viewerPresence(p), userState(p)
		out.Offline = append(out.Offline, protocol.OfflineMember{UserID: up.UserID, Version: up.Version, LastSeen: up.LastSeen,
			Text: st.Text, Emoji: st.Emoji, ExpiresAt: st.ExpiresAt, Since: st.Since})
	}
	// Stores list members sorted; sorting again keeps the answer stable
	// whatever order a store's presence read returns.
	slices.SortFunc(out.Online, func(a, b protocol.UserState) int { return strings.Compare(a.UserID, b.UserID) })
	slices.SortFunc(out.Offline, func(a, b protocol.OfflineMember) int { return strings.Compare(a.UserID, b.UserID) })
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) handleAddMember(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	return s.changeMembership(ctx, w, r, true)
}

func (s *Server) handleRemoveMember(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	return s.changeMembership(ctx, w, r, false)
}

func (s *Server) changeMembership(ctx context.Context, w http.ResponseWriter, r *http.Request, join bool) error {
	team, err := pathID(r, "team")
	if err != nil {
		return err
	}
	user, err := pathID(r, "user")
	if err != nil {
		return err
	}
	err = s.timed(store.OpMembership, func() error {
		if join {
			return s.store.AddMember(ctx, team, user)
		}
		return s.store.RemoveMember(ctx, team, user)
	})
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) handleHealthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		writeError(w, http.StatusServiceUnavailable, protocol.CodeUnavailable, "draining")
		return
	}
	if p, ok := s.store.(store.Pinger); ok {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := p.Ping(ctx); err != nil {
			writeError(w, http.StatusServiceUnavailable, protocol.CodeUnavailable, "store unreachable")
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"code":"internal","message":"encoding failed"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	type body struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	writeJSON(w, status, struct {
		Error body `json:"error"`
	}{body{code, message}})
}
