package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// nbio's package init starts a process-wide task pool (see
		// server/harness_test.go); the in-process servers start none.
		goleak.IgnoreTopFunction("github.com/lesismal/nbio/taskpool.New.func3"),
	)
}

func TestHistogramQuantiles(t *testing.T) {
	var h Histogram
	for i := 1; i <= 10000; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 5000 * time.Microsecond}, {0.99, 9900 * time.Microsecond}, {0.999, 9990 * time.Microsecond}} {
		got := h.Quantile(c.q)
		if rel := math.Abs(float64(got-c.want)) / float64(c.want); rel > 0.016 {
			t.Errorf("q%.3f = %v, want %v within 1.6%%", c.q, got, c.want)
		}
	}
	if h.Quantile(0) != time.Microsecond || h.Max() != 10*time.Millisecond || h.Quantile(1) != h.Max() {
		t.Errorf("extremes: min %v max %v", h.Quantile(0), h.Max())
	}
	if m := h.Mean(); m < 5000*time.Microsecond || m > 5001*time.Microsecond {
		t.Errorf("mean = %v", m)
	}
	var empty Histogram
	if empty.Quantile(0.5) != 0 || empty.Mean() != 0 {
		t.Error("an empty histogram must report 0")
	}
}

func TestHistogramBucketsCoverEveryValue(t *testing.T) {
	prev := -1
	for _, us := range []int64{0, 1, 127, 128, 129, 255, 256, 1000, 1 << 20, 1<<40 + 12345} {
		b := bucketOf(us)
		if b < prev {
			t.Fatalf("bucketOf(%d) = %d, below the previous %d", us, b, prev)
		}
		prev = b
		if mid := bucketMid(b); math.Abs(mid-float64(us)) > float64(us)/64+1 {
			t.Errorf("bucketMid(bucketOf(%d)) = %v, off by more than 1/64", us, mid)
		}
	}
}

func TestHistogramMergeAndJSON(t *testing.T) {
	var a, b Histogram
	a.Record(time.Millisecond)
	a.Record(-time.Second) // counts as 0
	b.Record(time.Second)
	raw, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	var back Histogram
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	a.Merge(back)
	if p50 := a.Quantile(0.5); a.N != 3 || a.MinUS != 0 || a.Max() != time.Second || p50 < time.Millisecond || p50 > 1016*time.Microsecond {
		t.Fatalf("merged = %+v (p50 %v)", a, a.Quantile(0.5))
	}
}

const exposition = `# HELP greendot_connections Live WebSocket connections on this node.
# TYPE greendot_connections gauge
greendot_connections 42
greendot_changes_total{state="away"} 1
greendot_changes_total{state="offline"} 7
greendot_changes_total{state="online"} 9
go_memstats_heap_alloc_bytes 1.2e+07
greendot_offline_detection_lag_seconds_bucket{le="0.1"} 50
greendot_offline_detection_lag_seconds_bucket{le="0.5"} 90
greendot_offline_detection_lag_seconds_bucket{le="1"} 100
greendot_offline_detection_lag_seconds_bucket{le="+Inf"} 100
greendot_offline_detection_lag_seconds_sum 12
greendot_offline_detection_lag_seconds_count 100
weird{label="a b}c"} 3 1700000000000
greendot_go_goroutines 16
garbage line
`

func TestParseMetrics(t *testing.T) {
	s, err := parseMetrics(strings.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	if s.Get(mConns) != 42 || s.Get(mHeap) != 1.2e7 || s.Get(`weird{label="a b}c"}`) != 3 {
		t.Fatalf("sample = %v", s)
	}
	if s.Get(mGoroutines) != 16 {
		t.Errorf("prefixed Go metrics must be read under their usual names too: %v", s.Get(mGoroutines))
	}
	if got := s.Sum(mChanges); got != 17 {
		t.Errorf("sum of changes = %v, want 17", got)
	}
	if got := s.Get(mChanges + `{state="offline"}`); got != 7 {
		t.Errorf("offline changes = %v", got)
	}
	if got := s.HistQuantile(mDetection, 0.5); got != 0.1 {
		t.Errorf("p50 = %v, want 0.1", got)
	}
	if got := s.HistQuantile(mDetection, 0.99); math.Abs(got-0.95) > 1e-9 {
		t.Errorf("p99 = %v, want 0.95 (interpolated)", got)
	}
	d := s.Sub(Sample{mConns: 40})
	if d.Get(mConns) != 2 || !math.IsNaN(Sample{}.HistQuantile(mDetection, 0.5)) {
		t.Errorf("sub or empty quantile wrong: %v", d.Get(mConns))
	}
}

// fakeRedis answers AUTH and INFO cpu like Redis does.
func fakeRedis(t *testing.T, password string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				r := bufio.NewReader(c)
				authed := password == ""
				for {
					var args []string
					head, err := r.ReadString('\n')
					if err != nil {
						return
					}
					n, _ := strconv.Atoi(strings.TrimSpace(head[1:]))
					for range n {
						_, _ = r.ReadString('\n') // $len
						a, _ := r.ReadString('\n')
						args = append(args, strings.TrimSpace(a))
					}
					switch {
					case args[0] == "AUTH" && args[len(args)-1] == password:
						authed = true
						io.WriteString(c, "+OK\r\n")
					case args[0] == "AUTH":
						io.WriteString(c, "-WRONGPASS invalid password\r\n")
					case !authed:
						io.WriteString(c, "-NOAUTH Authentication required.\r\n")
					default:
						body := "# CPU\r\nused_cpu_sys:1.5\r\nused_cpu_user:2.25\r\nused_cpu_sys_children:9\r\n"
						io.WriteString(c, "$"+strconv.Itoa(len(body))+"\r\n"+body+"\r\n")
					}
				}
			})
		}
	})
	return ln.Addr().String()
}

