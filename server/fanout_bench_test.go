package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/server"
	"github.com/greendot/greendot/store/memstore"
)

// BenchmarkFanout measures one change of a subject reaching every viewer
// of its team, through a real server on 127.0.0.1: store transition, hub
// fan-out, outbox, flush, JSON encoding, socket write, and the viewers'
// reads (which share the machine, and whose allocations are counted too).
// The flush window is cut to 1µs, so each iteration is one change's full
// trip; deliveries/s is viewers × iterations per second.
func BenchmarkFanout(b *testing.B) {
	for _, viewers := range []int{100, 1000} {
		b.Run(fmt.Sprintf("viewers=%d", viewers), func(b *testing.B) { benchFanout(b, viewers) })
	}
}

func benchFanout(b *testing.B, viewers int) {
	const long = time.Hour // nothing expires while the benchmark runs
	st, err := memstore.New(memstore.Config{TTL: long, Grace: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := server.New(server.Config{
		Addr: "127.0.0.1:0", Store: st, TTL: long, HeartbeatInterval: long / 2,
		FlushDelay: time.Microsecond, RateLimit: 1e9, RateBurst: 1 << 30,
		LargeTeam: viewers + 1, // every viewer sees every change: no large team's watch
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		_ = srv.Shutdown(sctx)
	}()
	for i := range viewers {
		_ = st.AddMember(ctx, "team", fmt.Sprintf("v%d", i))
	}
	_ = st.AddMember(ctx, "team", "subject")

	// Every viewer counts the changes it reads ("user_id" once per change);
	// connecting them makes viewers·(viewers-1)/2 changes among themselves.
	var received atomic.Int64
	dial := func(user string) *websocket.Conn {
		c, _, err := websocket.Dial(ctx, "ws://"+srv.Addr()+"/v1/connect?user="+user, nil)
		if err != nil {
			b.Fatal(err)
		}
		c.SetReadLimit(1 << 20)
		for range 2 { // welcome, snapshot
			if _, _, err := c.Read(ctx); err != nil {
				b.Fatal(err)
			}
		}
		return c
	}
	for i := range viewers {
		c := dial(fmt.Sprintf("v%d", i))
		wg.Go(func() {
			defer c.CloseNow()
			for {
				_, data, err := c.Read(ctx)
				if err != nil {
					return
				}
				received.Add(int64(bytes.Count(data, []byte(`"user_id"`))))
			}
		})
	}
	await := func(want int64) {
		deadline := time.Now().Add(30 * time.Second)
		for received.Load() < want {
			if time.Now().After(deadline) {
				b.Fatalf("viewers read %d changes, want %d", received.Load(), want)
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
	want := int64(viewers * (viewers - 1) / 2)
	await(want)
	subject := dial("subject")
	defer subject.CloseNow()
	want += int64(viewers)
	await(want) // its online

	frames := [][]byte{[]byte(`{"type":"status","state":"away"}`), []byte(`{"type":"status","state":"online"}`)}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if err := subject.Write(ctx, websocket.MessageText, frames[n%2]); err != nil {
			b.Fatal(err)
		}
		n++
		want += int64(viewers)
		await(want)
	}
	b.ReportMetric(float64(viewers*n)/b.Elapsed().Seconds(), "deliveries/s")
}
