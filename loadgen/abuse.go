package loadgen

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// AbuseOptions configures the abuse run: the floods of hostile clients,
// one after the other, against one node, while a bystander heartbeats.
type AbuseOptions struct {
	URL       string        // the node, http://host:port
	PID       int           // the node's process when local: its peak RSS is read from /proc; 0 = sampled from /metrics
	Conns     int           // sockets per flood; 200
	Idle      int           // sockets of the idle flood; 2000
	Phase     time.Duration // each flood's duration; 10s
	Floods    []string      // which of AbusePhases, in their order; empty: all
	JWTSecret string        // signs the clients' tokens; empty: dev mode (?user=)
	Progress  io.Writer     // a line per phase; nil: none
	// Bystander times the heartbeat acks, connected before Abuse is
	// called; nil: one in this process, which the floods' own goroutines
	// delay too.
	Bystander Bystander
}

// AbusePhases names the floods in the order they run.
func AbusePhases() []string { return []string{"headers", "bodies", "queries", "pings", "idle"} }

// Abuse runs every flood of AbusePhases for o.Phase, each bounded in sockets
// and bytes, and reports per flood the node's CPU, its peak RSS and the
// bystander's heartbeat ack p99. It ends within about
// len(AbusePhases()) × (o.Phase + 5 s).
func Abuse(ctx context.Context, o AbuseOptions) (*Result, error) {
	if o.Conns <= 0 {
		o.Conns = 200
	}
	if o.Idle <= 0 {
		o.Idle = 2000
	}
	if o.Phase <= 0 {
		o.Phase = 10 * time.Second
	}
	for _, f := range o.Floods {
		if !slices.Contains(AbusePhases(), f) {
			return nil, fmt.Errorf("loadgen: abuse: unknown flood %q (%s)", f, strings.Join(AbusePhases(), ", "))
		}
	}
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "ws") || u.Host == "" {
		return nil, fmt.Errorf("loadgen: abuse: --url %q must be http://host:port", o.URL)
	}
	a := &abuser{o: o, addr: u.Host, hc: &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}}
	defer a.hc.CloseIdleConnections()
	res := &Result{Scenario: "abuse", RunID: "abuse", Targets: []string{o.URL}, Started: time.Now(),
		Params: map[string]any{"n": o.Conns, "conns": o.Conns, "idle": o.Idle, "phase_s": o.Phase.Seconds()}}

	by := o.Bystander
	res.Params["bystander"] = "own process"
	if by == nil {
		b, err := a.startBystander(ctx)
		if err != nil {
			return nil, err
		}
		defer b.stop()
		by = b
		res.Params["bystander"] = "inline"
	}

	// A quiet phase first: what the bystander sees with nobody abusing.
	phases := []string{"quiet"}
	for _, p := range AbusePhases() {
		if len(o.Floods) == 0 || slices.Contains(o.Floods, p) {
			phases = append(phases, p)
		}
	}
	for _, p := range phases {
		if ctx.Err() != nil {
			break
		}
		before, err := scrapeOne(ctx, a.hc, "http://"+a.addr+"/metrics")
		if err != nil {
			return res, err
		}
		if _, err := by.Mark(); err != nil { // each phase's own
			return res, err
		}
		selfBefore := selfCPU()
		pctx, cancel := context.WithTimeout(ctx, o.Phase)
		peak := a.samplePeak(pctx)
		stats := a.flood(pctx, p)
		<-pctx.Done()
		cancel()
		rss := peak()
		after, err := scrapeOne(ctx, a.hc, "http://"+a.addr+"/metrics")
		if err != nil {
			return res, err
		}
		bs, err := by.Mark()
		if err != nil {
			return res, err
		}
		res.add(p+"_server_cpu_s", p+": server CPU", after.Get(mCPU)-before.Get(mCPU), "s")
		res.add(p+"_loadgen_cpu_s", p+": load generator CPU (same machine)", selfCPU()-selfBefore, "s")
		res.add(p+"_rss_peak_mib", p+": server RSS, highest sampled", rss/(1<<20), "MiB")
		p99 := bs.P99ms
		res.add(p+"_bystander_ack_p99_ms", p+": bystander heartbeat ack p99", p99, "ms")
		res.add(p+"_bystander_acks", p+": bystander acks", float64(bs.Acks), "")
		if n := bs.Lost; n > 0 {
			res.note("%s: the bystander missed %d acks (none within 1 s)", p, n)
		}
		if stats != "" {
			res.note("%s: %s", p, stats)
		}
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "abuse: %-8s done: cpu %.2fs, bystander p99 %.1fms; %s\n", p,
				after.Get(mCPU)-before.Get(mCPU), p99, stats)
		}
	}
	if o.PID > 0 {
		if kib, err := procStatusKiB(o.PID, "VmHWM"); err == nil {
			res.add("server_rss_peak_mib", "server peak RSS over the run (VmHWM)", float64(kib)/1024, "MiB")
		}
	}
	res.Elapsed = time.Since(res.Started)
	return res, ctx.Err()
}

