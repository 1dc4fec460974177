package storetest

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/store"
)

// ChannelCountsTTL is the channel-counts ttl of the test of their expiry.
const ChannelCountsTTL = 2 * time.Second

// received records the payloads a node's OnBroadcast handler gets.
type received struct {
	mu  sync.Mutex
	got []string
}

func (r *received) handle(p []byte) {
	r.mu.Lock()
	r.got = append(r.got, string(p))
	r.mu.Unlock()
}

func (r *received) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// expectReceived waits until the payloads received are want, in order.
func (r *received) expectReceived(t *testing.T, within time.Duration, want ...string) {
	t.Helper()
	checkFor(t, within, func() error {
		if got := r.all(); !slices.Equal(got, want) {
			return fmt.Errorf("received %q, want %q", got, want)
		}
		return nil
	})
}

func broadcaster(t *testing.T, s store.Store) store.Broadcaster {
	t.Helper()
	b, ok := s.(store.Broadcaster)
	if !ok {
		t.Fatalf("%T does not implement store.Broadcaster", s)
	}
	return b
}

func channelCounter(t *testing.T, s store.Store) store.ChannelCounter {
	t.Helper()
	c, ok := s.(store.ChannelCounter)
	if !ok {
		t.Fatalf("%T does not implement store.ChannelCounter", s)
	}
	return c
}

// expectCounts waits until c's counts under prefix are want.
func expectCounts(t *testing.T, h *harness, c store.ChannelCounter, within time.Duration, prefix string, want map[string]int) {
	t.Helper()
	checkFor(t, within, func() error {
		got, err := c.ChannelCounts(h.ctx, prefix)
		if err != nil {
			return err
		}
		if got == nil || !maps.Equal(got, want) {
			return fmt.Errorf("channel counts %q = %v, want %v", prefix, got, want)
		}
		return nil
	})
}

// testBroadcast: every message reaches the sender's own handler, once, in
// the order sent; with no handler they are dropped.
func testBroadcast(t *testing.T, h *harness) {
	b := broadcaster(t, h.s)
	r := &received{}
	b.OnBroadcast(r.handle)
	var want []string
	for i := range 50 {
		want = append(want, fmt.Sprint(`{"event":"e`, i, `"}`))
		mustDo(t, b.Broadcast(h.ctx, []byte(want[i])))
	}
	r.expectReceived(t, 2*time.Second, want...)
	// Without a handler messages are dropped. A shared store delivers
	// asynchronously: one sent just before the handler is set again may
	// reach it, so this only shows that nothing breaks.
	b.OnBroadcast(nil)
	mustDo(t, b.Broadcast(h.ctx, []byte("maybe")))
	b.OnBroadcast(r.handle)
	mustDo(t, b.Broadcast(h.ctx, []byte("last")))
	checkFor(t, 2*time.Second, func() error {
		got := slices.DeleteFunc(r.all(), func(p string) bool { return p == "maybe" })
		if !slices.Equal(got, append(want, "last")) {
			return fmt.Errorf("received %q (leaving out \"maybe\"), want %q then \"last\"", got, want)
		}
		return nil
	})
}

// testChannelCounts: counts are replaced whole, zeros left out, and read
// by prefix.
func testChannelCounts(t *testing.T, h *harness) {
	c := channelCounter(t, h.s)
	expectCounts(t, h, c, 0, "", map[string]int{})
	mustDo(t, c.SetChannelCounts(h.ctx, map[string]int{"a": 1, "presence-b": 2, "presence-c": 0, "private-d": 4}))
	expectCounts(t, h, c, 0, "", map[string]int{"a": 1, "presence-b": 2, "private-d": 4})
	expectCounts(t, h, c, 0, "presence-", map[string]int{"presence-b": 2})
	expectCounts(t, h, c, 0, "nothing-", map[string]int{})
	mustDo(t, c.SetChannelCounts(h.ctx, map[string]int{"presence-b": 3}))
	expectCounts(t, h, c, 0, "", map[string]int{"presence-b": 3})
	mustDo(t, c.SetChannelCounts(h.ctx, nil))
	expectCounts(t, h, c, 0, "", map[string]int{})
}

// testChannelCountsExpire: counts not set again for the ttl stop counting;
// set again, they count again.
func testChannelCountsExpire(t *testing.T, h *harness) {
	c := channelCounter(t, h.s)
	mustDo(t, c.SetChannelCounts(h.ctx, map[string]int{"a": 2}))
	set := time.Now()
	expectCounts(t, h, c, 0, "", map[string]int{"a": 2})
	expectCounts(t, h, c, ChannelCountsTTL+3*time.Second, "", map[string]int{})
	if d := time.Since(set); d < ChannelCountsTTL-100*time.Millisecond {
		t.Fatalf("counts gone %v after they were set, before the ttl (%v)", d, ChannelCountsTTL)
	}
	mustDo(t, c.SetChannelCounts(h.ctx, map[string]int{"b": 1}))
	expectCounts(t, h, c, 0, "", map[string]int{"b": 1})
}

