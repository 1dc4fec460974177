package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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
	checks := zmscoreCalls(t, r)
	v, err = run(ctx, s.rdb, s.sc.heartbeat, shardKeys(0)[:1], some...)
	if err != nil {
		t.Fatal(err)
	}
	if m := asStrings(v); len(m) != 0 {
		t.Fatalf("a batch of known ids reported %v unknown", m)
	}
	if n := zmscoreCalls(t, r) - checks; n != 0 {
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

// zmscoreCalls is how many ZMSCOREs Redis has run, scripts' included.
func zmscoreCalls(t *testing.T, r *redistest.Server) int {
	t.Helper()
	info, err := r.Do("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(info, "cmdstat_zmscore:calls=")
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
	if err != nil {
		t.Fatal(err)
	}
	return n
}
