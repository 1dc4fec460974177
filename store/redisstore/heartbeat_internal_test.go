package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/greendot/greendot/store/redisstore/redistest"
)

// The heartbeat script moves known connections' deadlines in chunks of one
// ZADD and reports exactly the ids Redis does not know: those in both
// chunks of a batch past the chunk size, none for an id named twice (its
// second ZADD changes nothing), and it adds none of them.
func TestHeartbeatScriptReportsOnlyUnknownIDs(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", 10*time.Second, 300*time.Millisecond)
	dl := shardKeys(0)[0]
	const known = 2100 // three chunks of the script's 1,000
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
	// Every known deadline moved to a ttl from the script's clock.
	low, err := r.DoList("ZRANGE", dl, "0", "0", "WITHSCORES")
	if err != nil {
		t.Fatal(err)
	}
	if at, _ := strconv.ParseInt(low[1], 10, 64); at < before+s.ttlMS()-1000 {
		t.Fatalf("the earliest deadline after the batch is %d, want about %d", at, before+s.ttlMS())
	}

	// All known, no id twice: the ZADDs count every one changed, and the
	// script answers without ZMSCORE.
	some := []any{s.ttlMS()}
	for i := range 10 {
		some = append(some, "k"+strconv.Itoa(i))
	}
	v, err = run(ctx, s.rdb, s.sc.heartbeat, shardKeys(0)[:1], some...)
	if err != nil {
		t.Fatal(err)
	}
	if m := asStrings(v); len(m) != 0 {
		t.Fatalf("a batch of known ids reported %v unknown", m)
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