// testMemberInfos: infos per team member, aligned with the users asked
// for, deleted by an empty info and with the membership.
func testMemberInfos(t *testing.T, h *harness) {
	mi, ok := h.s.(store.MemberInfos)
	if !ok {
		t.Fatalf("%T does not implement store.MemberInfos", h.s)
	}
	expect := func(team string, users []string, want ...string) {
		t.Helper()
		got, err := mi.MemberInfos(h.ctx, team, users)
		mustDo(t, err)
		if len(got) != len(users) {
			t.Fatalf("infos of %q in %s: %d answers", users, team, len(got))
		}
		for i := range users {
			if (want[i] == "") != (got[i] == nil) || !bytes.Equal(got[i], []byte(want[i])) {
				t.Fatalf("info of %s in %s = %q (nil %v), want %q", users[i], team, got[i], got[i] == nil, want[i])
			}
		}
	}
	for _, u := range []string{"amy", "bob"} {
		mustDo(t, h.s.AddMember(h.ctx, "t1", u))
	}
	mustDo(t, h.s.AddMember(h.ctx, "t2", "bob"))
	buf := []byte(`{"name":"Bob"}`)
	mustDo(t, mi.SetMemberInfo(h.ctx, "t1", "bob", buf))
	copy(buf, "XXXX") // the store keeps its own copy
	mustDo(t, mi.SetMemberInfo(h.ctx, "t1", "amy", []byte(`{"name":"Amy"}`)))
	mustDo(t, mi.SetMemberInfo(h.ctx, "t2", "bob", []byte(`{"name":"Robert"}`)))
	expect("t1", []string{"bob", "nobody", "amy", "bob"}, `{"name":"Bob"}`, "", `{"name":"Amy"}`, `{"name":"Bob"}`)
	expect("t2", []string{"amy", "bob"}, "", `{"name":"Robert"}`)
	expect("t9", []string{"bob"}, "")
	expect("t1", nil)

	mustDo(t, mi.SetMemberInfo(h.ctx, "t1", "amy", []byte(`{"name":"Amy B."}`)))
	expect("t1", []string{"amy"}, `{"name":"Amy B."}`)
	mustDo(t, mi.SetMemberInfo(h.ctx, "t1", "amy", nil))
	expect("t1", []string{"amy", "bob"}, "", `{"name":"Bob"}`)

	mustDo(t, h.s.RemoveMember(h.ctx, "t1", "bob"))
	expect("t1", []string{"bob"}, "")
	expect("t2", []string{"bob"}, `{"name":"Robert"}`) // another team's membership
	mustDo(t, h.s.AddMember(h.ctx, "t1", "bob"))
	expect("t1", []string{"bob"}, "") // a new membership starts without one

	// A subscription's info written after a removal that overtook its add
	// is not kept: nothing would ever remove it.
	mustDo(t, h.s.RemoveMember(h.ctx, "t1", "bob"))
	mustDo(t, mi.SetMemberInfo(h.ctx, "t1", "bob", []byte(`{"name":"Late"}`)))
	expect("t1", []string{"bob"}, "")
	mustDo(t, h.s.AddMember(h.ctx, "t1", "bob"))
	expect("t1", []string{"bob"}, "")
}

// testBroadcastTwoNodes: a message sent by either node reaches both, the
// sender included, in each sender's order.
func testBroadcastTwoNodes(t *testing.T, sh Shared) {
	a, b := node(t, sh, "node-a"), node(t, sh, "node-b")
	ra, rb := &received{}, &received{}
	broadcaster(t, a.s).OnBroadcast(ra.handle)
	broadcaster(t, b.s).OnBroadcast(rb.handle)
	var fromA, fromB []string
	for i := range 20 {
		fromA = append(fromA, fmt.Sprint("a", i))
		fromB = append(fromB, fmt.Sprint("b", i))
		mustDo(t, broadcaster(t, a.s).Broadcast(a.ctx, []byte(fromA[i])))
		mustDo(t, broadcaster(t, b.s).Broadcast(b.ctx, []byte(fromB[i])))
	}
	for name, r := range map[string]*received{"node-a": ra, "node-b": rb} {
		checkFor(t, 2*time.Second, func() error {
			got := r.all()
			var gotA, gotB []string
			for _, p := range got {
				if p[0] == 'a' {
					gotA = append(gotA, p)
				} else {
					gotB = append(gotB, p)
				}
			}
			if !slices.Equal(gotA, fromA) || !slices.Equal(gotB, fromB) {
				return fmt.Errorf("%s received %q, want %q and %q each in order", name, got, fromA, fromB)
			}
			return nil
		})
	}
}

// testChannelCountsTwoNodes: any node reads the counts of all nodes summed.
func testChannelCountsTwoNodes(t *testing.T, sh Shared) {
	a, b := node(t, sh, "node-a"), node(t, sh, "node-b")
	ca, cb := channelCounter(t, a.s), channelCounter(t, b.s)
	mustDo(t, ca.SetChannelCounts(a.ctx, map[string]int{"presence-x": 2, "y": 1}))
	mustDo(t, cb.SetChannelCounts(b.ctx, map[string]int{"presence-x": 3, "z": 5}))
	for _, h := range []*harness{a, b} {
		c := channelCounter(t, h.s)
		expectCounts(t, h, c, 0, "", map[string]int{"presence-x": 5, "y": 1, "z": 5})
		expectCounts(t, h, c, 0, "presence-", map[string]int{"presence-x": 5})
	}
	mustDo(t, cb.SetChannelCounts(b.ctx, map[string]int{"z": 1}))
	expectCounts(t, a, ca, 0, "", map[string]int{"presence-x": 2, "y": 1, "z": 1})
}
