package webhook

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/greendot/greendot/pusher"
)

// Format is how a Sender writes the request of an event. A Sender per
// format reads the same events (the Source's exactly-once queue) and
// retries on its own, so one receiver being down never holds back the
// other's webhooks.
type Format interface {
	// Body is the request body of ev, the same on every attempt; nil: ev
	// means nothing in this format and is done without a request.
	Body(ev *Event) []byte
	// Sign sets the headers that sign an attempt made at now.
	Sign(h http.Header, ev *Event, body []byte, now time.Time)
}

// standard is the Standard Webhooks format, a presence.changed per event.
type standard struct{ key Secret }

func (f standard) Body(ev *Event) []byte { return ev.Body() }

func (f standard) Sign(h http.Header, ev *Event, body []byte, now time.Time) {
	id := ev.ID()
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	h.Set("webhook-signature", f.key.Sign(id, now, body))
}

// Pusher is the format of Pusher Channels' presence webhooks, so that apps
// written against Pusher's keep working: a user's presence leaving offline
// is a member_added on the presence channel of each of their teams, entering
// it a member_removed; a change between online, away and dnd is nothing.
// A channel_occupied goes before the member_added that gives a team its
// first present member, a channel_vacated after the member_removed of its
// last (Event.Occupied, Event.Vacated). The events of one change go in one
// request (Pusher's batch format).
type Pusher struct {
	Key    string // the app key, sent as X-Pusher-Key
	Secret string // the app secret, that signs the body
}

// PusherEvent is one event of a Pusher webhook body.
type PusherEvent struct {
	Name    string `json:"name"`
	Channel string `json:"channel"`
	UserID  string `json:"user_id,omitempty"` // member events only
}

// PusherBody is the JSON of a Pusher webhook request.
type PusherBody struct {
	TimeMs int64         `json:"time_ms"`
	Events []PusherEvent `json:"events"`
}

// Pusher webhook event names.
const (
	MemberAdded     = "member_added"
	MemberRemoved   = "member_removed"
	ChannelOccupied = "channel_occupied"
	ChannelVacated  = "channel_vacated"
)

// Body implements Format. time_ms is when the change was published, not
// when the attempt is made, so that the body (and its signature) is the
// same on every retry and from every node.
func (f Pusher) Body(ev *Event) []byte {
	joins := ev.Joins()
	if !joins && !ev.Leaves() {
		return nil
	}
	b := PusherBody{TimeMs: ev.At.UnixMilli()}
	for _, team := range ev.Teams {
		ch := pusher.PrefixPresence + team
		if !pusher.ValidChannel(ch) {
			continue // no Pusher client can subscribe to it
		}
		// As Pusher orders them: the channel is occupied before its first
		// member is added, and vacated after its last is removed.
		if joins {
			if _, ok := slices.BinarySearch(ev.Occupied, team); ok {
				b.Events = append(b.Events, PusherEvent{Name: ChannelOccupied, Channel: ch})
			}
			b.Events = append(b.Events, PusherEvent{Name: MemberAdded, Channel: ch, UserID: ev.UserID})
			continue
		}
		b.Events = append(b.Events, PusherEvent{Name: MemberRemoved, Channel: ch, UserID: ev.UserID})
		if _, ok := slices.BinarySearch(ev.Vacated, team); ok {
			b.Events = append(b.Events, PusherEvent{Name: ChannelVacated, Channel: ch})
		}
	}
	if len(b.Events) == 0 {
		return nil
	}
	out, _ := json.Marshal(b)
	return out
}

// Sign implements Format: X-Pusher-Signature is the hex HMAC-SHA256 of the
// body by the app secret, as Pusher's server libraries check it.
func (f Pusher) Sign(h http.Header, _ *Event, body []byte, _ time.Time) {
	h.Set("X-Pusher-Key", f.Key)
	h.Set("X-Pusher-Signature", pusher.SignWebhook(f.Secret, body))
}
