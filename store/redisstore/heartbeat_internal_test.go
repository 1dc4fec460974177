package redisstore

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// The heartbeat script moves known connections' deadlines in chunks of one
// ZADD and reports exactly the ids Redis does not know: those in every
// chunk of a batch past unpack's bound (~8,000 values, so a script without
// chunks fails), none for an id named twice (its second ZADD changes
// nothing), and it adds none of them. A batch whose every deadline moves
// answers without ZMSCORE.
func TestHeartbeatScriptReportsOnlyUnknownIDs(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", 10*time.Second, 300*time.Millisecond)
	dl := shardKeys(0)[0]
	const known = 4200 // five chunks of the script's 1,000; 8,400 values to unpack at once
	zadd := []string{"ZADD", dl}
	for i := range known {
		zadd = append(zadd, "1", "k"+strconv.Itoa(i))
	}
	if _, err := r.Do(zadd...); err != nil {
		t.Fatal(err)
	}
	var args []any
	var unknown []string
	args = append(args, s.ttlMS())
	for i := range known {
		args = append(args, "k"+strconv.Itoa(i))
		if i%500 == 7 {
			id := "x" + strconv.Itoa(i)
			unknown = append(unknown, id)
			args = append(args, id)
		}
	}
	args = append(args, "k5") // twice in one batch

	before := time.Now().UnixMilli()
	v, err := run(ctx, s.rdb, s.sc.heartbeat, shardKeys(0)[:1], args...)
	after := time.Now().UnixMilli()
	if err != nil {
		t.Fatal(err)
	}
	missing := asStrings(v)
	slices.Sort(missing)
	slices.Sort(unknown)
	if !slices.Equal(missing, unknown) {
		t.Fatalf("missing = %v, want %v", missing, unknown)
	}
	if got := zcard(t, r, dl); got != known {
		t.Fatalf("the deadlines hold %d ids after the batch, want the %d known", got, known)
	}
	// Every known deadline moved to one ttl past the script's clock (the
	// same machine's: within the call's time, a millisecond either side).
	for _, end := range []string{"0", "-1"} {
		got, err := r.DoList("ZRANGE", dl, end, end, "WITHSCORES")
		if err != nil {
			t.Fatal(err)
		}
		at, _ := strconv.ParseInt(got[1], 10, 64)
		if at < before+s.ttlMS()-1 || at > after+s.ttlMS()+1 {
			t.Fatalf("deadline %s after the batch is %d, want %d-%d", got[0], at, before+s.ttlMS(), after+s.ttlMS())
		}
	}

	// All known, no id twice: the ZADDs count every one changed, and the
	// script answers without ZMSCORE.
	// A ttl longer than the batch's before moves every deadline even in
	// the same millisecond.
	some := []any{s.ttlMS() + 1000}
	for i := range 10 {
		some = append(some, "k"+strconv.Itoa(i))
	}
	checks := commandCalls(t, r, "zmscore")
	v, err = run(ctx, s.rdb, s.sc.heartbeat, shardKeys(0)[:1], some...)
	if err != nil {
		t.Fatal(err)
	}
	if m := asStrings(v); len(m) != 0 {
		t.Fatalf("a batch of known ids reported %v unknown", m)
	}
	if n := commandCalls(t, r, "zmscore") - checks; n != 0 {
		t.Fatalf("a batch whose every deadline moved ran ZMSCORE %d times", n)
	}
	if got := zcard(t, r, dl); got != known {
		t.Fatalf("the deadlines hold %d ids, want %d", got, known)
	}
}

func zcard(t *testing.T, r *redistest.Server, key string) int {
	t.Helper()
	v, err := r.Do("ZCARD", key)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatal(fmt.Errorf("ZCARD %s: %q", key, v))
	}
	return n
}

