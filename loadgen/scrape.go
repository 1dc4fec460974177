package loadgen

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Names of the server metrics the scenarios read.
const (
	mRSS         = "greendot_process_resident_memory_bytes"
	mCPU         = "greendot_process_cpu_seconds_total"
	mHeap        = "go_memstats_heap_alloc_bytes" // or greendot_go_…: see parseMetrics
	mGoroutines  = "go_goroutines"
	mConns       = "greendot_connections"
	mHeartbeats  = "greendot_heartbeats_total"
	mDeliveries  = "greendot_deliveries_total"
	mChanges     = "greendot_changes_total"
	mCoalesced   = "greendot_deliveries_coalesced_total"
	mDropped     = "greendot_deliveries_dropped_total"
	mSlow        = "greendot_slow_consumer_disconnects_total"
	mExpirations = "greendot_expirations_total"
	mDetection   = "greendot_offline_detection_lag_seconds"
	mGraceLag    = "greendot_offline_grace_lag_seconds"
	mGraceCancel = "greendot_grace_cancellations_total"
	mGraceStart  = "greendot_grace_started_total"
	mRejected    = "greendot_frames_rejected_total"
	mFanout      = "greendot_fanout_connections"
	// Pusher sockets (Options.Protocol "pusher").
	mPusherPings  = `greendot_pusher_frames_total{event="pusher:ping"}`
	mPusherEvents = "greendot_pusher_member_events_total"
	mPusherErrors = "greendot_pusher_subscription_errors_total"
)

// Sample is one scrape of /metrics: each series ("name" or
// `name{label="v"}`, as exposed) and its value. A Sample of many nodes holds
// the sum of each series over them.
type Sample map[string]float64

// parseMetrics reads the Prometheus text format; comments, timestamps and
// unparsable lines are skipped.
func parseMetrics(r io.Reader) (Sample, error) {
	s := Sample{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		// The series is the name, with its label set if it has one.
		end := strings.IndexAny(line, " {")
		if end <= 0 {
			continue
		}
		if line[end] == '{' {
			c := strings.LastIndexByte(line, '}')
			if c < end {
				continue
			}
			end = c + 1
		}
		fields := strings.Fields(line[end:])
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		s[line[:end]] += v
	}
	// Servers may prefix the Go runtime's metrics (greendot_go_goroutines):
	// keep them under their usual names too.
	for k, v := range s {
		if strings.HasPrefix(k, "greendot_go_") {
			if _, ok := s[k[len("greendot_"):]]; !ok {
				s[k[len("greendot_"):]] = v
			}
		}
	}
	return s, sc.Err()
}

// Get returns the value of one series (0 when absent).
func (s Sample) Get(series string) float64 { return s[series] }

// Has says whether the sample holds a series of the metric (or the series
// itself), whatever its labels: a peer's lacks greendot's.
func (s Sample) Has(name string) bool {
	for k := range s {
		if k == name || strings.HasPrefix(k, name+"{") {
			return true
		}
	}
	return false
}

// Sum adds every series of a metric, whatever its labels.
func (s Sample) Sum(name string) float64 {
	var t float64
	for k, v := range s {
		if k == name || strings.HasPrefix(k, name+"{") {
			t += v
		}
	}
	return t
}

// Sub returns s − o, series by series.
func (s Sample) Sub(o Sample) Sample {
	d := make(Sample, len(s))
	for k, v := range s {
		d[k] = v - o[k]
	}
	return d
}

// HistQuantile estimates the q-quantile of a histogram metric from its
// cumulative _bucket series, interpolating inside the bucket, as
// Prometheus's histogram_quantile does. It returns NaN without observations.
func (s Sample) HistQuantile(name string, q float64) float64 {
	type bucket struct{ le, n float64 }
	var bs []bucket
	prefix := name + "_bucket{"
	for k, v := range s {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		i := strings.Index(k, `le="`)
		if i < 0 {
			continue
		}
		rest := k[i+4:]
		j := strings.IndexByte(rest, '"')
		if j < 0 {
			continue
		}
		le, err := strconv.ParseFloat(rest[:j], 64)
		if err != nil {
			continue
		}
		bs = append(bs, bucket{le, v})
	}
	slices.SortFunc(bs, func(a, b bucket) int {
		switch {
		case a.le < b.le:
			return -1
		case a.le > b.le:
			return 1
		}
		return 0
	})
	if len(bs) == 0 || bs[len(bs)-1].n <= 0 {
		return math.NaN()
	}
	total := bs[len(bs)-1].n
	rank := q * total
	prevLE, prevN := 0.0, 0.0
	for _, b := range bs {
		if b.n >= rank {
			if math.IsInf(b.le, 1) {
				return prevLE // beyond the last finite bucket: its bound is all we know
			}
			if b.n == prevN {
				return b.le
			}
			return prevLE + (b.le-prevLE)*(rank-prevN)/(b.n-prevN)
		}
		prevLE, prevN = b.le, b.n
	}
	return prevLE
}

// scrape reads /metrics of every target and adds them up.
func scrape(ctx context.Context, hc *http.Client, targets []string) (Sample, error) {
	total := Sample{}
	for _, t := range targets {
		s, err := scrapeOne(ctx, hc, httpBase(t)+"/metrics")
		if err != nil {
			return nil, err
		}
		for k, v := range s {
			total[k] += v
		}
	}
	return total, nil
}

func scrapeOne(ctx context.Context, hc *http.Client, u string) (Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("loadgen: scrape %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("loadgen: scrape %s: %s", u, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// redisCPU asks a Redis server for its CPU time so far (used_cpu_sys +
// used_cpu_user of INFO cpu), in seconds. addr is host:port or
// redis://[user:pass@]host:port.
func redisCPU(ctx context.Context, addr string) (float64, error) {
	var user, pass string
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil {
			return 0, fmt.Errorf("loadgen: redis address: %w", err)
		}
		addr = u.Host
		if u.User != nil {
			user = u.User.Username()
			pass, _ = u.User.Password()
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, fmt.Errorf("loadgen: redis: %w", err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	r := bufio.NewReader(conn)
	if pass != "" {
		args := []string{"AUTH", pass}
		if user != "" {
			args = []string{"AUTH", user, pass}
		}
		if _, err := redisDo(conn, r, args...); err != nil {
			return 0, err
		}
	}
	info, err := redisDo(conn, r, "INFO", "cpu")
	if err != nil {
		return 0, err
	}
	var total float64
	var found int
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("loadgen: redis INFO %s: %w", k, err)
			}
			total += f
			found++
		}
	}
	if found != 2 {
		return 0, fmt.Errorf("loadgen: redis INFO cpu has no used_cpu_sys/used_cpu_user")
	}
	return total, nil
}

// redisDo sends one command and reads a simple, error or bulk string reply.
func redisDo(w io.Writer, r *bufio.Reader, args ...string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return "", fmt.Errorf("loadgen: redis: %w", err)
	}
	head, err := r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("loadgen: redis: %w", err)
	}
	head = strings.TrimRight(head, "\r\n")
	if head == "" {
		return "", fmt.Errorf("loadgen: redis: empty reply")
	}
	switch head[0] {
	case '+':
		return head[1:], nil
	case '-':
		return "", fmt.Errorf("loadgen: redis: %s", head[1:])
	case '$':
		n, err := strconv.Atoi(head[1:])
		if err != nil || n < 0 || n > 1<<20 {
			return "", fmt.Errorf("loadgen: redis: bad bulk length %q", head)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", fmt.Errorf("loadgen: redis: %w", err)
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("loadgen: redis: unexpected reply %q", head)
}
