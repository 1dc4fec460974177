package redisstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// ordered records membership and presence events in the order the store
// dispatched them, holding the first removal until let go.
type ordered struct {
	mu      sync.Mutex
	seq     []string
	holding chan struct{} // closed once the removal is held
	release chan struct{}
	held    bool
}

func (o *ordered) note(s string) {
	o.mu.Lock()
	o.seq = append(o.seq, s)
	o.mu.Unlock()
}

func (o *ordered) OnPresence(ev store.PresenceEvent) {
	o.note(fmt.Sprintf("presence %s=%s", ev.Change.UserID, ev.Change.State))
}

func (o *ordered) OnMembership(ev store.MembershipEvent) {
	o.note(fmt.Sprintf("membership %s %s %v", ev.Team, ev.UserID, ev.Joined))
	o.mu.Lock()
	hold := !ev.Joined && !o.held
	o.held = o.held || hold
	o.mu.Unlock()
	if hold {
		close(o.holding)
		<-o.release
		o.note("membership applied")
	}
}

func (o *ordered) events() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.seq)
}

// On one Redis a node hears membership and presence events in the order
// they were published: a change published after a removal is dispatched
// only once the removal was applied, so it cannot reach the removed member
// through the team it left. They used to come on two connections, each
// with its reader: a node cut off from Redis got both at the heal, and
// passed a change made after a removal to the removed member (chaos, one
// Redis, seed 8888206: visibility).
func TestMembershipAndPresenceEventsArriveInPublishOrder(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	a, _ := mk(t, r.URL(), "a", 10*time.Second, 100*time.Millisecond)
	b, _ := mk(t, r.URL(), "b", 10*time.Second, 100*time.Millisecond)
	o := &ordered{holding: make(chan struct{}), release: make(chan struct{})}
	b.Subscribe(o)
	must(t, a.AddMember(ctx, "t", "bob"))
	must(t, a.AddMember(ctx, "t", "carol"))
	must(t, a.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	testwait.For(t, 10*time.Second, func() error {
		if got := o.events(); !slices.Contains(got, "membership t carol true") || !slices.Contains(got, "presence bob=online") {
			return fmt.Errorf("events %q: the setup's not all in", got)
		}
		return nil
	})
	o.mu.Lock()
	o.seq = nil
	o.mu.Unlock()
	released := false
	defer func() {
		if !released {
			close(o.release)
		}
	}()

	must(t, a.RemoveMember(ctx, "t", "carol"))
	select {
	case <-o.holding:
	case <-time.After(10 * time.Second):
		t.Fatalf("the removal never reached b; events %q", o.events())
	}
	must(t, a.SetStatus(ctx, "c1", false))  // published after the removal
	must(t, a.AddMember(ctx, "t2", "dave")) // and this after the change
	close(o.release)
	released = true

	want := []string{"membership t carol false", "membership applied", "presence bob=away", "membership t2 dave true"}
	testwait.For(t, 10*time.Second, func() error {
		if got := o.events(); len(got) < len(want) {
			return fmt.Errorf("events %q, want %q", got, want)
		}
		return nil
	})
	if got := o.events(); !slices.Equal(got, want) {
		t.Fatalf("events in the order b dispatched them: %q, want %q", got, want)
	}
}