type abuser struct {
	o    AbuseOptions
	addr string
	hc   *http.Client
}

// samplePeak samples the node's RSS every 200 ms until ctx ends; the
// returned func waits for the sampler and returns the highest value.
func (a *abuser) samplePeak(ctx context.Context) func() float64 {
	var peak float64
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			var v float64
			if a.o.PID > 0 {
				if kib, err := procStatusKiB(a.o.PID, "VmRSS"); err == nil {
					v = float64(kib) * 1024
				}
			} else if s, err := scrapeOne(ctx, a.hc, "http://"+a.addr+"/metrics"); err == nil {
				v = s.Get(mRSS)
			}
			peak = max(peak, v)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() float64 { <-done; return peak }
}

// flood runs one flood until ctx ends and says what the node did to it.
func (a *abuser) flood(ctx context.Context, phase string) string {
	var (
		wg                          sync.WaitGroup
		opened, closedByNode, fails atomic.Int64
	)
	// run starts n goroutines of f, each owning a socket at a time; f
	// returns how many of its sockets the node closed, when ctx ends or it
	// gives up.
	run := func(n int, f func(int) (int, error)) {
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				closed, err := f(i)
				closedByNode.Add(int64(closed))
				if err != nil && ctx.Err() == nil {
					fails.Add(1)
				}
			}()
		}
	}
	one := func(closed bool, err error) (int, error) {
		if closed {
			return 1, err
		}
		return 0, err
	}
	switch phase {
	case "quiet":
	case "headers":
		// A head that never ends: one header growing to 1 MiB.
		run(a.o.Conns, func(int) (int, error) {
			return one(a.rawFlood(ctx, &opened, "GET /v1/connect HTTP/1.1\r\nHost: x\r\nX-Big: ", 'a', 1<<20))
		})
	case "bodies":
		// A 4 MB query body without the API key, sent in full.
		run(a.o.Conns, func(int) (int, error) {
			return one(a.rawFlood(ctx, &opened, "POST /v1/presence/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4000001\r\n\r\n", 'a', 4000000))
		})
	case "queries":
		// One user's connections, each sending 500-id queries and reading
		// nothing; a closed one dials again, at most 10 times.
		q := bigQuery()
		run(min(a.o.Conns, 20), func(int) (int, error) {
			closed := 0
			for range 10 {
				ws, err := a.dialWS(ctx, "abuser")
				if err != nil {
					return closed, err
				}
				opened.Add(1)
				byNode := ws.writeUntil(ctx, q)
				ws.c.Close()
				if !byNode {
					break
				}
				closed++
			}
			return closed, nil
		})
	case "pings":
		// Pings as fast as the socket takes them, answers never read.
		pings := make([]byte, 0, 64*14)
		for range 64 {
			pings = append(pings, maskedFrame(0x89, []byte("abcdefgh"))...)
		}
		run(a.o.Conns, func(i int) (int, error) {
			ws, err := a.dialWS(ctx, fmt.Sprintf("pinger%d", i))
			if err != nil {
				return 0, err
			}
			opened.Add(1)
			defer ws.c.Close()
			return one(ws.writeUntil(ctx, pings), nil)
		})
	case "idle":
		// Sockets that connect and send nothing.
		var refused atomic.Int64
		run(a.o.Idle, func(int) (int, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", a.addr)
			if err != nil {
				return 0, err
			}
			opened.Add(1)
			defer c.Close()
			stop := context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Now()) })
			defer stop()
			b, err := io.ReadAll(c)
			if strings.Contains(string(b), " 429 ") {
				refused.Add(1)
			}
			var ne net.Error
			return one(!(errors.As(err, &ne) && ne.Timeout()), nil)
		})
		wg.Wait()
		return fmt.Sprintf("%d sockets opened, %d closed by the node (%d of them refused with 429 at accept), %d failed to open",
			opened.Load(), closedByNode.Load(), refused.Load(), fails.Load())
	}
	wg.Wait()
	if phase == "quiet" {
		return ""
	}
	return fmt.Sprintf("%d sockets opened, %d closed by the node, %d failed", opened.Load(), closedByNode.Load(), fails.Load())
}

// rawFlood writes head, then up to size bytes of filler, on a new socket,
// until the node closes it (true) or ctx ends.
func (a *abuser) rawFlood(ctx context.Context, opened *atomic.Int64, head string, filler byte, size int) (bool, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", a.addr)
	if err != nil {
		return false, err
	}
	opened.Add(1)
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	if _, err := io.WriteString(c, head); err != nil {
		return ctx.Err() == nil, nil
	}
	chunk := []byte(strings.Repeat(string(filler), 16<<10))
	for sent := 0; sent < size; sent += len(chunk) {
		if _, err := c.Write(chunk[:min(len(chunk), size-sent)]); err != nil {
			return ctx.Err() == nil, nil
		}
	}
	// All sent: wait for the node's answer or close.
	_, _ = io.Copy(io.Discard, c)
	return ctx.Err() == nil, nil
}

