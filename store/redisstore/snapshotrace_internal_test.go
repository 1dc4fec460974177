package redisstore

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// flushAfterFirst runs each pipeline's commands one at a time and, once,
// FLUSHALLs Redis right after the first of a snapshot read (one that
// checks a sweep record): a data loss landing between two of its commands,
// as a FLUSHALL can.
type flushAfterFirst struct {
	r    *redistest.Server
	once sync.Once
	on   atomic.Bool
}

func checksSweepRecord(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if c.Name() != "mget" {
			continue
		}
		for _, a := range c.Args()[1:] {
			if k, ok := a.(string); ok && strings.HasSuffix(k, "}:ls") {
				return true
			}
		}
	}
	return false
}

func (f *flushAfterFirst) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *flushAfterFirst) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (f *flushAfterFirst) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !f.on.Load() || !checksSweepRecord(cmds) {
			return next(ctx, cmds)
		}
		var first error
		for i, c := range cmds {
			if err := next(ctx, []redis.Cmder{c}); err != nil && first == nil && !errors.Is(err, redis.Nil) {
				first = err
			}
			if i == 0 {
				f.once.Do(func() { _, _ = f.r.Do("FLUSHALL") })
			}
		}
		return first
	}
}

// A snapshot read that a FLUSHALL lands in the middle of either shows the
// state from before it or is refused; it never shows users offline
// because their keys went between the check and the read (chaos, cluster:
// a snapshot at the moment of a FLUSHALL listed a live user offline).
func TestSnapshotReadAcrossAFlushIsWholeOrRefused(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", 25*time.Second, 300*time.Millisecond)
	must(t, s.AddMember(ctx, "t", "bob"))
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))
	must(t, s.Sweep(ctx)) // the sweep record a whole read checks
	hook := &flushAfterFirst{r: r}
	s.rdb.AddHook(hook)
	hook.on.Store(true)
	ps, err := s.WholeStates(ctx, []string{"bob"})
	hook.on.Store(false)
	switch {
	case errors.Is(err, ErrRecovering):
	case err != nil:
		t.Fatal(err)
	case ps[0].State != presence.Online:
		t.Fatalf("a read across a FLUSHALL answered bob %v without an error: a snapshot would show him offline", ps[0].State)
	}
}
