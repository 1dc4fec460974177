package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/pusher"
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
// order all leave the count as the events' order makes it. A leave that
// leaves at most one member counted is checked against the truth first,
// which mends a record that missed events (a full queue dropped them, Redis
// lost the record, it was made after the members came, a removal was
// missed).

func teamOccKey(team string) string { return "gd:{t:" + team + "}:oc" }

// occupancyTruthMax bounds the members a check reads: a larger team's
// vacancy is decided on its count alone (docs/pusher.md).
const occupancyTruthMax = 10000

var _ webhook.Preparer = (*whQueue)(nil)

// Prepare implements webhook.Preparer for the Pusher format's queue; the
// Standard Webhooks format needs nothing. It is called by the Sender's
// workers, concurrently with the queue's other methods: it touches none of
// their state.
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
	if !joins && !ev.Leaves() {
		return nil
	}
	present := 0
	if joins {
		present = 1
	}
	version := strconv.FormatUint(ev.Version, 10)
	var teams []string
	var calls []call
	for _, t := range ev.Teams {
		if pusher.ValidChannel(pusher.PrefixPresence + t) { // else no webhook names it
			teams = append(teams, t)
			calls = append(calls, call{keys: []string{teamOccKey(t)}, args: []any{ev.UserID, version, present, "0"}})
		}
	}
	if len(calls) == 0 {
		return nil
	}
	replies, errs := s.evalMany(ctx, s.sc.occupancy, calls)
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("redisstore: occupancy of %q: %w", teams[i], errors.Join(ErrUnavailable, err))
		}
		if r, ok := replies[i].(string); !ok || r != "check" {
			continue
		}
		// A leave that may vacate the team: read who is in it first.
		truth, err := s.occupancyTruth(ctx, teams[i])
		if err != nil {
			return fmt.Errorf("redisstore: occupancy of %q: %w", teams[i], err)
		}
		if replies[i], err = run(ctx, s.rdb, s.sc.occupancy, calls[i].keys, append([]any{ev.UserID, version, present}, truth...)...); err != nil {
			return fmt.Errorf("redisstore: occupancy of %q: %w", teams[i], errors.Join(ErrUnavailable, err))
		}
	}
	ev.Occupied, ev.Vacated = nil, nil
	for i, t := range teams { // sorted, so are both lists
		switch toInt(replies[i]) {
		case 1:
			ev.Occupied = append(ev.Occupied, t)
		case -1:
			ev.Vacated = append(ev.Vacated, t)
		}
	}
	return nil
}

// occupancyTruth is the rest of occupancy.lua's ARGV for a check of team:
// "1" and its members' states as user, version, present (shown as anything
// but offline); or "2" alone for a team past occupancyTruthMax. It fails
// while Redis is recovering from a data loss, when members not written back
// yet would read as offline: the attempt is retried later.
func (s *Store) occupancyTruth(ctx context.Context, team string) ([]any, error) {
	members, err := s.rdb.SMembers(ctx, teamKey(team)).Result()
	if err != nil {
		return nil, errors.Join(ErrUnavailable, err)
	}
	if len(members) > occupancyTruthMax {
		return []any{"2"}, nil
	}
	slices.Sort(members)
	states, err := s.WholeStates(ctx, members)
	if err != nil {
		return nil, err
	}
	out := make([]any, 0, 1+3*len(states))
	out = append(out, "1")
	for _, p := range states {
		present := 0
		if p.State != presence.Offline {
			present = 1
		}
		out = append(out, p.UserID, strconv.FormatUint(p.Version, 10), present)
	}
	return out, nil
}
