package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/redisstore/redistest"
	"github.com/greendot/greendot/store/storetest"
)

// sharedBackend is storetest's shared backend on the Redis at url: nodes
// are stores on it, lost by kill9.
func sharedBackend(url string, cfg storetest.Config) storetest.Shared {
	return storetest.Shared{
		NewNode: func(t *testing.T, node string) store.Store {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := New(ctx, Config{URL: url, Node: node, TTL: cfg.TTL, Grace: cfg.Grace,
				NodeTTL: 600 * time.Millisecond, HoldOff: 300 * time.Millisecond, ChannelCountsTTL: cfg.ChannelCountsTTL, Broadcasts: true,
				Logger: logger()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() }) // nothing more after kill9
			return s
		},
		Kill: func(s store.Store) { kill9(s.(*Store)) },
	}
}

func TestSharedConformanceSingleServer(t *testing.T) {
	r := redistest.Start(t)
	storetest.RunShared(t, func(t *testing.T, cfg storetest.Config) storetest.Shared {
		if _, err := r.Do("FLUSHALL"); err != nil {
			t.Fatal(err)
		}
		return sharedBackend(r.URL(), cfg)
	})
}

func TestSharedConformanceCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	storetest.RunShared(t, func(t *testing.T, cfg storetest.Config) storetest.Shared {
		for _, n := range c.Nodes {
			if _, err := n.Do("FLUSHALL"); err != nil {
				t.Fatal(err)
			}
		}
		return sharedBackend(c.URL(), cfg)
	})
}
