// Package protocol holds the wire frames of greendot's WebSocket protocol (v1).
//
// Every frame is one JSON object discriminated by "type". The server and the Go
// client both use these types, so the two can never disagree on a field name.
// docs/protocol.md is the prose version of this file.
package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Frame types, server to client.
const (
	TypeWelcome      = "welcome"
	TypeSnapshot     = "snapshot"
	TypePresence     = "presence"
	TypeHeartbeatAck = "heartbeat_ack"
	TypeQueryResult  = "query_result"
	TypeReconnect    = "reconnect"
	TypeError        = "error"
	TypeMyStatus     = "my_status"    // v2: the user's own status, to their own connections
	TypeWatchResult  = "watch_result" // v2: answers watch
	TypeTeamCounts   = "team_counts"  // v2: member and online counts of large teams
)

// Frame types, client to server.
const (
	TypeHeartbeat = "heartbeat"
	TypeStatus    = "status"
	TypeQuery     = "query"
	TypeSetStatus = "set_status" // v2: the user's status, every device
	TypeWatch     = "watch"      // v2: follow users of large teams
	TypeUnwatch   = "unwatch"    // v2
)

// Presence states as they appear on the wire.
const (
	StateOnline  = "online"
	StateAway    = "away"
	StateOffline = "offline"
	StateDND     = "dnd"     // v2: online or away with the status mode dnd
	StateUnknown = "unknown" // query result for a user who shares no team with the viewer
)

// Error codes carried by error frames and HTTP error bodies.
const (
	CodeBadRequest   = "bad_request"
	CodeUnknownType  = "unknown_type"
	CodeRateLimited  = "rate_limited"
	CodeTooManyIDs   = "too_many_ids"
	CodeUnauthorized = "unauthorized"
	CodeNotFound     = "not_found"
	CodeUnavailable  = "unavailable"
	CodeInternal     = "internal"
	CodeMethod       = "method_not_allowed"
	CodeHeadTooLarge = "header_too_large" // HTTP only: 431, request line and headers over 16 KiB
	// HTTP only, at /v1/connect: 429, the user's connections on this node
	// are at --max-connections-per-user.
	CodeTooManyConns = "too_many_connections"
	// HTTP only, at /v1/connect: 403, an Origin not in --allowed-origins.
	CodeForbiddenOrigin = "forbidden_origin"
)

// WebSocket close codes used by the server.
const (
	CloseNormal         = 1000
	CloseProtocolError  = 1002 // a frame that breaks RFC 6455: reserved bits or opcodes, unmasked
	CloseUnsupported    = 1003 // a binary frame
	ClosePolicy         = 1008 // a flood, or bad frames that keep coming
	CloseTooBig         = 1009
	CloseServiceRestart = 1012
	CloseTryAgainLater  = 1013 // a slow consumer, disconnected to protect the node
	CloseTokenExpired   = 4001
)

// MaxQueryIDs bounds the user ids of one query, over WebSocket and HTTP.
const MaxQueryIDs = 500

// MaxWatchIDs bounds the user ids of one watch or unwatch frame;
// MaxWatched the users one connection watches at once.
const (
	MaxWatchIDs = 500
	MaxWatched  = 2000
)

// MaxIDBytes bounds a user, team or device id (ValidID).
const MaxIDBytes = 128

// MaxSmallFrame is the contract's limit of a client frame (4 KiB) for every
// type but `query`, whose 500 ids may need up to MaxFrameSize.
const MaxSmallFrame = 4 << 10

// MaxFrameSize is the limit of a client `query` frame: it fits a query of
// MaxQueryIDs ids of MaxIDBytes each even when every byte is escaped in
// JSON (`\"`, `\\`: 2 bytes), with quotes and commas (3 bytes per id),
// plus 1.5 KiB for the rest of the frame (type, query id). 500 × 259 =
// 129,500 bytes, so 128 KiB.
const MaxFrameSize = 128 << 10

// Welcome is the first frame on every connection.
type Welcome struct {
	Type                string `json:"type"`
	ConnectionID        string `json:"connection_id"`
	UserID              string `json:"user_id"`
	HeartbeatIntervalMS int64  `json:"heartbeat_interval_ms"`
	TTLMS               int64  `json:"ttl_ms"`
	OfflineGraceMS      int64  `json:"offline_grace_ms"` // added to v1: how long offline waits after the last connection
}

// Status modes (v2), as set_status and my_status carry them.
const (
	ModeAuto      = "auto"
	ModeDND       = "dnd"
	ModeInvisible = "invisible"
)

