package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/webhook"
)

// Occupancy for Pusher's channel_occupied and channel_vacated. A change is
// decided in its user's slot and a team's members live in the team's, so
// no script can count a team's present members as the change happens (a
// script touches one slot). Instead the node delivering a member event in
// Pusher's format applies it, before its first attempt, to the team's
// record in the team's slot (occupancy.lua): a count of members present,
// kept by the version of each member's last event, so that retries, a
// node claiming the event of a dead one, and a user's events taken out of
// order all leave the count as the events' order makes it. An event that
// would take the count across zero is checked against the truth first,
// which mends a record that missed events (a full queue dropped them,
// Redis lost the record, or it was made after the members came).

func teamOccKey(team string) string { return "gd:{t:" + team + "}:oc" }

var _ webhook.Preparer = (*whQueue)(nil)

// Prepare implements webhook.Preparer for the Pusher format's queue; the
// Standard Webhooks format needs nothing.
func (q *whQueue) Prepare(ctx context.Context, ev *webhook.Event) error {
	if q.group != PusherWebhookGroup {
		return nil
	}
	return q.s.occupancy(ctx, ev)
}

// occupancy sets ev.Occupied and ev.Vacated: the same on every call for
// the same event, however many nodes make it.
func (s *Store) occupancy(ctx context.Context, ev *webhook.Event) error {
	joins := ev.Joins()
	if (!joins && !ev.Leaves()) || len(ev.Teams) == 0 {
		return nil
	}
	present := 0
	if joins {
		present = 1
	}
	version := strconv.FormatUint(ev.Version, 10)
	calls := make([]call, len(ev.Teams))
	for i, t := range ev.Teams {
		calls[i] = call{keys: []string{teamOccKey(t)}, args: []any{ev.UserID, version, present, 0}}
	}
	replies, errs := s.evalMany(ctx, s.sc.occupancy, calls)
	var check []int // teams whose count the event would take across zero
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("redisstore: occupancy of %q: %w", ev.Teams[i], errors.Join(ErrUnavailable, err))
		}
		if r, ok := replies[i].(string); ok && r == "check" {
			check = append(check, i)
		}
	}
	for _, i := range check {
		truth, err := s.occupancyTruth(ctx, ev.Teams[i])
		if err != nil {
			return err
		}
		r, err := run(ctx, s.rdb, s.sc.occupancy, calls[i].keys, append([]any{ev.UserID, version, present, 1}, truth...)...)
		if err != nil {
			return fmt.Errorf("redisstore: occupancy of %q: %w", ev.Teams[i], errors.Join(ErrUnavailable, err))
		}
		replies[i] = r
	}
	ev.Occupied, ev.Vacated = nil, nil
	for i, t := range ev.Teams { // sorted, so are both lists
		switch toInt(replies[i]) {
		case 1:
			ev.Occupied = append(ev.Occupied, t)
		case -1:
			ev.Vacated = append(ev.Vacated, t)
		}
	}
	return nil
}

// occupancyTruth reads team's members' states as occupancy.lua takes them:
// user, version, present (shown as anything but offline). It fails while
// Redis is recovering from a data loss, when members not written back yet
// would read as offline: the attempt is retried later.
func (s *Store) occupancyTruth(ctx context.Context, team string) ([]any, error) {
	members, err := s.Members(ctx, team)
	if err != nil {
		return nil, err
	}
	states, err := s.WholeStates(ctx, members)
	if err != nil {
		return nil, fmt.Errorf("redisstore: occupancy of %q: %w", team, err)
	}
	out := make([]any, 0, 3*len(states))
	for _, p := range states {
		present := 0
		if p.State != presence.Offline {
			present = 1
		}
		out = append(out, p.UserID, strconv.FormatUint(p.Version, 10), present)
	}
	return out, nil
}
