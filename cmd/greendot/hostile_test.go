package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/greendot/greendot/internal/nodetest"
)

// procKiB reads a "Vm…:  N kB" line of /proc/<pid>/status.
func procKiB(t *testing.T, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				t.Fatalf("%s: %q", field, line)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// flood opens n connections, each sending head and then up to size bytes of
// filler repeated (never the end of the request), and keeps them open until
// the returned close. A connection the server closes stops its writer.
func flood(t *testing.T, addr string, n int, head, filler string, size int) (closeAll func()) {
	t.Helper()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	chunk := []byte(strings.Repeat(filler, (64<<10)/len(filler)))
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Write([]byte(head)); err != nil {
				return
			}
			for sent := 0; sent+len(chunk) <= size; sent += len(chunk) {
				if _, err := c.Write(chunk); err != nil {
					return // refused and closed: what a fixed server does
				}
			}
		}()
	}
	wg.Wait() // every byte is written (or refused): the server has read it
	return func() {
		for _, c := range conns {
			c.Close()
		}
	}
}

// The attacks of the "hostile and slow clients" report, each against a
// node of its own: unfinished huge headers, and big bodies without the API
// key. The node's peak RSS (VmHWM) must not grow with what clients send,
// and the refusals are logged once, not once per connection.
func TestHostileRequestsDoNotGrowMemory(t *testing.T) {
	t.Setenv("GREENDOT_TEST_MAIN", "1")
	for _, tc := range []struct {
		name, head, filler string
		conns, size        int
	}{
		// 8 × 60 MiB of one header that never ends.
		{"header", "GET /v1/connect HTTP/1.1\r\nHost: x\r\nX-Big: ", "a", 8, 60 << 20},
		// 8 × 16 MiB of small headers: none is long, their sum is.
		{"headers", "GET /healthz HTTP/1.1\r\nHost: x\r\n", "X-A: " + strings.Repeat("b", 57) + "\r\n", 8, 16 << 20},
		// 100 × 4 MB query bodies without the API key, never finished.
		{"body", "POST /v1/presence/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4000001\r\n\r\n", "a", 100, 4000000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := nodetest.Start(t, os.Args[0], "hostile-"+tc.name, "--jwt-secret", "s3cret", "--api-key", "k3y")
			pid := node.Cmd.Process.Pid
			before := procKiB(t, pid, "VmHWM")
			closeAll := flood(t, node.Addr, tc.conns, tc.head, tc.filler, tc.size)
			grew := procKiB(t, pid, "VmHWM") - before
			closeAll()
			const bound = 64 << 10 // KiB
			if grew > bound {
				t.Errorf("peak RSS grew by %d KiB under %d connections sending %d bytes each; want under %d KiB",
					grew, tc.conns, len(tc.head)+tc.size, bound)
			}
			var lines []string
			sc := bufio.NewScanner(strings.NewReader(node.Log.String()))
			for sc.Scan() {
				if strings.Contains(sc.Text(), "refused HTTP requests") {
					lines = append(lines, sc.Text())
				}
			}
			if len(lines) != 1 {
				t.Errorf("%d log lines about refused requests, want 1 (at most one a minute):\n%s", len(lines), strings.Join(lines, "\n"))
			}
		})
	}
}
