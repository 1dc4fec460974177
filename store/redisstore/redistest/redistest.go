// Package redistest starts real redis-server processes for tests: a single
// server or a local Redis Cluster, on free ports, which a test can stop,
// restart and flush. Nothing is mocked, and a Redis that happens to run on
// the machine is never used.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Server is one redis-server process.
type Server struct {
	t    testing.TB
	Port int
	dir  string
	args []string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

// Addr is host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL is the redis:// URL of the server.
func (s *Server) URL() string { return "redis://" + s.Addr() }

func requireBinaries(t testing.TB) {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found: these tests start their own Redis; install it with `apt-get install -y redis-server`", bin)
		}
	}
}

// Start starts a redis-server (no persistence unless extra args ask for
// it) and stops it when the test ends.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	requireBinaries(t)
	s := &Server{t: t, dir: t.TempDir()}
	s.args = append([]string{"--save", "", "--appendonly", "no", "--bind", "127.0.0.1",
		"--protected-mode", "no", "--dir", s.dir}, extra...)
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		s.Port = freePort(t)
		if err = s.start(); err == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("redistest: start redis-server: %v", err)
	return nil
}

func (s *Server) start() error {
	args := append([]string{"--port", strconv.Itoa(s.Port)}, s.args...)
	cmd := exec.Command("redis-server", args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = DieWithParent()
	logf, err := os.Create(filepath.Join(s.dir, fmt.Sprintf("redis-%d.log", time.Now().UnixNano())))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	s.cmd, s.done = cmd, done
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if reply, err := s.Do("PING"); err == nil && reply == "PONG" {
			return nil
		}
		select {
		case <-done:
			deadline = time.Time{} // exited: stop waiting
		case <-time.After(20 * time.Millisecond):
		}
	}
	_ = cmd.Process.Kill()
	<-done
	log, _ := os.ReadFile(logf.Name())
	return fmt.Errorf("redis-server on port %d did not answer PING: %s", s.Port, lastLines(string(log), 5))
}

// Stop kills the server (SIGKILL: nothing is saved on the way out).
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Running reports whether the server was started and not stopped since.
func (s *Server) Running() bool { return s.cmd != nil }

// Restart starts the server again on the same port and directory.
func (s *Server) Restart() {
	s.t.Helper()
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("redistest: restart: %v", err)
}

// Do runs one command with redis-cli-free RESP over a fresh connection and
// returns a simple reply (status, integer or bulk string) as text.
func (s *Server) Do(args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(encodeCommand(args)); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("redis: %s", line[1:])
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := ioReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return line, nil
}

