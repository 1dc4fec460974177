package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/store/redisstore/redistest"
)

// The Redis side of the chaos test: one Redis with a fault proxy per
// greendot node, or a 3-master cluster with a fault proxy per master (its
// announced port, so that MOVED replies and CLUSTER SLOTS send every client
// through the proxies). Both persist with AOF (appendfsync always), so a
// restart can keep the data or, with the files removed, come back empty.

// The AOF's timestamps (a line a second) date its writes when a failed
// run's AOF is read (GREENDOT_CHAOS_LOGDIR keeps it).
var aof = []string{"--appendonly", "yes", "--appendfsync", "always", "--aof-timestamp-enabled", "yes"}

// chaosRedis is one Redis with a proxy in front of it for each greendot node.
type chaosRedis struct {
	srv     *redistest.Server
	proxies []*faultProxy // by greendot node index
}

func startChaosRedis(t *testing.T, nodes int) *chaosRedis {
	r := &chaosRedis{srv: redistest.Start(t, aof...)}
	for i := 0; i < nodes; i++ {
		p := newFaultProxy(t)
		p.SetUpstream(r.srv.Addr())
		r.proxies = append(r.proxies, p)
	}
	return r
}

func (r *chaosRedis) url(node int) string { return "redis://" + r.proxies[node].Addr() }

func (r *chaosRedis) servers() []*redistest.Server { return []*redistest.Server{r.srv} }

var (
	_ redisTopology = (*chaosRedis)(nil)
	_ redisTopology = (*chaosCluster)(nil)
)

// chaosCluster is a local Redis Cluster of masters, each announced at the
// port of its proxy.
type chaosCluster struct {
	masters []*redistest.Server
	proxies []*faultProxy // by master
}

func startChaosCluster(t *testing.T, n int) *chaosCluster {
	t.Helper()
	c := &chaosCluster{}
	var addrs []string
	for i := 0; i < n; i++ {
		p := newFaultProxy(t)
		args := append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000", "--cluster-announce-ip", "127.0.0.1",
			"--cluster-announce-port", strconv.Itoa(p.Port())}, aof...)
		s := redistest.Start(t, args...)
		p.SetUpstream(s.Addr())
		c.masters = append(c.masters, s)
		c.proxies = append(c.proxies, p)
		addrs = append(addrs, s.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("chaos: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.waitOK(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	// The announced ports are the proxies'.
	slots, err := c.masters[0].Do("CLUSTER", "NODES")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range c.proxies {
		if !strings.Contains(slots, ":"+strconv.Itoa(p.Port())+"@") {
			t.Fatalf("chaos: cluster does not announce proxy port %d:\n%s", p.Port(), slots)
		}
	}
	return c
}

// url is the first master's proxy for every node: greendot finds the rest.
func (c *chaosCluster) url(int) string { return "redis://" + c.proxies[0].Addr() }

func (c *chaosCluster) servers() []*redistest.Server { return c.masters }

func (c *chaosCluster) waitOK(d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		ok := true
		var last string
		for _, s := range c.masters {
			info, err := s.Do("CLUSTER", "INFO")
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				ok, last = false, fmt.Sprint(err, firstLine(info, "cluster_state"))
				break
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: cluster not ok within %v: %s", d, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func firstLine(s, prefix string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// restartRedis kills a redis-server and starts it again after down, with its
// data or, if empty, without (its AOF and RDB files removed).
func restartRedis(t *testing.T, s *redistest.Server, down time.Duration, empty bool) error {
	var dir string
	if empty {
		reply, err := s.DoList("CONFIG", "GET", "dir")
		if err != nil || len(reply) != 2 {
			return fmt.Errorf("CONFIG GET dir: %v %v", reply, err)
		}
		dir = reply[1]
	}
	s.Stop()
	if empty {
		// The AOF is moved aside, not removed: Redis starts without it, and
		// a failed run keeps the writes from before the restart too.
		aside := filepath.Join(dir, fmt.Sprintf("appendonlydir-%d", time.Now().UnixNano()))
		if err := os.Rename(filepath.Join(dir, "appendonlydir"), aside); err != nil && !os.IsNotExist(err) {
			return err
		}
		if err := os.RemoveAll(filepath.Join(dir, "dump.rdb")); err != nil {
			return err
		}
	}
	time.Sleep(down)
	s.Restart()
	return nil
}