func TestRedisCPU(t *testing.T) {
	ctx := context.Background()
	got, err := redisCPU(ctx, fakeRedis(t, ""))
	if err != nil || got != 3.75 {
		t.Fatalf("redisCPU = %v, %v; want 3.75", got, err)
	}
	addr := fakeRedis(t, "s3cret")
	if got, err := redisCPU(ctx, "redis://:s3cret@"+addr); err != nil || got != 3.75 {
		t.Fatalf("with password: %v, %v", got, err)
	}
	if _, err := redisCPU(ctx, addr); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("without password: %v, want NOAUTH", err)
	}
}

func TestOptions(t *testing.T) {
	for _, c := range []struct {
		name     string
		scenario string
		o        Options
		err      string
	}{
		{"unknown scenario", "nap", Options{}, "unknown scenario"},
		{"bad target", "idle", Options{Targets: []string{"http://x:1"}}, "must be ws://"},
		{"too fast", "heartbeat", Options{N: 10, Rate: 1000}, "above 15/s"},
		{"too many per process", "idle", Options{N: 40000, Procs: 2}, "--procs 3"},
		{"churn needs devices", "churn", Options{N: 3}, "at least 4"},
		{"bad run id", "idle", Options{RunID: "a b"}, "run id"},
		{"unknown protocol", "idle", Options{Protocol: "mqtt"}, "native or pusher"},
		{"pusher scenario", "churn", Options{N: 10, Protocol: "pusher", PusherKey: "k", PusherSecret: "s"}, "idle and fanout only"},
		{"pusher needs a secret", "fanout", Options{Protocol: "pusher", PusherKey: "k"}, "--pusher-secret"},
		{"peer speaks pusher", "idle", Options{Peer: true}, "--peer needs --protocol pusher"},
		{"peer runs idle and fanout", "storm", Options{Peer: true, Protocol: "pusher", PusherKey: "k", PusherSecret: "s"}, "idle and fanout only"},
		{"bad server pid", "idle", Options{ServerPIDs: []int{12, 0}}, "--server-pid"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.o.withDefaults(c.scenario)
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("err = %v, want %q", err, c.err)
			}
		})
	}
	o, err := Options{N: 40000, Targets: []string{"ws://127.0.0.1:9/v1/connect"}}.withDefaults("churn")
	if err != nil {
		t.Fatal(err)
	}
	if o.Procs != 3 || o.Rate != 20000.0/15 || o.Targets[0] != "ws://127.0.0.1:9" || o.RunID == "" {
		t.Fatalf("defaults = procs %d rate %v targets %v run %q", o.Procs, o.Rate, o.Targets, o.RunID)
	}
	if !ownsTeam(4, 1, 3) || ownsTeam(4, 0, 3) || o.teamOf(250) != 2 {
		t.Fatal("team ownership")
	}
}

