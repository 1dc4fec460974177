package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/greendot/greendot/protocol"
)

// Watching users in large teams (v2): a server sends the members of a team
// of more than --large-team members only to the connections that watch
// them. A watch belongs to one connection on the server; the Client keeps
// the set and watches it again on every new connection.

// rewatchBatch and rewatchEvery pace the watches sent again after a
// reconnect: 100 ids cost 10 rate tokens, and the server refills 20 a
// second (heartbeats take theirs too).
const (
	rewatchBatch = 100
	rewatchEvery = 600 * time.Millisecond
)

// TeamCount is a large team's counts, as the last team_counts said.
type TeamCount = protocol.TeamCount

// Watch asks the server for the changes of userIDs (up to
// protocol.MaxWatchIDs a call, protocol.MaxWatched in all) and returns
// their presence now, one answer per id in order: users who share no team
// with the viewer come back "unknown". Their changes then reach Changes
// and Get like any other. It waits for a connection if there is none, and
// asks again on the next one if the connection drops first.
func (c *Client) Watch(ctx context.Context, userIDs []string) ([]UserPresence, error) {
	if len(userIDs) == 0 {
		return nil, nil
	}
	if len(userIDs) > protocol.MaxWatchIDs {
		return nil, fmt.Errorf("client: a watch takes at most %d user ids", protocol.MaxWatchIDs)
	}
	for _, id := range userIDs {
		if !protocol.ValidID(id) {
			return nil, fmt.Errorf("client: invalid user id %q", id)
		}
	}
	c.mu.Lock()
	fresh := 0
	for _, id := range userIDs {
		if _, ok := c.watched[id]; !ok {
			fresh++
		}
	}
	if len(c.watched)+fresh > protocol.MaxWatched {
		c.mu.Unlock()
		return nil, fmt.Errorf("client: a connection watches at most %d users; unwatch some first", protocol.MaxWatched)
	}
	if c.watched == nil {
		c.watched = make(map[string]struct{})
	}
	for _, id := range userIDs {
		c.watched[id] = struct{}{}
	}
	c.mu.Unlock()
	c.presMu.Lock()
	for _, id := range userIDs {
		c.pres.watched[id] = struct{}{}
	}
	c.presMu.Unlock()
	for {
		s, err := c.awaitSession(ctx)
		if err != nil {
			return nil, err
		}
		users, err := s.watch(ctx, userIDs, false)
		if errors.Is(err, ErrDisconnected) {
			continue
		}
		return users, err
	}
}

// Unwatch stops the changes of userIDs (up to protocol.MaxWatchIDs a
// call). Without a connection it only forgets them: the next connection
// does not watch them.
func (c *Client) Unwatch(ctx context.Context, userIDs []string) error {
	if len(userIDs) > protocol.MaxWatchIDs {
		return fmt.Errorf("client: an unwatch takes at most %d user ids", protocol.MaxWatchIDs)
	}
	for _, id := range userIDs {
		if !protocol.ValidID(id) {
			return fmt.Errorf("client: invalid user id %q", id)
		}
	}
	c.mu.Lock()
	for _, id := range userIDs {
		delete(c.watched, id)
	}
	s := c.sess
	c.mu.Unlock()
	c.presMu.Lock()
	for _, id := range userIDs {
		delete(c.pres.watched, id)
	}
	c.presMu.Unlock()
	if s == nil || len(userIDs) == 0 {
		return nil
	}
	err := s.send(ctx, protocol.TypeUnwatch, protocol.Unwatch{Type: protocol.TypeUnwatch, UserIDs: userIDs})
	if errors.Is(err, ErrDisconnected) {
		return nil // the next connection does not watch them
	}
	return err
}

// Watched lists the users watched, sorted.
func (c *Client) Watched() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.watched))
	for id := range c.watched {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// TeamCounts returns the counts of the viewer's large teams, as the server
// last told them on this connection or an earlier one, sorted by team.
func (c *Client) TeamCounts() []TeamCount {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]TeamCount, 0, len(c.teamCounts))
	for _, tc := range c.teamCounts {
		out = append(out, tc)
	}
	slices.SortFunc(out, func(a, b TeamCount) int {
		switch {
		case a.TeamID < b.TeamID:
			return -1
		case a.TeamID > b.TeamID:
			return 1
		}
		return 0
	})
	return out
}

func (c *Client) applyTeamCounts(f protocol.TeamCounts) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.teamCounts == nil {
		c.teamCounts = make(map[string]TeamCount)
	}
	for _, tc := range f.Teams {
		c.teamCounts[tc.TeamID] = tc
	}
}

// watch sends one watch frame on s and applies its answer to the map;
// again (a new connection): whatever the versions held.
func (s *session) watch(ctx context.Context, userIDs []string, again bool) ([]UserPresence, error) {
	c := s.c
	id := c.nextID("w")
	r, err := s.request(ctx, id, protocol.TypeWatch, protocol.Watch{Type: protocol.TypeWatch, ID: id.raw, UserIDs: userIDs})
	if err != nil {
		return nil, err
	}
	var changes []protocol.Change
	out := make([]UserPresence, len(r.users))
	for i, u := range r.users {
		out[i] = userPresence(u)
		if u.State == protocol.StateUnknown || u.UserID == s.welcome.UserID {
			continue
		}
		ch := protocol.Change{UserID: u.UserID, State: u.State, Version: u.Version, Text: u.Text, Emoji: u.Emoji}
		if u.Since != nil {
			ch.Since = *u.Since
		}
		if u.ExpiresAt != nil {
			ch.ExpiresAt = *u.ExpiresAt
		}
		if u.LastSeen != nil && u.State == protocol.StateOffline {
			ch.LastSeen = *u.LastSeen
		}
		changes = append(changes, ch)
	}
	c.presMu.Lock()
	var applied []Change
	if again {
		applied = c.pres.replace(changes, r.at)
	} else {
		applied = c.pres.applyChanges(changes, r.at)
	}
	c.presMu.Unlock()
	c.emit(applied)
	return out, nil
}

// rewatch watches the users watched before on a new connection, paced
// under the server's rate limit; it gives up when s ends.
func (c *Client) rewatch(s *session) {
	ids := c.Watched()
	for start := 0; start < len(ids); start += rewatchBatch {
		if start > 0 {
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(rewatchEvery):
			}
		}
		batch := ids[start:min(start+rewatchBatch, len(ids))]
		ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
		_, err := s.watch(ctx, batch, true)
		cancel()
		if err != nil {
			c.opts.Logger.Warn("greendot: watching again after a reconnect", "err", err)
			return
		}
	}
}
