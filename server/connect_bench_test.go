package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/greendot/greendot/server"
	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/memstore"
	"github.com/greendot/greendot/store/redisstore"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// BenchmarkConnect measures a WebSocket connect through a real server up
// to its snapshot: one team of 100 members, 50 of them connected (their
// frames read and dropped); each op dials one of the other 50 in turn (a
// reconnect within the grace, as most are), reads welcome and snapshot,
// and closes with the timer stopped. The client's dial and reads run in
// the same process and count in ns/op and allocs/op.
//
// Some runs used to stop in the untimed first connects with EOF for a
// handshake: a socket closed off nbio's poller passed its client's FIN to
// the next socket (server/sockclose.go; TestConnectsAmidCloses).
//
//	go test -run XXX -bench Connect -benchtime 2000x ./server
func BenchmarkConnect(b *testing.B) {
	for _, kind := range []string{"memory", "redis"} {
		b.Run("store="+kind, func(b *testing.B) { benchConnect(b, kind) })
	}
}

func benchConnect(b *testing.B, kind string) {
	const long = time.Hour // nothing expires, no grace ends, while the benchmark runs
	ctx := context.Background()
	var st store.Store
	switch kind {
	case "memory":
		m, err := memstore.New(memstore.Config{TTL: long, Grace: long})
		if err != nil {
			b.Fatal(err)
		}
		st = m
	case "redis":
		r := redistest.Start(b)
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		rs, err := redisstore.New(sctx, redisstore.Config{URL: r.URL(), Node: "bench", TTL: long, Grace: long,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = rs.Close() })
		st = rs
	}
	srv, err := server.New(server.Config{
		Addr: "127.0.0.1:0", Store: st, TTL: long, HeartbeatInterval: long / 2, Grace: long,
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
	for i := range 100 {
		if err := st.AddMember(ctx, "bench", fmt.Sprint("m", i)); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 50 {
		defer dialViewer(b, srv.Addr(), fmt.Sprint("m", i))()
	}
	connect := func(user string) *websocket.Conn {
		c, _, err := websocket.Dial(ctx, "ws://"+srv.Addr()+"/v1/connect?user="+user, nil)
		if err != nil {
			b.Fatal(err)
		}
		c.SetReadLimit(1 << 20)
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if bytes.Contains(data[:min(len(data), 32)], []byte(`"snapshot"`)) {
				return c
			}
		}
	}
	// Once each first: the later ops reconnect within the grace.
	for i := 50; i < 100; i++ {
		_ = connect(fmt.Sprint("m", i)).Close(websocket.StatusNormalClosure, "")
	}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		c := connect(fmt.Sprint("m", 50+i%50))
		i++
		b.StopTimer()
		_ = c.Close(websocket.StatusNormalClosure, "")
		b.StartTimer()
	}
}