func TestReport(t *testing.T) {
	o, _ := Options{N: 10}.withDefaults("idle")
	r := newResult("idle", &o)
	r.add("rss_per_conn_kib", "server RSS per connection", 3.5, "KiB")
	r.goal(4, false, "≤ 4 KiB")
	r.add("rate", "connect rate", 12345.6, "/s")
	r.goal(50000, true, "≥ 50,000/s")
	r.add("lag_ms", "lag", math.NaN(), "ms")
	r.note("hello %d", 1)
	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"3.50 KiB", "≤ 4 KiB  ok", "12,346/s", "MISSED", "n/a", "note: hello 1"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Results map[string]*float64
		Goals   map[string]struct{ Met bool }
	}
	if err := json.Unmarshal(js.Bytes(), &got); err != nil || strings.Count(js.String(), "\n") != 1 {
		t.Fatalf("json %q: %v", js.String(), err)
	}
	if *got.Results["rss_per_conn_kib"] != 3.5 || got.Results["lag_ms"] != nil || !got.Goals["rss_per_conn_kib"].Met || got.Goals["rate"].Met {
		t.Fatalf("json = %s", js.String())
	}
}

// echoHandler answers "echo" with its arguments and "fail" with an error.
type echoHandler struct {
	ctr    *counters
	closed chan struct{}
}

func (h *echoHandler) handle(ctx context.Context, op string, args json.RawMessage) (any, error) {
	switch op {
	case "echo":
		h.ctr.changes.Add(1)
		return args, nil
	case "block":
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return nil, errors.New("no such op")
}

func (h *echoHandler) close() { close(h.closed) }

func TestRemoteWorkerProtocol(t *testing.T) {
	newHandlers["test-echo"] = func(env *workerEnv) handler {
		return &echoHandler{ctr: env.ctr, closed: make(chan struct{})}
	}
	defer delete(newHandlers, "test-echo")
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	o := Options{RunID: "t1"}
	go func() {
		// ServeWorker checks the scenario name; serve the test handler directly.
		done <- serveWith(context.Background(), &o, "test-echo", 0, 1, inR, outW)
		outW.Close()
	}()
	w := newRemoteWorker("w0", inW, outR, func() error { return <-done }, func() {})
	ctx := context.Background()
	raw, err := w.call(ctx, "echo", map[string]int{"a": 1})
	if err != nil || string(raw) != `{"a":1}` {
		t.Fatalf("echo = %s, %v", raw, err)
	}
	if _, err := w.call(ctx, "nope", nil); err == nil || !strings.Contains(err.Error(), "no such op") {
		t.Fatalf("unknown op: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for w.progress().Changes != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if w.progress().Changes != 1 {
		t.Fatalf("progress = %+v, want 1 change", w.progress())
	}
	// A call in flight when the driver leaves is cancelled: shutdown ends it.
	go func() { _, _ = w.call(ctx, "block", nil) }()
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := w.shutdown(sctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}

func TestHealthCheckFails(t *testing.T) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(503) })}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	_, err = Run(context.Background(), "idle", Options{Targets: []string{"ws://" + ln.Addr().String()}})
	if err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("err = %v, want the 503 of /healthz", err)
	}
}

func TestParseProcStatCPU(t *testing.T) {
	// A command name with a space and a ')' of its own; utime 250 and stime
	// 125 ticks (fields 14 and 15).
	line := "4242 (node ) x) S 1 4242 4242 0 -1 4194560 3158 0 0 0 250 125 0 0 20 0 11 0 1234 1102196736 28000 18446744073709551615\n"
	got, err := parseProcStatCPU([]byte(line))
	if err != nil || got != 3.75 {
		t.Fatalf("parseProcStatCPU = %v, %v; want 3.75 s", got, err)
	}
	for _, bad := range []string{"4242 node S 1", "4242 (x) S 1 2 3", "4242 (x) S 1 4242 4242 0 -1 4194560 3158 0 0 0 2x5 125 0"} {
		if _, err := parseProcStatCPU([]byte(bad)); err == nil {
			t.Errorf("parseProcStatCPU(%q) took it", bad)
		}
	}
}

// procSample reads a live process: this one, whose CPU time only grows
// and which holds some memory.
func TestProcSample(t *testing.T) {
	pid := os.Getpid()
	a, err := procSample([]int{pid})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for x := 0; time.Now().Before(deadline) && selfCPU() < a.Get(mCPU)+0.02; x++ {
		_ = x * x // burn a few ticks of CPU
	}
	b, err := procSample([]int{pid, pid})
	if err != nil {
		t.Fatal(err)
	}
	if a.Get(mRSS) < 1<<20 || b.Get(mRSS) < 2*a.Get(mRSS)*0.9 {
		t.Errorf("RSS %v then %v for the pid twice", a.Get(mRSS), b.Get(mRSS))
	}
	if b.Get(mCPU) <= 2*a.Get(mCPU) {
		t.Errorf("CPU %v s then %v s for the pid twice", a.Get(mCPU), b.Get(mCPU))
	}
	if _, err := procSample([]int{1 << 30}); err == nil {
		t.Error("procSample of a process that does not exist took it")
	}
}
