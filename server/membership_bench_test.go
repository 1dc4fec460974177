package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/presence"
	"github.com/greendot/greendot/server"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/memstore"
	"github.com/greendot/greendot/store/redisstore"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// BenchmarkMembershipPut measures PUT /v1/teams/{team}/members/{user} for
// a user already in 1, 1,000 or 20,000 teams, through a real server: the
// HTTP request, the store's write and event, and the node's handling of
// that event (waited for: on Redis it arrives on Pub/Sub after the answer).
// One viewer is connected, a member of the team joined and of one team of
// its own, so the event has someone to decide about. Each op is one PUT;
// the DELETE that undoes it runs with the timer stopped.
//
//	go test -run XXX -bench MembershipPut -benchtime 200x ./server
func BenchmarkMembershipPut(b *testing.B) {
	for _, kind := range []string{"memory", "redis"} {
		for _, teams := range []int{1, 1000, 20000} {
			b.Run(fmt.Sprintf("store=%s/teams=%d", kind, teams), func(b *testing.B) { benchMembershipPut(b, kind, teams) })
		}
	}
}

func benchMembershipPut(b *testing.B, kind string, teams int) {
	const long = time.Hour // nothing expires while the benchmark runs
	ctx := context.Background()
	c := &counter{}
	var st store.Store
	switch kind {
	case "memory":
		m, err := memstore.New(memstore.Config{TTL: long, Grace: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		seed(b, m, teams)
		st = memEvents{m, c}
	case "redis":
		r := redistest.Start(b)
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		rs, err := redisstore.New(sctx, redisstore.Config{URL: r.URL(), Node: "bench", TTL: long, Grace: time.Second,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = rs.Close() })
		seed(b, rs, teams)
		st = redisEvents{rs, c}
	}
	srv, err := server.New(server.Config{
		Addr: "127.0.0.1:0", Store: st, TTL: long, HeartbeatInterval: long / 2,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	client := &http.Client{}
	call := func(method, team, user string) {
		req, err := http.NewRequest(method, "http://"+srv.Addr()+"/v1/teams/"+team+"/members/"+user, nil)
		if err != nil {
			b.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			b.Fatalf("%s %s/%s: %d", method, team, user, resp.StatusCode)
		}
	}
	// awaitHandled waits for the node to have handled n membership events.
	// The seeding's events are handled before this one's (one ordered
	// stream), so none is left to handle while timed.
	awaitHandled := func(n int64) {
		deadline := time.Now().Add(30 * time.Second)
		for c.handled.Load() < n {
			if time.Now().After(deadline) {
				b.Fatalf("node handled %d membership events, want %d", c.handled.Load(), n)
			}
			time.Sleep(10 * time.Microsecond)
		}
	}
	call("PUT", "bench", "viewer")
	call("PUT", "own", "viewer")
	awaitHandled(2)
	viewer := dialViewer(b, srv.Addr(), "viewer")
	defer viewer()

	want := int64(2)
	b.ReportAllocs()
	for b.Loop() {
		call("PUT", "bench", "subject")
		want++
		awaitHandled(want)
		b.StopTimer()
		call("DELETE", "bench", "subject")
		want++
		awaitHandled(want)
		b.StartTimer()
	}
}

// seed puts "subject" in n teams.
func seed(b *testing.B, st store.Store, n int) {
	b.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for w := range 2 {
		wg.Go(func() {
			for i := w; i < n; i += 2 {
				if err := st.AddMember(ctx, fmt.Sprintf("s%d", i), "subject"); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// counter counts the membership events about team "bench" that the
// server's handler handled (the seeding's are not counted).
type counter struct{ handled atomic.Int64 }

type memEvents struct {
	*memstore.Store
	c *counter
}

func (s memEvents) Subscribe(h store.Handler) { s.Store.Subscribe(&countingHandler{h, s.c}) }

type redisEvents struct {
	*redisstore.Store
	c *counter
}

func (s redisEvents) Subscribe(h store.Handler) { s.Store.Subscribe(&countingHandler{h, s.c}) }

type countingHandler struct {
	store.Handler
	c *counter
}

func (h *countingHandler) OnMembership(ev store.MembershipEvent) {
	h.Handler.OnMembership(ev)
	if ev.Team == "bench" || ev.Team == "own" {
		h.c.handled.Add(1)
	}
}

func (h *countingHandler) OnStatus(ev presence.StatusChange) {
	if sh, ok := h.Handler.(store.StatusHandler); ok {
		sh.OnStatus(ev)
	}
}

func (h *countingHandler) OnResync(floor func(string) uint64) {
	if r, ok := h.Handler.(store.Resyncer); ok {
		r.OnResync(floor)
	}
}

// dialViewer connects user and reads what comes until the returned stop.
func dialViewer(b *testing.B, addr, user string) (stop func()) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c, _, err := websocket.Dial(ctx, "ws://"+addr+"/v1/connect?user="+user, nil)
	if err != nil {
		b.Fatal(err)
	}
	c.SetReadLimit(1 << 20)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer c.CloseNow()
		for {
			if _, _, err := c.Read(ctx); err != nil {
				return
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}
