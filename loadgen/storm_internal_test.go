package loadgen

import (
	"testing"
	"time"

	"github.com/greendot/greendot/client"
)

// A user back within the grace whose client then drops again (a starved
// load process's write timing out) has a real offline and online later:
// they are counted apart, not as changes the storm's grace should have
// spared.
func TestStormCountsUsersDroppedAgainApart(t *testing.T) {
	o := &Options{Grace: 5 * time.Second}
	w := &stormWorker{env: &workerEnv{o: o}, byUser: map[string]*stormUser{}}
	cut := time.Now()
	w.cutAt.Store(cut.UnixNano())
	add := func(name string, team int, back time.Duration, again bool, about int64) {
		u := &stormUser{m: &member{user: name, team: team}}
		if back > 0 {
			u.back.Store(cut.Add(back).UnixNano())
		}
		u.again.Store(again)
		u.about.Store(about)
		w.users = append(w.users, u)
	}
	add("stayed", 0, 2*time.Second, false, 0)
	add("again", 0, 3*time.Second, true, 198)
	add("late", 1, 7*time.Second, false, 198)
	add("never", 1, 0, false, 99)
	r := w.collect()
	if r.Within != 2 || r.Again != 1 || r.AboutWithin != 0 || r.AboutAgain != 198 || r.AboutLate != 297 || r.NotBack != 1 {
		t.Fatalf("within %d, again %d, about within %d, about again %d, about late %d, not back %d; want 2, 1, 0, 198, 297, 1",
			r.Within, r.Again, r.AboutWithin, r.AboutAgain, r.AboutLate, r.NotBack)
	}
}

// What marks a user as dropped again: losing its connection after the
// first reconnect since the cut, not the cut itself or a failed attempt
// before it is back.
func TestStormMarksADropAfterComingBack(t *testing.T) {
	ctr := &counters{}
	env := &workerEnv{o: &Options{N: 1, TeamSize: 1, Targets: []string{"ws://127.0.0.1:1"}, Grace: 5 * time.Second}, count: 1, ctr: ctr}
	env.dial = newDialer(env.o, ctr)
	sw := newStormWorker(env).(*stormWorker)
	u := sw.users[0]
	co := sw.options(u.m)
	co.OnStateChange(client.StateChange{State: client.Connected}) // before the cut
	sw.cutAt.Store(time.Now().UnixNano())
	co.OnStateChange(client.StateChange{State: client.Disconnected}) // the cut
	co.OnStateChange(client.StateChange{State: client.Connecting})
	co.OnStateChange(client.StateChange{State: client.Disconnected}) // a failed attempt
	if u.again.Load() || u.back.Load() != 0 {
		t.Fatalf("again %v, back %d before coming back", u.again.Load(), u.back.Load())
	}
	co.OnStateChange(client.StateChange{State: client.Connected})
	if u.again.Load() || u.back.Load() == 0 {
		t.Fatalf("again %v, back %d on coming back", u.again.Load(), u.back.Load())
	}
	co.OnStateChange(client.StateChange{State: client.Disconnected})
	if !u.again.Load() {
		t.Fatal("a drop after coming back is not marked")
	}
}