// UserState is one entry of a snapshot, or of a team's online list. The
// fields after Version are v2: the status text shown, when set, and since
// when the state holds (Unix ms).
type UserState struct {
	UserID    string `json:"user_id"`
	State     string `json:"state"`
	Version   uint64 `json:"version"`
	Text      string `json:"text,omitempty"`
	Emoji     string `json:"emoji,omitempty"`
	ExpiresAt int64  `json:"expires_at,omitempty"`
	Since     int64  `json:"since,omitempty"`
}

// OfflineMember is one entry of a team's offline list (added to v1): an
// offline member, LastSeen being null (nil) for a member never seen.
type OfflineMember struct {
	UserID    string `json:"user_id"`
	Version   uint64 `json:"version"`
	LastSeen  *int64 `json:"last_seen"`
	Text      string `json:"text,omitempty"`
	Emoji     string `json:"emoji,omitempty"`
	ExpiresAt int64  `json:"expires_at,omitempty"`
	Since     int64  `json:"since,omitempty"`
}

// Snapshot follows welcome: every visible user who is not offline.
type Snapshot struct {
	Type  string      `json:"type"`
	Users []UserState `json:"users"`
}

// Change is one versioned transition of one user. The fields after At are
// v2: the status text shown (when set), since when the state holds, and,
// for offline, when the user was last seen. Comparable (frameCache).
type Change struct {
	UserID    string `json:"user_id"`
	State     string `json:"state"`
	Version   uint64 `json:"version"`
	At        int64  `json:"at"`
	Text      string `json:"text,omitempty"`
	Emoji     string `json:"emoji,omitempty"`
	ExpiresAt int64  `json:"expires_at,omitempty"`
	Since     int64  `json:"since,omitempty"`
	LastSeen  int64  `json:"last_seen,omitempty"`
}

// Presence carries one or more changes, batched.
type Presence struct {
	Type    string   `json:"type"`
	Changes []Change `json:"changes"`
}

// HeartbeatAck answers a heartbeat that carried an id.
type HeartbeatAck struct {
	Type string          `json:"type"`
	ID   json.RawMessage `json:"id"`
}

// UserPresence is the full presence of one user, as queries return it.
// A user the viewer may not see has only UserID and State "unknown"; for
// every other user each field is present, LastSeen being null (nil) for a
// user never seen.
type UserPresence struct {
	UserID          string   `json:"user_id"`
	State           string   `json:"state"`
	ConnectionCount int      `json:"connection_count"`
	Devices         []string `json:"devices"`
	LastSeen        *int64   `json:"last_seen"`
	Version         uint64   `json:"version"`
	// v2: the status text shown, when set; since when the state holds
	// (null for a user never seen); the mode only in the truth an API key
	// reads (GET /v1/users/{user}/presence).
	Text      string `json:"text,omitempty"`
	Emoji     string `json:"emoji,omitempty"`
	ExpiresAt *int64 `json:"expires_at,omitempty"`
	Since     *int64 `json:"since"`
	Mode      string `json:"mode,omitempty"`
}

// MarshalJSON writes an unknown user as {"user_id","state"} alone.
func (p UserPresence) MarshalJSON() ([]byte, error) {
	if p.State == StateUnknown {
		return json.Marshal(struct {
			UserID string `json:"user_id"`
			State  string `json:"state"`
		}{p.UserID, p.State})
	}
	type plain UserPresence
	if p.Devices == nil {
		p.Devices = []string{}
	}
	return json.Marshal(plain(p))
}

// QueryResult answers a query frame.
type QueryResult struct {
	Type  string          `json:"type"`
	ID    json.RawMessage `json:"id"`
	Users []UserPresence  `json:"users"`
}

// MyStatus tells a user's own connections their status (v2), after
// welcome when it is not the default and whenever it changes. Version is
// the user's presence version at the change: older ones are stale.
type MyStatus struct {
	Type      string `json:"type"`
	Mode      string `json:"mode"`
	Text      string `json:"text"`
	Emoji     string `json:"emoji"`
	ExpiresAt *int64 `json:"expires_at"`
	Version   uint64 `json:"version"`
}

// SetStatus sets the sending user's status (v2), every device and node,
// replacing the previous one whole. Mode is required; ExpiresAt is Unix ms
// or nil. The server checks the rest (lengths, characters, expiry).
type SetStatus struct {
	Type      string `json:"type"`
	Mode      string `json:"mode"`
	Text      string `json:"text,omitempty"`
	Emoji     string `json:"emoji,omitempty"`
	ExpiresAt *int64 `json:"expires_at,omitempty"`
}

