package pusher

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Event names of the protocol.
const (
	EventConnectionEstablished = "pusher:connection_established"
	EventError                 = "pusher:error"
	EventPing                  = "pusher:ping"
	EventPong                  = "pusher:pong"
	EventSubscribe             = "pusher:subscribe"
	EventUnsubscribe           = "pusher:unsubscribe"
	EventSignin                = "pusher:signin"
	EventSigninSuccess         = "pusher:signin_success"
	EventSubscriptionError     = "pusher:subscription_error"
	EventSubscriptionSucceeded = "pusher_internal:subscription_succeeded"
	EventMemberAdded           = "pusher_internal:member_added"
	EventMemberRemoved         = "pusher_internal:member_removed"
)

type wireFrame struct {
	Event   string          `json:"event"`
	Channel string          `json:"channel,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
	UserID  string          `json:"user_id,omitempty"`
}

// marshal encodes v without escaping <, > and &: pusher-js does not need it,
// and user_info is relayed closer to what the application wrote.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil
}

func mustMarshal(v any) []byte {
	b, err := marshal(v)
	if err != nil {
		// Every caller passes values the server built; failing here is a bug.
		panic(fmt.Sprintf("pusher: cannot encode frame: %v", err))
	}
	return b
}

// Frame returns a server-to-client frame whose data is data marshalled to JSON
// and then sent as a JSON string, the double encoding Pusher uses for its
// pusher: events and channel events. channel is omitted when "". It panics
// when data cannot be marshalled.
func Frame(event, channel string, data any) []byte {
	inner := mustMarshal(data)
	return mustMarshal(wireFrame{Event: event, Channel: channel, Data: mustMarshal(string(inner))})
}

// FrameRaw returns a frame whose data is embedded as it is: a JSON value such
// as a client event's data from Decode, or a REST event's data string
// marshalled once. data is omitted when empty, and user_id when "". It panics
// when data is not valid JSON.
func FrameRaw(event, channel string, data json.RawMessage, userID string) []byte {
	return mustMarshal(wireFrame{Event: event, Channel: channel, Data: data, UserID: userID})
}

// ErrorFrame returns a pusher:error frame. Its data is an object, not a
// string, as Pusher sends it.
func ErrorFrame(code int, message string) []byte {
	type data struct {
		Code    *int   `json:"code"` // null: no specific code, as Pusher sends for a frame it refuses
		Message string `json:"message"`
	}
	d := data{Message: message}
	if code != 0 {
		d.Code = &code
	}
	return mustMarshal(struct {
		Event string `json:"event"`
		Data  data   `json:"data"`
	}{EventError, d})
}

// SubscriptionError returns the pusher:subscription_error that pusher-js
// hands to the channel's error callback, e.g. typ "AuthError", status 401.
func SubscriptionError(channel, typ, msg string, status int) []byte {
	type data struct {
		Type   string `json:"type"`
		Error  string `json:"error"`
		Status int    `json:"status"`
	}
	return mustMarshal(struct {
		Event   string `json:"event"`
		Channel string `json:"channel"`
		Data    data   `json:"data"`
	}{EventSubscriptionError, channel, data{typ, msg, status}})
}

// Incoming is a client-to-server frame.
type Incoming struct {
	Event   string
	Channel string          // "" when absent
	Data    json.RawMessage // as sent; nil when absent or null
}

// Decode reads a client frame: a JSON object with a non-empty string "event",
// an optional string "channel" and optional "data" of any JSON type. Keys
// match exactly, as Pusher's do.
func Decode(b []byte) (Incoming, error) {
	var m map[string]json.RawMessage
	if err := decodeObject(b, &m); err != nil {
		return Incoming{}, fmt.Errorf("%w: %v", ErrBadFrame, err)
	}
	var in Incoming
	ev, ok := m["event"]
	if !ok || string(ev) == "null" {
		return Incoming{}, fmt.Errorf("%w: no event", ErrBadFrame)
	}
	if err := jsonString(ev, &in.Event); err != nil || in.Event == "" {
		return Incoming{}, fmt.Errorf("%w: event must be a non-empty string", ErrBadFrame)
	}
	if ch, ok := m["channel"]; ok && string(ch) != "null" {
		if err := jsonString(ch, &in.Channel); err != nil {
			return Incoming{}, fmt.Errorf("%w: channel must be a string", ErrBadFrame)
		}
	}
	if d, ok := m["data"]; ok && string(d) != "null" {
		in.Data = d
	}
	return in, nil
}

// jsonString unmarshals raw into s only when raw is a JSON string.
func jsonString(raw json.RawMessage, s *string) error {
	if len(raw) == 0 || raw[0] != '"' {
		return fmt.Errorf("not a string")
	}
	return json.Unmarshal(raw, s)
}

// Subscribe is a pusher:subscribe's data.
type Subscribe struct {
	Channel     string
	Auth        string // "" for a public channel
	ChannelData string // presence only; the exact string the auth signs
}

// Signin is a pusher:signin's data.
type Signin struct {
	Auth     string
	UserData string // the exact string the auth signs
}

// dataObject returns the fields of a pusher: event's data, which is an object
// or, from some old clients, a JSON string holding the object.
func dataObject(data json.RawMessage) (map[string]json.RawMessage, error) {
	data = bytes.TrimLeft(data, " \t\r\n")
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return nil, fmt.Errorf("%w: data is not valid JSON", ErrBadFrame)
		}
		data = []byte(s)
	}
	var m map[string]json.RawMessage
	if err := decodeObject(data, &m); err != nil {
		return nil, fmt.Errorf("%w: data: %v", ErrBadFrame, err)
	}
	return m, nil
}

// field reads the string field name of m; required fields must be non-empty.
func field(m map[string]json.RawMessage, name string, required bool) (string, error) {
	raw, ok := m[name]
	if !ok || string(raw) == "null" {
		if required {
			return "", fmt.Errorf("%w: data.%s is missing", ErrBadFrame, name)
		}
		return "", nil
	}
	var s string
	if err := jsonString(raw, &s); err != nil {
		return "", fmt.Errorf("%w: data.%s must be a string", ErrBadFrame, name)
	}
	if required && s == "" {
		return "", fmt.Errorf("%w: data.%s is empty", ErrBadFrame, name)
	}
	return s, nil
}

// DecodeSubscribe reads a pusher:subscribe's data {channel, auth, channel_data}.
// It checks types only; the channel name and auth are the caller's to judge.
func DecodeSubscribe(data json.RawMessage) (Subscribe, error) {
	m, err := dataObject(data)
	if err != nil {
		return Subscribe{}, err
	}
	var s Subscribe
	if s.Channel, err = field(m, "channel", true); err != nil {
		return Subscribe{}, err
	}
	if s.Auth, err = field(m, "auth", false); err != nil {
		return Subscribe{}, err
	}
	if s.ChannelData, err = field(m, "channel_data", false); err != nil {
		return Subscribe{}, err
	}
	return s, nil
}

// DecodeSignin reads a pusher:signin's data {auth, user_data}, both required.
func DecodeSignin(data json.RawMessage) (Signin, error) {
	m, err := dataObject(data)
	if err != nil {
		return Signin{}, err
	}
	var s Signin
	if s.Auth, err = field(m, "auth", true); err != nil {
		return Signin{}, err
	}
	if s.UserData, err = field(m, "user_data", true); err != nil {
		return Signin{}, err
	}
	return s, nil
}

// DecodeUnsubscribe reads a pusher:unsubscribe's data {channel}.
func DecodeUnsubscribe(data json.RawMessage) (string, error) {
	m, err := dataObject(data)
	if err != nil {
		return "", err
	}
	return field(m, "channel", true)
}

// Member is one user of a presence channel.
type Member struct {
	ID   string
	Info json.RawMessage // nil encodes as {}
}

type presenceData struct {
	Presence struct {
		IDs   []string                   `json:"ids"`
		Hash  map[string]json.RawMessage `json:"hash"`
		Count int                        `json:"count"`
	} `json:"presence"`
}

// PresenceData returns the data of pusher_internal:subscription_succeeded
// on a presence channel, for Frame: {"presence":{"ids":[...],"hash":{...},
// "count":n}}. ids keep the given order; a repeated id counts once, with the
// info of its first appearance.
func PresenceData(members []Member) any {
	var d presenceData
	d.Presence.IDs = make([]string, 0, len(members))
	d.Presence.Hash = make(map[string]json.RawMessage, len(members))
	for _, m := range members {
		if _, dup := d.Presence.Hash[m.ID]; dup {
			continue
		}
		info := m.Info
		if len(info) == 0 {
			info = json.RawMessage("{}")
		}
		d.Presence.IDs = append(d.Presence.IDs, m.ID)
		d.Presence.Hash[m.ID] = info
	}
	d.Presence.Count = len(d.Presence.IDs)
	return d
}
