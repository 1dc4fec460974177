package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/greendot/greendot/protocol"
	"github.com/greendot/greendot/pusher"
	"github.com/greendot/greendot/store"
)

// Pusher's REST API (docs/pusher.md): requests signed as the official
// server SDKs sign them; errors are plain text, as Pusher answers them.

func (p *pxServer) routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /app/{key}", p.s.handleApp)
	mux.HandleFunc("POST /apps/{app}/events", p.rest(p.handleEvents))
	mux.HandleFunc("POST /apps/{app}/batch_events", p.rest(p.handleBatch))
	mux.HandleFunc("GET /apps/{app}/channels", p.rest(p.handleChannels))
	mux.HandleFunc("GET /apps/{app}/channels/{channel}", p.rest(p.handleChannel))
	mux.HandleFunc("GET /apps/{app}/channels/{channel}/users", p.rest(p.handleUsers))
	mux.HandleFunc("POST /apps/{app}/users/{user}/events", p.rest(p.handleUserEvent))
	mux.HandleFunc("POST /apps/{app}/users/{user}/terminate_connections", p.rest(p.handleTerminate))
}

type restError struct {
	status int
	msg    string
}

func (e *restError) Error() string { return e.msg }

func pxBadRequest(format string, args ...any) error {
	return &restError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

const pxMaxBody = 256 << 10

func (p *pxServer) rest(h func(ctx context.Context, w http.ResponseWriter, r *http.Request, body []byte) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		fail := func(status int, msg string) {
			p.s.metrics.pusherREST.WithLabelValues(fmt.Sprint(status)).Inc()
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, msg+"\n")
		}
		if r.PathValue("app") != p.cfg.AppID {
			fail(http.StatusNotFound, "Unknown app")
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, pxMaxBody))
		if err != nil {
			fail(http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds %d bytes", pxMaxBody))
			return
		}
		if err := pusher.VerifyRequest(p.cfg.Key, p.cfg.Secret, r.Method, r.URL.Path, r.URL.Query(), body, p.s.cfg.Now()); err != nil {
			var re *pusher.RESTError
			if errors.As(err, &re) {
				fail(re.Status, re.Message)
			} else {
				fail(http.StatusUnauthorized, err.Error())
			}
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		if err := h(ctx, w, r, body); err != nil {
			var re *restError
			switch {
			case errors.As(err, &re):
				fail(re.status, re.msg)
			case errors.Is(err, store.ErrUnavailable):
				fail(http.StatusServiceUnavailable, "store unavailable; retry")
			default:
				p.s.log.Error("pusher REST", "path", r.URL.Path, "err", err)
				fail(http.StatusInternalServerError, "internal error")
			}
			return
		}
		p.s.metrics.pusherREST.WithLabelValues("200").Inc()
	}
}

// restEvent is one event of /events or /batch_events.
type restEvent struct {
	Name     string   `json:"name"`
	Data     any      `json:"data"` // a string; Pusher takes any JSON and sends it as given
	Channels []string `json:"channels"`
	Channel  string   `json:"channel"`
	SocketID string   `json:"socket_id"`
}

