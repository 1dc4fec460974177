package loadgen

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/greendot/greendot/client"
	"github.com/greendot/greendot/protocol"
)

// The largeteam scenario (DESIGN.md Part 1b, large teams): N members of one
// team connected (the workers hold them, as fanout's viewers), plus, held
// here, 50 subjects a viewer watches and 50 it does not. The team must be
// large on the servers (--large-team below N+101). Measured: the connect
// of the members and of the viewer (its snapshot must hold nobody of the
// team), its first team_counts, the watch of 50, then Rounds changes of a
// watched and of an unwatched subject: latency to the viewer, the server's
// fan-out per change, and nothing of the unwatched; and the server's heap
// per connected member.

const largeWatched = 50

func driveLargeTeam(ctx context.Context, d *driver) error {
	o := d.o
	team := o.team(0)
	viewer := o.RunID + "-viewer"
	watched := make([]string, largeWatched)
	unwatched := make([]string, largeWatched)
	pairs := [][2]string{{team, viewer}}
	for i := range largeWatched {
		watched[i] = fmt.Sprintf("%s-w%d", o.RunID, i)
		unwatched[i] = fmt.Sprintf("%s-x%d", o.RunID, i)
		pairs = append(pairs, [2]string{team, watched[i]}, [2]string{team, unwatched[i]})
	}
	for i := range o.N {
		pairs = append(pairs, [2]string{team, o.user(i)})
	}
	for i := range o.OfflineMembers {
		pairs = append(pairs, [2]string{team, fmt.Sprintf("%s-off%d", o.RunID, i)})
	}
	sPre, err := d.scrape(ctx)
	if err != nil {
		return err
	}
	if err := d.setupTeams(ctx, pairs); err != nil {
		return err
	}
	s0, err := d.scrape(ctx)
	if err != nil {
		return err
	}
	r, err := d.connectAndWait(ctx, "members", nil)
	if err != nil {
		return err
	}
	defer closeWorkers(ctx, d)
	dl := newDialer(o, &counters{})
	defer dl.closeIdle()
	var subjects []*client.Client
	defer func() {
		for _, c := range subjects {
			_ = c.Close()
		}
	}()
	d.setStatus("connecting the subjects")
	for i, u := range append(append([]string{}, watched...), unwatched...) {
		m := &member{user: u, device: "web", target: i % len(o.Targets)}
		c, err := dl.dial(ctx, m, dl.options(m))
		if err != nil {
			return fmt.Errorf("loadgen: subject: %w", err)
		}
		subjects = append(subjects, c)
	}
	s1, err := d.settle(ctx, 2*time.Minute)
	if err != nil {
		return err
	}

	// The viewer, on the first node: what it is told, and when.
	var mu sync.Mutex
	last := map[string]seen{} // by subject: the latest change the viewer got
	spurious := 0
	isWatched := make(map[string]bool, largeWatched)
	for _, u := range watched {
		isWatched[u] = true
	}
	vm := &member{user: viewer, device: "web"}
	vo := dl.options(vm)
	vo.OnChange = func(ch client.Change) {
		if ch.FromSnapshot {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !isWatched[ch.UserID] {
			spurious++
			return
		}
		last[ch.UserID] = seen{state: ch.State, received: ch.Received}
	}
	d.setStatus("the viewer connects")
	t0 := time.Now()
	v, err := dl.dial(ctx, vm, vo)
	if err != nil {
		return fmt.Errorf("loadgen: viewer: %w", err)
	}
	defer v.Close()
	connected := time.Since(t0)
	inSnapshot := len(v.All())
	var countsAfter time.Duration
	var counts client.TeamCount
	for deadline := time.Now().Add(10 * time.Second); ; {
		if tc := v.TeamCounts(); len(tc) > 0 {
			countsAfter, counts = time.Since(t0), tc[0]
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("loadgen: no team_counts within 10s: is the team large on the server (--large-team below %d)?", o.N+1+2*largeWatched+o.OfflineMembers)
		}
		if !sleepCtx(ctx, time.Millisecond) {
			return ctx.Err()
		}
	}
	t1 := time.Now()
	answer, err := v.Watch(ctx, watched)
	if err != nil {
		return fmt.Errorf("loadgen: watch: %w", err)
	}
	watchTook := time.Since(t1)
	online := 0
	for _, u := range answer {
		if u.State == protocol.StateOnline {
			online++
		}
	}

	// Rounds: an unwatched subject changes, then a watched one; the
	// viewer must get the second, never the first.
	var lat Histogram
	missing := 0
	s2, err := d.scrape(ctx)
	if err != nil {
		return err
	}
	for round := range o.Rounds {
		if ctx.Err() != nil {
			break
		}
		d.setStatusf(func(Progress) string { return fmt.Sprintf("round %d/%d", round+1, o.Rounds) })
		state := protocol.StateAway
		if (round/largeWatched)%2 == 1 {
			state = protocol.StateOnline
		}
		k := round % largeWatched
		if err := subjects[largeWatched+k].SetStatus(ctx, state); err != nil {
			return err
		}
		start := time.Now()
		if err := subjects[k].SetStatus(ctx, state); err != nil {
			return err
		}
		got := false
		for deadline := start.Add(10 * time.Second); time.Now().Before(deadline); {
			mu.Lock()
			s := last[watched[k]]
			mu.Unlock()
			if s.state == state && s.received.After(start) {
				lat.Record(s.received.Sub(start))
				got = true
				break
			}
			if !sleepCtx(ctx, time.Millisecond) {
				return ctx.Err()
			}
		}
		if !got {
			missing++
		}
	}
	s3, err := d.scrape(ctx)
	if err != nil {
		return err
	}
	changes := s3.Sum(mChanges) - s2.Sum(mChanges)
	fanout := (s3.Get(mFanout+"_sum") - s2.Get(mFanout+"_sum")) / max(s3.Get(mFanout+"_count")-s2.Get(mFanout+"_count"), 1)
	mu.Lock()
	spur := spurious
	mu.Unlock()

	res := d.res
	res.add("members", "members connected (besides the subjects)", float64(r.Dialed), "")
	res.add("team_size", "team members", float64(counts.MemberCount), "")
	res.add("team_online", "team members online (team_counts)", float64(counts.OnlineCount), "")
	res.add("heap_per_member_b", "server Go heap per connected member", (s1.Get(mHeap)-s0.Get(mHeap))/float64(r.Dialed+2*largeWatched), "B")
	res.add("heap_per_membership_b", "server Go heap per team member, for the membership alone", (s0.Get(mHeap)-sPre.Get(mHeap))/float64(len(pairs)), "B")
	res.addDur("viewer_connect", "viewer connect (welcome + snapshot)", connected)
	res.add("viewer_snapshot_users", "users in the viewer's snapshot", float64(inSnapshot), "")
	res.goal(0, false, "0")
	res.addDur("viewer_team_counts", "viewer connect → team_counts", countsAfter)
	res.addDur("watch_result", "watch of 50 → watch_result", watchTook)
	res.add("watch_online", "watched users online in watch_result", float64(online), "")
	res.add("rounds", "rounds", float64(o.Rounds), "")
	res.addDur("change_p50", "watched change → viewer p50", lat.Quantile(0.5))
	res.addDur("change_p99", "watched change → viewer p99", lat.Quantile(0.99))
	res.add("changes", "changes published in the rounds", changes, "")
	res.add("fanout_per_change", "server fan-out per change (connections)", fanout, "")
	res.add("missing", "watched changes the viewer missed", float64(missing), "")
	res.goal(0, false, "0")
	res.add("spurious", "changes of unwatched members the viewer got", float64(spur), "")
	res.goal(0, false, "0")
	res.serverFigures(s1, s3)
	return nil
}