// commandCalls is how many times Redis has run cmd (lower case, as INFO
// commandstats names it), scripts' calls included.
func commandCalls(tb testing.TB, r *redistest.Server, cmd string) int {
	tb.Helper()
	info, err := r.Do("INFO", "commandstats")
	if err != nil {
		tb.Fatal(err)
	}
	_, rest, ok := strings.Cut(info, "cmdstat_"+cmd+":calls=")
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// A shard's heartbeats are written once its batch is full, or once the
// oldest of a smaller batch waited the hold; a flush of everything (Close)
// takes every batch. Each batch keeps the order heard.
func TestBeatBatchesAreDueFullOrHeld(t *testing.T) {
	const full, hold = 100, 2 * time.Second
	var b beatBatches
	start := time.Now()
	for i := range full {
		b.add(3, "f"+strconv.Itoa(i))
	}
	b.add(7, "s1")
	b.add(7, "s2")
	b.add(9, "t1")
	ids := func(due [numShards][]string) map[int][]string {
		m := map[int][]string{}
		for sh, v := range due {
			if len(v) > 0 {
				m[sh] = v
			}
		}
		return m
	}

	due, some := b.take(start.Add(hold-time.Millisecond), full, hold)
	got := ids(due)
	if !some || len(got) != 1 || len(got[3]) != full || got[3][0] != "f0" || got[3][full-1] != "f99" {
		t.Fatalf("before the hold: due %v (some %v), want only shard 3's full batch in order", got, some)
	}
	b.add(9, "t2")
	due, some = b.take(time.Now().Add(hold), full, hold)
	got = ids(due)
	if !some || len(got) != 2 || !slices.Equal(got[7], []string{"s1", "s2"}) || !slices.Equal(got[9], []string{"t1", "t2"}) {
		t.Fatalf("after the hold: due %v, want shards 7 and 9 in order", got)
	}
	if _, some := b.take(time.Now().Add(time.Hour), full, hold); some {
		t.Fatal("a batch taken is due again")
	}
	b.add(1, "u")
	if due, some := b.take(time.Now(), 0, 0); !some || !slices.Equal(due[1], []string{"u"}) {
		t.Fatalf("flushing everything left %v", ids(due))
	}
}

// The flush loop writes a small batch once the hold is over, not at its
// first tick: the deadline it sets is a ttl past the hold's end at least.
func TestSmallHeartbeatBatchWaitsTheHold(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", 10*time.Second, 300*time.Millisecond)
	hold := s.heartbeatHold()
	if hold <= s.cfg.HeartbeatFlush {
		t.Fatalf("hold %v is no longer than a flush period %v", hold, s.cfg.HeartbeatFlush)
	}
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	dl := shardKeys(shardOf("bob"))[0]
	score := func() int64 {
		v, err := r.Do("ZSCORE", dl, "c1")
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("ZSCORE %s c1: %q", dl, v)
		}
		return n
	}
	before := score()
	heard := time.Now()
	must(t, s.Heartbeat(ctx, "c1"))
	limit := time.Now().Add(10 * time.Second)
	for score() == before {
		if time.Now().After(limit) {
			t.Fatal("the heartbeat was not written in 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, min := score(), heard.Add(hold).Add(s.cfg.TTL).UnixMilli()-1; got < min {
		t.Fatalf("deadline %d ms, want at least %d: the batch of one was written %d ms after its heartbeat, within the hold %v",
			got, min, got-s.cfg.TTL.Milliseconds()-heard.UnixMilli(), hold)
	}
}

// A connection that drops (Lost: the server's cause for a TCP connection
// gone without a close frame) is last seen at its last heartbeat as its
// node heard it, though that heartbeat still waits in its batch: Redis's
// own record (the last batch written, here 5 s back) would make it seconds
// early.
func TestDroppedConnectionLastSeenAtItsLastHeartbeat(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", 4*time.Second, 0)
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	dl := shardKeys(shardOf("bob"))[0]
	batch := time.Now().Add(-5 * time.Second)
	if _, err := r.Do("ZADD", dl, "XX", strconv.FormatInt(batch.Add(s.cfg.TTL).UnixMilli(), 10), "c1"); err != nil {
		t.Fatal(err)
	}
	heard := time.Now()
	must(t, s.Heartbeat(ctx, "c1"))
	must(t, s.Disconnect(ctx, "c1", presence.Lost))
	expectLastSeen(t, s, "bob", heard, "the heartbeat (the last batch was "+batch.Format(time.StampMilli)+")")
}

// expectLastSeen checks that user, whose connection ended just now, was
// last seen between heard (what) and now, give or take Redis's ms.
func expectLastSeen(t *testing.T, s *Store, user string, heard time.Time, what string) {
	t.Helper()
	after := time.Now()
	ps, err := s.Presence(context.Background(), []string{user})
	must(t, err)
	if len(ps) != 1 {
		t.Fatalf("presence of %s: %+v", user, ps)
	}
	if seen := ps[0].LastSeen; seen.Before(heard.Add(-2*time.Millisecond)) || seen.After(after.Add(2*time.Millisecond)) {
		t.Fatalf("last seen %v, want between %s at %v and the disconnect's end %v",
			seen.Format(time.StampMilli), what, heard.Format(time.StampMilli), after.Format(time.StampMilli))
	}
}

// A status frame is a sign of life too, as on the memory store: a
// connection that drops after it is last seen then, not at its heartbeat
// before (found by TestModelSingleServer: 55 ms apart).
func TestDroppedConnectionLastSeenAtItsLastStatus(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", 4*time.Second, 0)
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	must(t, s.Heartbeat(ctx, "c1"))
	// That heartbeat was a second ago, by this node's clock.
	s.mu.Lock()
	s.conns["c1"].heard -= 1000
	s.mu.Unlock()
	heard := time.Now()
	must(t, s.SetStatus(ctx, "c1", false))
	must(t, s.Disconnect(ctx, "c1", presence.Lost))
	expectLastSeen(t, s, "bob", heard, "the status")
}

// An expiry ends with its connection the user's others on the node whose
// deadline in Redis has passed (disconnect.lua): one whose heartbeat still
// waits in its batch is alive, and stays. Its batch is written first.
func TestExpiryKeepsASiblingWhoseHeartbeatWaits(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", 10*time.Second, 0)
	must(t, s.Connect(ctx, presence.Conn{ID: "x", UserID: "bob", Device: "web"}))
	must(t, s.Connect(ctx, presence.Conn{ID: "y", UserID: "bob", Device: "ios"}))
	// Both silent for a ttl as far as Redis knows: their last batches are
	// that old.
	dl := shardKeys(shardOf("bob"))[0]
	past := strconv.FormatInt(time.Now().Add(-time.Millisecond).UnixMilli(), 10)
	if _, err := r.Do("ZADD", dl, "XX", past, "x", past, "y"); err != nil {
		t.Fatal(err)
	}
	must(t, s.Heartbeat(ctx, "y")) // y is heard from; its batch waits
	must(t, s.Disconnect(ctx, "x", presence.Expired))
	ps, err := s.Presence(ctx, []string{"bob"})
	must(t, err)
	if len(ps) != 1 || ps[0].State != presence.Online || ps[0].ConnectionCount != 1 {
		t.Fatalf("bob after x expired: %+v, want online on y alone", ps)
	}
	s.mu.Lock()
	_, live := s.conns["y"]
	s.mu.Unlock()
	if !live {
		t.Fatal("y was ended with x though its heartbeat was heard")
	}
}

// An id heard twice or more in one batch is written once, and every id of
// the batch reaches Redis as itself: the script's arguments point into it.
func TestHeartbeatsRepeatedInABatchAreWrittenOnce(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mkWith(t, Config{URL: r.URL(), Node: "a", TTL: 10 * time.Second, Grace: 300 * time.Millisecond,
		NodeTTL: 600 * time.Millisecond, HoldOff: 300 * time.Millisecond, HeartbeatFlush: time.Hour})
	// Three users of one shard: their ids share a batch.
	var users []string
	for i := 0; len(users) < 3; i++ {
		if u := "u" + strconv.Itoa(i); shardOf(u) == shardOf("bob") {
			users = append(users, u)
		}
	}
	for i, u := range users {
		must(t, s.Connect(ctx, presence.Conn{ID: "c" + strconv.Itoa(i), UserID: u, Device: "web"}))
	}
	score := func(i int) int64 {
		dl := shardKeys(shardOf(users[i]))[0]
		v, err := r.Do("ZSCORE", dl, "c"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("ZSCORE %s c%d: %q", dl, i, v)
		}
		return n
	}
	before := []int64{score(0), score(1), score(2)}
	// The deadlines move only if a millisecond passed since the connects.
	for last := time.Now().UnixMilli(); time.Now().UnixMilli() <= last+1; {
		runtime.Gosched()
	}
	for _, i := range []int{0, 1, 0, 0, 1} { // c2 sends none
		must(t, s.Heartbeat(ctx, "c"+strconv.Itoa(i)))
	}
	s.flushHeartbeats(ctx)
	for i, moved := range []bool{true, true, false} {
		if got := score(i) > before[i]; got != moved {
			t.Errorf("c%d's deadline moved: %v, want %v (%d → %d)", i, got, moved, before[i], score(i))
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.m.pipelineSize)
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 {
		t.Fatalf("gather: %v, %d families", err, len(mfs))
	}
	if sum := mfs[0].GetMetric()[0].GetHistogram().GetSampleSum(); sum != 2 {
		t.Fatalf("the batches wrote %v ids, want 2: each once", sum)
	}
	if !s.healthy.Load() {
		t.Fatal("the flush failed")
	}
}

// A shard's batch starts at the size of its last one taken (up to
// maxBatchStart), so a full batch is one allocation, not a doubling per
// power of two; an empty take does not count.
func TestBeatBatchStartsAtItsLastSize(t *testing.T) {
	var b beatBatches
	ids := make([]string, 2*maxBatchStart)
	for i := range ids {
		ids[i] = "c" + strconv.Itoa(i)
	}
	fill := func(n int) {
		for _, id := range ids[:n] {
			b.add(5, id)
		}
	}
	fill(100)
	if got := len(b.takeShard(5)); got != 100 {
		t.Fatalf("took %d, want 100", got)
	}
	b.takeShard(5) // nothing waits: says nothing of the next batch
	b.add(5, "x")
	if c := cap(b.ids[5]); c != 100 {
		t.Fatalf("after a batch of 100 the next starts at %d, want 100", c)
	}
	b.takeShard(5)
	fill(len(ids))
	b.takeShard(5)
	b.add(5, "x")
	if c := cap(b.ids[5]); c != maxBatchStart {
		t.Fatalf("after a burst of %d a batch starts at %d, want %d", len(ids), c, maxBatchStart)
	}
}