func (p *pxServer) message(e restEvent) (pxMessage, error) {
	if e.Name == "" {
		return pxMessage{}, pxBadRequest("missing event name")
	}
	if len(e.Name) > pusher.MaxEventNameLen {
		return pxMessage{}, pxBadRequest("event name longer than %d characters", pusher.MaxEventNameLen)
	}
	chans := e.Channels
	if e.Channel != "" {
		chans = append(chans, e.Channel)
	}
	if len(chans) == 0 {
		return pxMessage{}, pxBadRequest("missing channels")
	}
	if len(chans) > pxMaxTriggerChans {
		return pxMessage{}, pxBadRequest("at most %d channels per event, got %d", pxMaxTriggerChans, len(chans))
	}
	for _, ch := range chans {
		if !pusher.ValidChannel(ch) {
			return pxMessage{}, pxBadRequest("invalid channel name %q: 1 to 164 characters of A-Z a-z 0-9 _ - = @ , . ;", trimForMessage(ch))
		}
	}
	if e.SocketID != "" && !pusher.ValidSocketID(e.SocketID) {
		return pxMessage{}, pxBadRequest("invalid socket_id %q", trimForMessage(e.SocketID))
	}
	data, err := json.Marshal(e.Data)
	if err != nil {
		return pxMessage{}, pxBadRequest("bad data")
	}
	size := len(data) // Pusher measures a string's own bytes, not its JSON escaping
	if s, ok := e.Data.(string); ok {
		size = len(s)
	}
	if size > pxMaxEventData {
		return pxMessage{}, &restError{http.StatusRequestEntityTooLarge, fmt.Sprintf("event data exceeds %d bytes", pxMaxEventData)}
	}
	return pxMessage{Channels: chans, Event: e.Name, Data: data, Exclude: e.SocketID}, nil
}

func (p *pxServer) handleEvents(ctx context.Context, w http.ResponseWriter, _ *http.Request, body []byte) error {
	var e restEvent
	if err := json.Unmarshal(body, &e); err != nil {
		return pxBadRequest("body is not a JSON event: %v", err)
	}
	m, err := p.message(e)
	if err != nil {
		return err
	}
	if err := p.publish(ctx, m); err != nil {
		return fmt.Errorf("%w: %v", store.ErrUnavailable, err)
	}
	writeJSON(w, http.StatusOK, struct{}{})
	return nil
}

