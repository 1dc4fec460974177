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
// greendot node, or a 3-master cluster with a replica per master and a
// fault proxy per server (its announced port, so that MOVED replies and
// CLUSTER SLOTS send every client through the proxies). Both persist with AOF (appendfsync always), so a
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

// chaosCluster is a local Redis Cluster of masters, each with a replica,
// every server announced at the port of its proxy. Which server of a shard
// is its master moves with failovers (and with a master down longer than the
// node timeout): faults look it up when they run.
type chaosCluster struct {
	all     []*redistest.Server
	proxies []*faultProxy // by server
	shards  [][2]int      // the servers of each shard, as created: master, replica
}

func startChaosCluster(t *testing.T, n int) *chaosCluster {
	t.Helper()
	c := &chaosCluster{}
	var addrs []string
	for i := 0; i < 2*n; i++ {
		p := newFaultProxy(t)
		args := append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000", "--cluster-announce-ip", "127.0.0.1",
			"--cluster-announce-port", strconv.Itoa(p.Port())}, aof...)
		s := redistest.Start(t, args...)
		p.SetUpstream(s.Addr())
		c.all = append(c.all, s)
		c.proxies = append(c.proxies, p)
		addrs = append(addrs, s.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("chaos: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.waitOK(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	// redis-cli picks the masters: pair each with its replica (which
	// names its master by the announced port, the proxy's).
	byProxyPort := map[string]int{}
	for i, p := range c.proxies {
		byProxyPort[strconv.Itoa(p.Port())] = i
	}
	for i, s := range c.all {
		repl, err := s.Do("INFO", "replication")
		if err != nil {
			t.Fatal(err)
		}
		if firstLine(repl, "role:") != "role:slave" {
			continue
		}
		port := strings.TrimPrefix(firstLine(repl, "master_port:"), "master_port:")
		m, ok := byProxyPort[port]
		if !ok {
			t.Fatalf("chaos: replica %s follows port %s, no proxy's", s.Addr(), port)
		}
		c.shards = append(c.shards, [2]int{m, i})
	}
	if len(c.shards) != n {
		t.Fatalf("chaos: %d master-replica pairs after create, want %d", len(c.shards), n)
	}
	return c
}

// url is the first server's proxy for every node: greendot finds the rest.
func (c *chaosCluster) url(int) string { return "redis://" + c.proxies[0].Addr() }

func (c *chaosCluster) servers() []*redistest.Server { return c.all }

// master is the server (by index) that is shard i's master now, and the
// other one.
func (c *chaosCluster) master(i int) (int, int) {
	a, b := c.shards[i][0], c.shards[i][1]
	if role(c.all[b]) == "master" {
		return b, a
	}
	return a, b
}

// masters is every running master.
func (c *chaosCluster) masters() []*redistest.Server {
	var out []*redistest.Server
	for i := range c.shards {
		m, _ := c.master(i)
		out = append(out, c.all[m])
	}
	return out
}

// waitOK waits until every running server says cluster_state:ok and every
// replica's link to its master is up.
func (c *chaosCluster) waitOK(d time.Duration) error { return c.wait(d, true) }

// waitServing waits until every running server says cluster_state:ok: the
// masters serve every slot. A replica may still be syncing; greendot does
// not read from replicas, so a fault's window ends here.
func (c *chaosCluster) waitServing(d time.Duration) error { return c.wait(d, false) }

func (c *chaosCluster) wait(d time.Duration, replicas bool) error {
	deadline := time.Now().Add(d)
	for {
		var last error
		for _, s := range c.all {
			info, err := s.Do("CLUSTER", "INFO")
			if err != nil && !s.Running() {
				continue
			}
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				last = fmt.Errorf("%s: %v %s", s.Addr(), err, firstLine(info, "cluster_state"))
				break
			}
			repl, err := s.Do("INFO", "replication")
			if replicas && err == nil && firstLine(repl, "role:") == "role:slave" && firstLine(repl, "master_link_status:") != "master_link_status:up" {
				last = fmt.Errorf("%s: replica's %s", s.Addr(), firstLine(repl, "master_link_status:"))
				break
			}
		}
		if last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: cluster not ok within %v: %v", d, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// role is "master", "slave", or "" for a server that does not answer.
func role(s *redistest.Server) string {
	repl, err := s.Do("INFO", "replication")
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(firstLine(repl, "role:"), "role:")
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