// DoList runs a command whose reply is an array of bulk strings (or
// integers, given as their text).
func (s *Server) DoList(args ...string) ([]string, error) {
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(encodeCommand(args)); err != nil {
		return nil, err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	if line[0] == '-' {
		return nil, fmt.Errorf("redis: %s", line[1:])
	}
	if line[0] != '*' {
		return nil, fmt.Errorf("redistest: not an array reply: %q", line)
	}
	n, _ := strconv.Atoi(line[1:])
	out := make([]string, 0, max(n, 0))
	for i := 0; i < n; i++ {
		head, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		head = strings.TrimRight(head, "\r\n")
		if head[0] == ':' {
			out = append(out, head[1:])
			continue
		}
		size, _ := strconv.Atoi(head[1:])
		if size < 0 { // a nil bulk string or array
			out = append(out, "")
			continue
		}
		buf := make([]byte, size+2)
		if _, err := ioReadFull(r, buf); err != nil {
			return nil, err
		}
		out = append(out, string(buf[:size]))
	}
	return out, nil
}

func encodeCommand(args []string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return []byte(b.String())
}

// Cluster is a local Redis Cluster: masters, and with
// StartClusterWithReplicas a replica of each.
type Cluster struct {
	Nodes []*Server // the masters as created; a failover changes roles
	// Replicas: the replicas as created, one per master.
	Replicas []*Server
}

// URL points at the first node; greendot discovers the rest.
func (c *Cluster) URL() string { return c.Nodes[0].URL() }

// StartCluster starts n masters and joins them into a cluster.
func StartCluster(t testing.TB, n int) *Cluster { return startCluster(t, n, 0) }

// StartClusterWithReplicas starts n masters and a replica of each, for
// failovers.
func StartClusterWithReplicas(t testing.TB, n int) *Cluster { return startCluster(t, n, 1) }

func startCluster(t testing.TB, n, replicas int) *Cluster {
	t.Helper()
	requireBinaries(t)
	var all []*Server
	var addrs []string
	for i := 0; i < n*(1+replicas); i++ {
		s := Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000")
		all = append(all, s)
		addrs = append(addrs, s.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	c := &Cluster{}
	// redis-cli picks the masters; ask each server what it became.
	for _, s := range all {
		if role(s) == "master" {
			c.Nodes = append(c.Nodes, s)
		} else {
			c.Replicas = append(c.Replicas, s)
		}
	}
	if len(c.Nodes) != n {
		t.Fatalf("redistest: %d masters after create, want %d\n%s", len(c.Nodes), n, out)
	}
	if err := c.WaitSettled(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

// role is "master", "slave", or "" when the server does not answer.
func role(s *Server) string {
	info, err := s.Do("INFO", "replication")
	if err != nil {
		return ""
	}
	return infoField(info, "role")
}

func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// WaitSettled waits until every running server says cluster_state:ok and
// every running replica's link to its master is up.
func (c *Cluster) WaitSettled(d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		err := c.settled()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: cluster not settled within %v: %v", d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// all is every server, masters and replicas as created.
func (c *Cluster) all() []*Server {
	return append(append([]*Server(nil), c.Nodes...), c.Replicas...)
}

func (c *Cluster) settled() error {
	for _, s := range c.all() {
		if s.cmd == nil {
			continue // stopped by the test
		}
		info, err := s.Do("CLUSTER", "INFO")
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: cluster state %q, %v", s.Addr(), infoField(info, "cluster_state"), err)
		}
		repl, err := s.Do("INFO", "replication")
		if err != nil {
			return err
		}
		if infoField(repl, "role") == "slave" && infoField(repl, "master_link_status") != "up" {
			return fmt.Errorf("%s: replica's link to its master is %q", s.Addr(), infoField(repl, "master_link_status"))
		}
	}
	return nil
}

// Owner is the master that serves key now: the one server that answers
// for it rather than redirecting.
func (c *Cluster) Owner(t testing.TB, key string) *Server {
	t.Helper()
	for _, s := range c.all() {
		if s.cmd == nil {
			continue
		}
		if _, err := s.Do("EXISTS", key); err == nil {
			return s
		}
	}
	t.Fatalf("redistest: no server answers for %s", key)
	return nil
}

// ReplicaOf is the running replica of master.
func (c *Cluster) ReplicaOf(t testing.TB, master *Server) *Server {
	t.Helper()
	for _, s := range c.all() {
		if s.cmd == nil || s == master {
			continue
		}
		repl, err := s.Do("INFO", "replication")
		if err == nil && infoField(repl, "role") == "slave" && infoField(repl, "master_port") == strconv.Itoa(master.Port) {
			return s
		}
	}
	t.Fatalf("redistest: no replica of %s", master.Addr())
	return nil
}

// Failover makes replica its master's master by CLUSTER FAILOVER, the
// planned handover (the master stops taking writes until the replica has
// them all), and waits until the cluster has settled on it.
func (c *Cluster) Failover(t testing.TB, replica *Server) {
	t.Helper()
	if _, err := replica.Do("CLUSTER", "FAILOVER"); err != nil {
		t.Fatalf("redistest: CLUSTER FAILOVER on %s: %v", replica.Addr(), err)
	}
	c.WaitMaster(t, replica, 20*time.Second)
}

// WaitMaster waits until s is a master and the cluster has settled (after
// CLUSTER FAILOVER, or once the cluster elected s in place of a master
// that died).
func (c *Cluster) WaitMaster(t testing.TB, s *Server, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for role(s) != "master" {
		if time.Now().After(deadline) {
			t.Fatalf("redistest: %s is no master within %v", s.Addr(), d)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := c.WaitSettled(time.Until(deadline)); err != nil {
		t.Fatal(err)
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func ioReadFull(r *bufio.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// StartTopology starts one Redis ("redis") or a 3-master cluster
// ("cluster") and returns its URL and a FLUSHALL of every master: the data
// loss that tests of both topologies inject.
func StartTopology(t testing.TB, topology string) (url string, flushAll func()) {
	t.Helper()
	switch topology {
	case "redis":
		r := Start(t)
		return r.URL(), func() { _, _ = r.Do("FLUSHALL") }
	case "cluster":
		c := StartCluster(t, 3)
		return c.URL(), func() {
			for _, n := range c.Nodes {
				_, _ = n.Do("FLUSHALL")
			}
		}
	}
	t.Fatalf("redistest: unknown topology %q (redis or cluster)", topology)
	return "", nil
}