// bigQuery is a masked query frame of 500 ids of 100 bytes.
func bigQuery() []byte {
	ids := make([]string, 500)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%03d", strings.Repeat("x", 97), i)
	}
	b, _ := json.Marshal(map[string]any{"type": "query", "id": "q", "user_ids": ids})
	return maskedFrame(0x81, b)
}

// rawWS is a WebSocket client spoken by hand, to send what a polite client
// library would not.
type rawWS struct {
	c  net.Conn
	br *bufio.Reader
}

func (a *abuser) dialWS(ctx context.Context, user string) (*rawWS, error) {
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", a.addr)
	if err != nil {
		return nil, err
	}
	q := "user=" + url.QueryEscape(user)
	if a.o.JWTSecret != "" {
		tok, err := signToken(a.o.JWTSecret, user, time.Hour)
		if err != nil {
			c.Close()
			return nil, err
		}
		q = "token=" + tok
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	req := "GET /v1/connect?" + q + " HTTP/1.1\r\nHost: " + a.addr + "\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		c.Close()
		return nil, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		c.Close()
		return nil, fmt.Errorf("upgrade: %s", resp.Status)
	}
	_ = c.SetDeadline(time.Time{})
	return &rawWS{c: c, br: br}, nil
}

// writeUntil writes b again and again until the node closes the socket
// (true) or ctx ends.
func (w *rawWS) writeUntil(ctx context.Context, b []byte) bool {
	stop := context.AfterFunc(ctx, func() { _ = w.c.SetWriteDeadline(time.Now()) })
	defer stop()
	for ctx.Err() == nil {
		if _, err := w.c.Write(b); err != nil {
			return ctx.Err() == nil
		}
	}
	return false
}

// heartbeat sends a heartbeat with an id every interval and records the
// round trip of each ack until ctx ends; an ack not back within 1 s counts
// as lost.
func (w *rawWS) heartbeat(ctx context.Context, interval time.Duration, h *syncHist, lost *atomic.Int64) {
	var mu sync.Mutex
	sent := map[int]time.Time{}
	done := make(chan struct{})
	go func() { // the reader; ends when the socket is closed
		defer close(done)
		for {
			op, p, err := readServerFrame(w.br)
			if err != nil {
				return
			}
			var f struct {
				Type string `json:"type"`
				ID   int    `json:"id"`
			}
			if op != 1 || json.Unmarshal(p, &f) != nil || f.Type != "heartbeat_ack" {
				continue
			}
			mu.Lock()
			if t, ok := sent[f.ID]; ok {
				h.Record(time.Since(t))
				delete(sent, f.ID)
			}
			mu.Unlock()
		}
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	for id := 1; ; id++ {
		select {
		case <-ctx.Done():
			w.c.Close()
			<-done
			return
		case <-t.C:
		}
		now := time.Now()
		mu.Lock()
		for k, at := range sent {
			if now.Sub(at) > time.Second {
				lost.Add(1)
				delete(sent, k)
			}
		}
		sent[id] = now
		mu.Unlock()
		_ = w.c.SetWriteDeadline(now.Add(time.Second))
		if _, err := w.c.Write(maskedFrame(0x81, []byte(`{"type":"heartbeat","id":`+strconv.Itoa(id)+`}`))); err != nil {
			lost.Add(1)
		}
	}
}

// maskedFrame is a client frame: first byte b0, payload masked.
func maskedFrame(b0 byte, payload []byte) []byte {
	out := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		out = append(out, 0x80|byte(n))
	case n < 1<<16:
		out = append(out, 0x80|126)
		out = binary.BigEndian.AppendUint16(out, uint16(n))
	default:
		out = append(out, 0x80|127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	var mask [4]byte
	_, _ = rand.Read(mask[:])
	out = append(out, mask[:]...)
	for i, b := range payload {
		out = append(out, b^mask[i%4])
	}
	return out
}

// readServerFrame reads one unmasked server frame.
func readServerFrame(br *bufio.Reader) (op byte, payload []byte, err error) {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, nil, err
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var e [2]byte
		if _, err := io.ReadFull(br, e[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(e[:]))
	case 127:
		var e [8]byte
		if _, err := io.ReadFull(br, e[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(e[:])
	}
	if n > 16<<20 {
		return 0, nil, fmt.Errorf("a server frame of %d bytes", n)
	}
	payload = make([]byte, n)
	_, err = io.ReadFull(br, payload)
	return h[0] & 0x0f, payload, err
}

// selfCPU is this process's CPU time so far, in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return math.NaN()
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// procStatusKiB reads a "Vm…: N kB" line of /proc/<pid>/status.
func procStatusKiB(pid int, field string) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}
