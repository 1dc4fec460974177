package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/nodetest"
	"github.com/greendot/greendot/internal/testwait"
	"github.com/greendot/greendot/store/redisstore/redistest"
)

// scrape reads one sample of a node's /metrics, -1 when absent.
func scrape(t *testing.T, addr, sample string) float64 {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{}, Timeout: 3 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return -1
}

// A Redis outage fails a sweep every 100 ms; the log gets one line per
// interval for it, with the count held back, not a line per failure, and
// go-redis's own lines are throttled the same way.
func TestRepeatedWarningsAreThrottledDuringARedisOutage(t *testing.T) {
	t.Setenv("GREENDOT_TEST_MAIN", "1")
	rd := redistest.Start(t)
	const interval = time.Second
	node := nodetest.Start(t, os.Args[0], "outage", "--store", "redis", "--redis-url", rd.URL(),
		"--log-level", "debug", "--log-repeat-interval", interval.String())
	const sweepErrors = `greendot_store_errors_total{op="sweep"}`
	rd.Stop()
	down := time.Now()
	testwait.For(t, 30*time.Second, func() error {
		if n := scrape(t, node.Addr, sweepErrors); n < 40 {
			return fmt.Errorf("%s is %v, want 40 failed sweeps first", sweepErrors, n)
		}
		return nil
	})
	failed := scrape(t, node.Addr, sweepErrors)
	if err := node.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-node.Done:
	case <-time.After(30 * time.Second):
		t.Fatal("the node did not stop within 30 s of SIGTERM")
	}
	elapsed := time.Since(down)

	// Each kind of line: the first at once, then at most one summary per
	// interval, and one more from the flush at exit.
	bound := int(elapsed/interval) + 2
	perMsg := map[string]int{}
	sweepLines, sweepsLogged := 0, 0
	sc := bufio.NewScanner(strings.NewReader(node.Log.String()))
	for sc.Scan() {
		line := sc.Text()
		_, msg, ok := strings.Cut(line, " msg=")
		if !ok {
			continue
		}
		if strings.HasPrefix(msg, `"`) {
			msg, _, _ = strings.Cut(msg[1:], `"`)
		} else {
			msg, _, _ = strings.Cut(msg, " ")
		}
		perMsg[msg]++
		if msg == "sweep failed" {
			sweepLines++
			sweepsLogged++
			if _, rest, ok := strings.Cut(line, " repeated="); ok {
				n, err := strconv.Atoi(strings.Fields(rest)[0])
				if err != nil {
					t.Fatalf("repeated=%q", rest)
				}
				sweepsLogged += n
			}
		}
	}
	t.Logf("%v failed sweeps in %v: %d lines; lines per message: %v", failed, elapsed.Round(time.Millisecond), sweepLines, perMsg)
	if sweepLines == 0 || sweepLines > bound {
		t.Errorf("%d sweep failed lines in %v, want 1 to %d (one per %v)", sweepLines, elapsed, bound, interval)
	}
	// Nothing is lost from the count: every failure is a line or counted
	// in one (more sweeps fail between the scrape and the exit).
	if float64(sweepsLogged) < failed {
		t.Errorf("the log accounts for %d failed sweeps, the metric for %v", sweepsLogged, failed)
	}
	for msg, n := range perMsg {
		if n > bound {
			t.Errorf("%q logged %d times in %v, want at most %d", msg, n, elapsed, bound)
		}
	}
	if perMsg["go-redis"] == 0 {
		t.Errorf("no go-redis line at --log-level debug during the outage: is redis.SetLogger wired?\n%s", node.Log.String())
	}
}