// Reconnect tells a client to reconnect after a delay; the server then closes with 1012.
type Reconnect struct {
	Type    string `json:"type"`
	AfterMS int64  `json:"after_ms"`
}

// Error reports a bad frame; the connection stays open.
type Error struct {
	Type    string `json:"type"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Heartbeat is a client's sign of life; ID, when present, is echoed in heartbeat_ack.
type Heartbeat struct {
	Type string          `json:"type"`
	ID   json.RawMessage `json:"id,omitempty"`
}

// Status marks the sending device active ("online") or idle ("away").
type Status struct {
	Type  string `json:"type"`
	State string `json:"state"`
}

// Query asks for the presence of up to MaxQueryIDs users.
type Query struct {
	Type    string          `json:"type"`
	ID      json.RawMessage `json:"id,omitempty"`
	UserIDs []string        `json:"user_ids"`
}

// Watch asks for the changes of up to MaxWatchIDs users (v2): the members
// of large teams are sent to nobody who does not watch them.
type Watch struct {
	Type    string          `json:"type"`
	ID      json.RawMessage `json:"id,omitempty"`
	UserIDs []string        `json:"user_ids"`
}

// WatchResult answers a watch: the watched users' presence, as a query's.
type WatchResult struct {
	Type  string          `json:"type"`
	ID    json.RawMessage `json:"id"`
	Users []UserPresence  `json:"users"`
}

// Unwatch stops the changes of users watched before (v2).
type Unwatch struct {
	Type    string   `json:"type"`
	UserIDs []string `json:"user_ids"`
}

// TeamCount is one large team's counts in a team_counts frame.
type TeamCount struct {
	TeamID      string `json:"team_id"`
	MemberCount int    `json:"member_count"`
	OnlineCount int    `json:"online_count"`
}

// TeamCounts tells a viewer the counts of its large teams (v2).
type TeamCounts struct {
	Type  string      `json:"type"`
	Teams []TeamCount `json:"teams"`
}

// ClientFrame is a decoded client frame: exactly one of its pointers is set.
type ClientFrame struct {
	Heartbeat *Heartbeat
	Status    *Status
	Query     *Query
	SetStatus *SetStatus
	Watch     *Watch
	Unwatch   *Unwatch
}

// DecodeError is a client frame the server refuses; Code is one of the Code constants.
type DecodeError struct {
	Code    string
	Message string
}

func (e *DecodeError) Error() string { return e.Code + ": " + e.Message }

func badRequest(format string, args ...any) *DecodeError {
	return &DecodeError{Code: CodeBadRequest, Message: fmt.Sprintf(format, args...)}
}

// DecodeClientFrame parses one client text frame. It never panics; every
// refusal is a *DecodeError with a message safe to send back to the client.
func DecodeClientFrame(data []byte) (ClientFrame, error) {
	// The frame nearly every client sends every few seconds: no parsing.
	if id, ok := SimpleHeartbeat(data); ok {
		return ClientFrame{Heartbeat: &Heartbeat{Type: TypeHeartbeat, ID: bytes.Clone(id)}}, nil
	}
	// One pass decodes the fields of every frame type.
	var raw struct {
		Type    *string         `json:"type"`
		ID      json.RawMessage `json:"id"`
		State   *string         `json:"state"`
		UserIDs []string        `json:"user_ids"`
		// set_status
		Mode      *string `json:"mode"`
		Text      *string `json:"text"`
		Emoji     *string `json:"emoji"`
		ExpiresAt *int64  `json:"expires_at"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			return ClientFrame{}, badRequest("%s", jsonProblem(err))
		}
		return ClientFrame{}, badRequest("frame is not a JSON object: %s", jsonProblem(err))
	}
	if raw.Type == nil {
		return ClientFrame{}, badRequest(`frame has no "type"`)
	}
	var f ClientFrame
	switch *raw.Type {
	case TypeHeartbeat:
		if err := checkID(raw.ID); err != nil {
			return ClientFrame{}, err
		}
		f.Heartbeat = &Heartbeat{Type: TypeHeartbeat, ID: raw.ID}
	case TypeStatus:
		if raw.State == nil || (*raw.State != StateOnline && *raw.State != StateAway) {
			return ClientFrame{}, badRequest(`status "state" must be "online" or "away"`)
		}
		f.Status = &Status{Type: TypeStatus, State: *raw.State}
	case TypeQuery:
		if err := checkID(raw.ID); err != nil {
			return ClientFrame{}, err
		}
		if raw.UserIDs == nil {
			return ClientFrame{}, badRequest(`query needs "user_ids", an array of strings`)
		}
		if len(raw.UserIDs) > MaxQueryIDs {
			return ClientFrame{}, &DecodeError{Code: CodeTooManyIDs, Message: fmt.Sprintf("a query takes at most %d user ids", MaxQueryIDs)}
		}
		if err := checkIntactIDs(data, raw.UserIDs, MsgBadQueryID); err != nil {
			return ClientFrame{}, err
		}
		f.Query = &Query{Type: TypeQuery, ID: raw.ID, UserIDs: raw.UserIDs}
	case TypeWatch, TypeUnwatch:
		if err := checkID(raw.ID); err != nil {
			return ClientFrame{}, err
		}
		if raw.UserIDs == nil {
			return ClientFrame{}, badRequest(`%s needs "user_ids", an array of strings`, *raw.Type)
		}
		if len(raw.UserIDs) > MaxWatchIDs {
			article := "a"
			if *raw.Type == TypeUnwatch {
				article = "an"
			}
			return ClientFrame{}, badRequest("%s %s frame takes at most %d user ids", article, *raw.Type, MaxWatchIDs)
		}
		if err := checkIntactIDs(data, raw.UserIDs, MsgBadWatchID); err != nil {
			return ClientFrame{}, err
		}
		for _, id := range raw.UserIDs {
			if !ValidID(id) {
				return ClientFrame{}, badRequest(MsgBadWatchID)
			}
		}
		if *raw.Type == TypeWatch {
			f.Watch = &Watch{Type: TypeWatch, ID: raw.ID, UserIDs: raw.UserIDs}
		} else {
			f.Unwatch = &Unwatch{Type: TypeUnwatch, UserIDs: raw.UserIDs}
		}
	case TypeSetStatus:
		if raw.Mode == nil || !ValidMode(*raw.Mode) {
			return ClientFrame{}, badRequest(`set_status "mode" must be "auto", "dnd" or "invisible"`)
		}
		st := &SetStatus{Type: TypeSetStatus, Mode: *raw.Mode, ExpiresAt: raw.ExpiresAt}
		if raw.Text != nil {
			st.Text = *raw.Text
		}
		if raw.Emoji != nil {
			st.Emoji = *raw.Emoji
		}
		// As the HTTP status route: a lone surrogate escape must not be
		// stored as U+FFFD.
		if !intactField(data, "text", st.Text) || !intactField(data, "emoji", st.Emoji) {
			return ClientFrame{}, badRequest(`set_status: "text" and "emoji" must be valid UTF-8`)
		}
		f.SetStatus = st
	default:
		return ClientFrame{}, &DecodeError{Code: CodeUnknownType, Message: fmt.Sprintf("unknown frame type %q", truncate(*raw.Type, 64))}
	}
	return f, nil
}

