package redisstore_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/redisstore"
	"github.com/greendot/greendot/store/redisstore/redistest"
	"github.com/greendot/greendot/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newStore(t *testing.T, url string, cfg storetest.Config) *redisstore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := redisstore.New(ctx, redisstore.Config{
		URL: url, Node: cfg.Node, TTL: cfg.TTL, Grace: cfg.Grace, ForgetAfter: cfg.ForgetAfter,
		ChannelCountsTTL: cfg.ChannelCountsTTL, Broadcasts: true,
		NodeTTL: 600 * time.Millisecond, HoldOff: 300 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformanceSingleServer(t *testing.T) {
	r := redistest.Start(t)
	storetest.Run(t, func(t *testing.T, cfg storetest.Config) store.Store {
		if _, err := r.Do("FLUSHALL"); err != nil {
			t.Fatal(err)
		}
		return newStore(t, r.URL(), cfg)
	})
}

func TestConformanceCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	storetest.Run(t, func(t *testing.T, cfg storetest.Config) store.Store {
		for _, n := range c.Nodes {
			if _, err := n.Do("FLUSHALL"); err != nil {
				t.Fatal(err)
			}
		}
		s := newStore(t, c.URL(), cfg)
		if !s.Cluster() {
			t.Fatal("the store did not detect the cluster")
		}
		return s
	})
}
