package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// A re-assertion reads a connection's status, then writes it into Redis on
// one of the pool's connections; a status change made in between goes on
// another and can reach Redis first (a slow link reorders them). The late
// re-assertion must not bring back the status it read: a device that went
// idle would show online until its next status change. Found by the chaos
// test: a user shown online where every device was away, around latency.
func TestLateReassertKeepsNewerStatus(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", 25*time.Second, 300*time.Millisecond)
	must(t, s.AddMember(ctx, "t", "bob"))
	must(t, s.Connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web"}))

	for _, tc := range []struct {
		name string
		// reassert writes back the copy read before the status change.
		reassert func(stale localConn)
	}{
		{"one connection", func(stale localConn) {
			must(t, s.connect(ctx, presence.Conn{ID: "c1", UserID: "bob", Device: "web", Node: "a"}, stale, true))
		}},
		{"recovery", func(stale localConn) {
			// recover() reads every connection, then writes them all.
			c := call{keys: userKeys("bob", ncKey(shardOf("bob"), "a")),
				args: []any{"c1", "bob", "web", "a", s.ttlMS(), boolArg(stale.active), "1", stale.statusSeq}}
			_, errs := s.evalMany(ctx, s.sc.connect, []call{c})
			must(t, errs[0])
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			must(t, s.SetStatus(ctx, "c1", true))
			s.mu.Lock()
			stale := *s.conns["c1"]
			s.mu.Unlock()
			must(t, s.SetStatus(ctx, "c1", false)) // the device goes idle
			tc.reassert(stale)

			got, err := s.Presence(ctx, []string{"bob"})
			must(t, err)
			if got[0].State != presence.Away {
				t.Fatalf("bob is %v after a late re-assertion, want away: it undid the newer status", got[0].State)
			}
			s.mu.Lock()
			local := s.conns["c1"].active
			s.mu.Unlock()
			if local {
				t.Fatal("the node's own record says active after a late re-assertion: its next re-assertion would undo the status again")
			}
			// A newer status still applies.
			must(t, s.SetStatus(ctx, "c1", true))
			got, err = s.Presence(ctx, []string{"bob"})
			must(t, err)
			if got[0].State != presence.Online {
				t.Fatalf("bob is %v after going active again, want online", got[0].State)
			}
		})
	}
}

// The server asserts a connection again through Connect when a status
// write finds it unknown (Redis lost it); the node's own re-assertion,
// which read the connection before, may land after that. Connect used to
// start the connection's count of status writes again at 0, so Redis,
// holding the re-assertion's higher count, ignored the next status writes
// (chaos, one Redis, seed 621771424, after an empty restart: viewers
// showed away for seconds a user who had gone online).
func TestConnectOfAConnectionHeldKeepsItsStatusCount(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	s, _ := mk(t, r.URL(), "a", 25*time.Second, 300*time.Millisecond)
	must(t, s.AddMember(ctx, "t", "bob"))
	conn := presence.Conn{ID: "c1", UserID: "bob", Device: "web"}
	must(t, s.Connect(ctx, conn))
	must(t, s.SetStatus(ctx, "c1", false))
	must(t, s.SetStatus(ctx, "c1", true))

	if _, err := r.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	// The device goes idle; Redis no longer knows the connection.
	if err := s.SetStatus(ctx, "c1", false); err != ErrUnknownConn {
		t.Fatalf("status write after the loss: err %v, want ErrUnknownConn", err)
	}
	s.mu.Lock()
	read := assertion{"c1", *s.conns["c1"]} // the node's re-assertion reads it
	s.mu.Unlock()
	idle := conn
	idle.Idle = true
	must(t, s.Connect(ctx, idle))          // the server asserts it again
	must(t, s.SetStatus(ctx, "c1", false)) // and writes the status again
	must(t, s.reassertAll(ctx, []assertion{read}))

	must(t, s.SetStatus(ctx, "c1", true)) // the device is active again
	got, err := s.Presence(ctx, []string{"bob"})
	must(t, err)
	if got[0].State != presence.Online {
		t.Fatalf("bob is %v after going active again, want online: Redis ignored the status write", got[0].State)
	}
}