func (p *pxServer) handleBatch(ctx context.Context, w http.ResponseWriter, _ *http.Request, body []byte) error {
	var b struct {
		Batch []restEvent `json:"batch"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return pxBadRequest("body is not {\"batch\":[events]}: %v", err)
	}
	if len(b.Batch) > pxMaxBatch {
		return pxBadRequest("at most %d events per batch, got %d", pxMaxBatch, len(b.Batch))
	}
	msgs := make([]pxMessage, len(b.Batch))
	for i, e := range b.Batch {
		m, err := p.message(e)
		if err != nil {
			var re *restError
			if errors.As(err, &re) {
				re.msg = fmt.Sprintf("batch[%d]: %s", i, re.msg)
			}
			return err
		}
		msgs[i] = m
	}
	for _, m := range msgs {
		if err := p.publish(ctx, m); err != nil {
			return fmt.Errorf("%w: %v", store.ErrUnavailable, err)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"batch": make([]struct{}, len(msgs))})
	return nil
}

// infoFields parses ?info=: user_count only for presence channels, as
// Pusher refuses it elsewhere.
func infoFields(r *http.Request) map[string]bool {
	out := make(map[string]bool)
	for _, f := range strings.Split(r.URL.Query().Get("info"), ",") {
		if f = strings.TrimSpace(f); f != "" {
			out[f] = true
		}
	}
	return out
}

func (p *pxServer) handleChannels(ctx context.Context, w http.ResponseWriter, r *http.Request, _ []byte) error {
	prefix := r.URL.Query().Get("filter_by_prefix")
	info := infoFields(r)
	for f := range info {
		if f != "user_count" {
			return pxBadRequest("unsupported info attribute %q for a channel list (user_count is the only one)", trimForMessage(f))
		}
	}
	if info["user_count"] && !strings.HasPrefix(prefix, "presence-") {
		return pxBadRequest("info=user_count needs filter_by_prefix=presence-")
	}
	counts, err := p.channelCounts(ctx, prefix)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(counts))
	for ch := range counts {
		names = append(names, ch)
	}
	sort.Strings(names)
	out := make(map[string]map[string]int, len(names))
	for _, ch := range names {
		attrs := map[string]int{}
		if info["user_count"] {
			team, _ := pusher.PresenceTeam(ch)
			users, err := p.presenceMembers(ctx, team)
			if err != nil {
				return err
			}
			attrs["user_count"] = len(users)
		}
		out[ch] = attrs
	}
	writeJSON(w, http.StatusOK, map[string]any{"channels": out})
	return nil
}

func (p *pxServer) handleChannel(ctx context.Context, w http.ResponseWriter, r *http.Request, _ []byte) error {
	ch := r.PathValue("channel")
	if !pusher.ValidChannel(ch) {
		return pxBadRequest("invalid channel name")
	}
	info := infoFields(r)
	presence := pusher.KindOf(ch) == pusher.Presence
	for f := range info {
		switch {
		case f == "subscription_count":
		case f == "user_count" && presence:
		default:
			return pxBadRequest("unsupported info attribute %q for %s", trimForMessage(f), trimForMessage(ch))
		}
	}
	counts, err := p.channelCounts(ctx, ch)
	if err != nil {
		return err
	}
	subs := counts[ch]
	out := map[string]any{"occupied": subs > 0}
	if presence {
		team, _ := pusher.PresenceTeam(ch)
		users, err := p.presenceMembers(ctx, team)
		if err != nil {
			return err
		}
		// Native greendot users of the team are members too.
		out["occupied"] = subs > 0 || len(users) > 0
		if info["user_count"] {
			out["user_count"] = len(users)
		}
	}
	if info["subscription_count"] {
		out["subscription_count"] = subs
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (p *pxServer) handleUsers(ctx context.Context, w http.ResponseWriter, r *http.Request, _ []byte) error {
	ch := r.PathValue("channel")
	team, ok := pusher.PresenceTeam(ch)
	if !ok || pusher.KindOf(ch) != pusher.Presence || !pusher.ValidChannel(ch) {
		return pxBadRequest("users are listed for presence channels only")
	}
	users, err := p.presenceMembers(ctx, team)
	if err != nil {
		return err
	}
	type user struct {
		ID string `json:"id"`
	}
	out := make([]user, len(users))
	for i, u := range users {
		out[i] = user{u}
	}
	writeJSON(w, http.StatusOK, map[string]any{"users": out})
	return nil
}

// handleUserEvent sends an event to every socket signed in as the user
// (the SDKs' sendToUser).
func (p *pxServer) handleUserEvent(ctx context.Context, w http.ResponseWriter, r *http.Request, body []byte) error {
	user := r.PathValue("user")
	if !protocol.ValidID(user) {
		return pxBadRequest("invalid user id")
	}
	var e restEvent
	if err := json.Unmarshal(body, &e); err != nil {
		return pxBadRequest("body is not a JSON event: %v", err)
	}
	e.Channels, e.Channel = nil, "#server-to-user-"+user
	if e.Name == "" {
		return pxBadRequest("missing event name")
	}
	data, err := json.Marshal(e.Data)
	if err != nil || len(data) > pxMaxEventData+2 {
		return &restError{http.StatusRequestEntityTooLarge, fmt.Sprintf("event data exceeds %d bytes", pxMaxEventData)}
	}
	m := pxMessage{Channels: []string{userChannel(user)}, Event: e.Name, Data: data}
	if err := p.publish(ctx, m); err != nil {
		return fmt.Errorf("%w: %v", store.ErrUnavailable, err)
	}
	writeJSON(w, http.StatusOK, struct{}{})
	return nil
}

// handleTerminate closes every socket of the user, on every node (the SDKs'
// terminateUserConnections).
func (p *pxServer) handleTerminate(ctx context.Context, w http.ResponseWriter, r *http.Request, _ []byte) error {
	user := r.PathValue("user")
	if !protocol.ValidID(user) {
		return pxBadRequest("invalid user id")
	}
	if err := p.publish(ctx, pxMessage{Terminate: user}); err != nil {
		return fmt.Errorf("%w: %v", store.ErrUnavailable, err)
	}
	writeJSON(w, http.StatusOK, struct{}{})
	return nil
}