// checkIntactIDs refuses a query whose ids encoding/json decoded with a
// loss: a lone surrogate escape (`\ud800`) becomes U+FFFD without an error.
// Only ids holding U+FFFD need the second look at the frame.
func checkIntactIDs(data []byte, ids []string, msg string) error {
	lossy := false
	for _, id := range ids {
		lossy = lossy || strings.ContainsRune(id, utf8.RuneError)
	}
	if !lossy {
		return nil
	}
	var raw struct {
		UserIDs []json.RawMessage `json:"user_ids"`
	}
	if json.Unmarshal(data, &raw) != nil || len(raw.UserIDs) != len(ids) {
		return badRequest("%s", msg)
	}
	for i, r := range raw.UserIDs {
		if !IntactString(r, ids[i]) {
			return badRequest("%s", msg)
		}
	}
	return nil
}

// intactField reports whether the string field name of the frame data,
// decoded as s, lost nothing (see checkIntactIDs); only a value holding
// U+FFFD needs the second look.
func intactField(data []byte, name, s string) bool {
	if !strings.ContainsRune(s, utf8.RuneError) {
		return true
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal(data, &raw) != nil {
		return false
	}
	return IntactString(raw[name], s)
}

// MsgBadQueryID is the message of a query with an invalid id, whether the
// decoder or the id check finds it.
const MsgBadQueryID = "query: every user id must be 1-128 bytes of printable UTF-8"

// MsgBadWatchID is the message of a watch or unwatch with an invalid id.
const MsgBadWatchID = "watch: every user id must be 1-128 bytes of printable UTF-8"

// IntactString reports whether decoding the JSON string raw into s lost
// nothing: encoding/json turns invalid UTF-8 and lone surrogate escapes
// (`\ud800`) into U+FFFD, so s must hold no more U+FFFD than raw spells,
// as the character itself or as `\ufffd`.
func IntactString(raw []byte, s string) bool {
	if !utf8.Valid(raw) {
		return false
	}
	spelled := 0
	for i := 0; i < len(raw); {
		if raw[i] == '\\' && i+1 < len(raw) {
			if raw[i+1] == 'u' && i+6 <= len(raw) && strings.EqualFold(string(raw[i+2:i+6]), "fffd") {
				spelled++
				i += 6
				continue
			}
			i += 2 // any other escape, \\ included
			continue
		}
		r, size := utf8.DecodeRune(raw[i:])
		if r == utf8.RuneError {
			spelled++
		}
		i += size
	}
	return strings.Count(s, "\uFFFD") <= spelled
}

var (
	plainHeartbeat  = []byte(`{"type":"heartbeat"}`)
	heartbeatIDHead = []byte(`{"type":"heartbeat","id":`)
)

// SimpleHeartbeat recognises the heartbeats clients send, without
// allocating: {"type":"heartbeat"} (id nil) and {"type":"heartbeat","id":ID}
// where ID is a plain integer or a string of letters, digits, '-' and '_'.
// The id it returns is ID's bytes inside data, not a copy: copy it before
// data is reused. Any other frame, a heartbeat spelled otherwise among them,
// is for DecodeClientFrame, which reads these the same.
func SimpleHeartbeat(data []byte) (id []byte, ok bool) {
	if bytes.Equal(data, plainHeartbeat) {
		return nil, true
	}
	return heartbeatWithSimpleID(data)
}

// heartbeatWithSimpleID is SimpleHeartbeat for a heartbeat with an id.
func heartbeatWithSimpleID(data []byte) ([]byte, bool) {
	if !bytes.HasPrefix(data, heartbeatIDHead) || len(data) < len(heartbeatIDHead)+2 || data[len(data)-1] != '}' {
		return nil, false
	}
	id := data[len(heartbeatIDHead) : len(data)-1]
	if len(id) > 64 {
		return nil, false
	}
	quoted := id[0] == '"'
	body := id
	if quoted {
		if len(id) < 3 || id[len(id)-1] != '"' {
			return nil, false
		}
		body = id[1 : len(id)-1]
	}
	for i, c := range body {
		switch {
		case c >= '0' && c <= '9':
		case quoted && (c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_'):
		case !quoted && c == '-' && i == 0 && len(body) > 1:
		default:
			return nil, false
		}
	}
	// JSON numbers have no leading zeros: 007 is no id, and the general
	// path refuses it (an ack echoing it would not be JSON).
	if digits := bytes.TrimPrefix(body, []byte("-")); !quoted && len(digits) > 1 && digits[0] == '0' {
		return nil, false
	}
	return id, true
}

// checkID accepts a missing id, a string or a number: anything else could be
// an arbitrarily deep structure echoed back, so it is refused.
func checkID(id json.RawMessage) *DecodeError {
	if len(id) == 0 {
		return nil
	}
	t := bytes.TrimSpace(id)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return nil
	}
	switch t[0] {
	case '"', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return nil
	}
	return badRequest(`"id" must be a string or a number`)
}

func jsonProblem(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		if typeErr.Field != "" {
			return fmt.Sprintf("field %q must be %s", typeErr.Field, kindName(typeErr.Type.Kind().String()))
		}
		return "frame must be a JSON object"
	}
	var syntaxErr *json.SyntaxError
	if errors.As(err, &syntaxErr) {
		return fmt.Sprintf("malformed JSON at byte %d", syntaxErr.Offset)
	}
	return "malformed JSON"
}

func kindName(k string) string {
	switch k {
	case "slice":
		return "an array"
	case "string":
		return "a string"
	case "int64", "uint64", "int", "float64":
		return "an integer"
	case "ptr", "struct", "map":
		return "an object"
	}
	return "a " + k
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// ValidMode reports whether m is a status mode.
func ValidMode(m string) bool {
	return m == ModeAuto || m == ModeDND || m == ModeInvisible
}

// ValidID reports whether s is a valid user, team or device id: 1–128 bytes
// of printable UTF-8 without control characters.
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > MaxIDBytes {
		return false
	}
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		// IsGraphic admits letters, marks, numbers, punctuation, symbols and
		// spaces; it refuses control and format characters (Cc, Cf).
		if !unicode.IsGraphic(r) {
			return false
		}
	}
	return true
}
