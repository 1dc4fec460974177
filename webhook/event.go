// Package webhook sends presence.changed webhooks in the Standard Webhooks
// format: one signed POST per published change of a user's state, retried
// with exponential backoff and jitter until a 2xx or the retry window ends.
//
// Events wait in a Source: on Redis, one stream per shard that the
// transition script itself appends to (store/redisstore), read by every
// node in one consumer group; on the memory store, a bounded in-process
// queue (MemQueue). A Sender delivers them with workers of its own, so a
// slow receiver never slows presence. See docs/webhooks.md.
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/greendot/greendot/presence"
)

// Event is one presence.changed webhook.
type Event struct {
	UserID   string
	State    presence.State
	Previous presence.State
	Version  uint64
	At       time.Time // when the change was published
	LastSeen time.Time // zero unless State is offline
	Teams    []string  // sorted
	Text     string    // the status text and emoji shown, when set
	Emoji    string
	// Occupied and Vacated (sorted) are the teams this change took from no
	// present member to one, and from one to none: Pusher's
	// channel_occupied and channel_vacated. Set by the memory store with
	// the change, or by a Preparer before the first attempt.
	Occupied, Vacated []string

	// Epoch tells apart the events of stores whose versions may repeat
	// (the memory store restarts at 1): it is part of the id.
	Epoch string
	// Ref is the Source's handle on the event (a stream entry).
	Ref string
	// Dropped counts events the Source dropped to make room for this one
	// (the Redis stream says so in the entry that made the room).
	Dropped int
}

// ID is the event's webhook-id: the same on every retry, from every node,
// and different for every change (a user's versions only increase).
func (e *Event) ID() string {
	h := sha256.New()
	h.Write([]byte(e.Epoch))
	h.Write([]byte{0})
	h.Write([]byte(e.UserID))
	h.Write([]byte{0})
	h.Write([]byte(strconv.FormatUint(e.Version, 10)))
	return "msg_" + hex.EncodeToString(h.Sum(nil)[:16])
}

// FromChange is the event of a published change.
func FromChange(c presence.Change, teams []string, epoch string) *Event {
	return &Event{
		UserID: c.UserID, State: c.State, Previous: c.Previous, Version: c.Version,
		At: c.At, LastSeen: c.LastSeen, Teams: teams, Text: c.Text, Emoji: c.Emoji, Epoch: epoch,
	}
}

// Joins tells whether the event takes the user from offline to present
// (a member_added in Pusher's terms), Leaves the other way round.
func (e *Event) Joins() bool { return e.Previous == presence.Offline && e.State != presence.Offline }

// Leaves: see Joins.
func (e *Event) Leaves() bool { return e.Previous != presence.Offline && e.State == presence.Offline }

// body is the JSON of a presence.changed request.
type body struct {
	Type      string `json:"type"`
	Timestamp string `json:"timestamp"`
	Data      data   `json:"data"`
}

type data struct {
	UserID        string   `json:"user_id"`
	State         string   `json:"state"`
	PreviousState string   `json:"previous_state"`
	Version       uint64   `json:"version"`
	At            int64    `json:"at"`
	LastSeen      *int64   `json:"last_seen"`
	Teams         []string `json:"teams"`
	Text          string   `json:"text,omitempty"`
	Emoji         string   `json:"emoji,omitempty"`
}

// Type is the event type of every webhook greendot sends.
const Type = "presence.changed"

// Body is the request body: the same bytes on every retry, since it
// depends on the event alone.
func (e *Event) Body() []byte {
	d := data{
		UserID: e.UserID, State: e.State.String(), PreviousState: e.Previous.String(),
		Version: e.Version, At: e.At.UnixMilli(), Teams: e.Teams, Text: e.Text, Emoji: e.Emoji,
	}
	if d.Teams == nil {
		d.Teams = []string{}
	}
	if !e.LastSeen.IsZero() {
		ms := e.LastSeen.UnixMilli()
		d.LastSeen = &ms
	}
	b, _ := json.Marshal(body{Type: Type, Timestamp: e.At.UTC().Format("2006-01-02T15:04:05.000Z07:00"), Data: d})
	return b
}

// Secret is a signing key, parsed from whsec_<base64>.
type Secret []byte

// ParseSecret reads a secret as Standard Webhooks writes it: "whsec_"
// followed by the key in standard base64 (the prefix is optional).
func ParseSecret(s string) (Secret, error) {
	raw := strings.TrimPrefix(s, "whsec_")
	if raw == "" {
		return nil, errors.New("webhook secret is empty (want whsec_<base64>)")
	}
	key, err := base64.StdEncoding.DecodeString(raw)
	if err != nil {
		return nil, errors.New("webhook secret is not whsec_<base64>: " + err.Error())
	}
	if len(key) < 16 {
		return nil, errors.New("webhook secret is shorter than 16 bytes once decoded; use 24 to 64 random bytes")
	}
	return key, nil
}

// Sign is the webhook-signature header of body sent as id at ts:
// v1,<base64 HMAC-SHA256(key, id.ts.body)>.
func (k Secret) Sign(id string, ts time.Time, body []byte) string {
	m := hmac.New(sha256.New, k)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(strconv.FormatInt(ts.Unix(), 10)))
	m.Write([]byte{'.'})
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}
